"""Closed-loop multi-turn sessions (docs/workloads.md): blueprints and the session manager.

A closed-loop client's sessions enter the simulation with their round-0 request only. Each
session has a :class:`SessionBlueprint` (the client's samplers, think time, timeout,
horizon, prefix and metadata, plus its own RNG) and the :class:`SessionManager` generates
round ``r + 1`` when round ``r`` completes, ``think_time_us`` after the completion tick.

The manager sees **every** terminal event through :meth:`SessionManager.on_request_done`
(the cluster forwards the engine's done-callback, docs/engine.md) and decides:

* a request without a session ID, or of an unknown or already ended session ⇒ nothing;
* timed out ⇒ the session is **cancelled** (timeout);
* dropped (BLIS sees the request "still queued"; our engine marks it ``DROPPED``) ⇒
  **cancelled** (dropped);
* completed — also when length-capped — and it was the last round ⇒ **completed**;
* ``tick + think_time_us > horizon`` ⇒ **horizon-interrupted**;
* else round ``r + 1``: input length, output length, new input IDs, output IDs from the
  session's RNG; with ``context_growth: accumulate`` the context grows by the finished
  request's **entire input** plus the output tokens it actually generated (the first
  ``pi − input_len``) and the new input is prefix + context + new tokens (else prefix +
  new tokens) — a round whose context + new tokens would pass 2^24 (``MAX_TOKENS``) is not
  sent: the session ends **cancelled** (dropped); ID ``session_<sess>_round_<r+1>_<counter>`` (``counter`` counts the
  manager's follow-ups from 0); arrival ``tick + think_time_us``; deadline ``arrival +
  timeout`` (300 s when the client sets no timeout, none when it sets 0).

[QUIRK, docs/workloads.md] The finished input already holds the prefix and the earlier context,
so ``accumulate`` duplicates the history every round (round 2 holds round 0's input three
times). Kept for parity.

The request passed in may be any object with ``id``, ``session_id``, ``state`` (the
integer states of :mod:`blis_simpy.request`, or their names), ``input_tokens`` and
``output_tokens`` (token-ID arrays) and ``pi`` (its ProgressIndex at the end, docs/engine.md).
It must be called **inside** the done-callback: the fast engine drops a finished request's
tokens right after. With PD disaggregation the cluster calls it with the *parent* request at
parent completion (docs/divergences.md P9); sub-requests carry no session ID and are ignored. Events
for a request that is not the session's outstanding round are ignored too.

Requests rejected by admission or routing never reach an instance, so BLIS never calls
back for them: no follow-up is generated. :meth:`SessionManager.on_request_rejected`
records such a session as cancelled (rejected) so that INV-11 can be checked; it changes
nothing else. At the end, :meth:`SessionManager.finalize` ends sessions whose round was
still in flight when the horizon stopped the run as horizon-interrupted (in flight).

Counters per end state (INV-11: every session ends in exactly one) are in
:class:`SessionCounters`. Times are integer µs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from blis_simpy.errors import InvariantError
from blis_simpy.request import COMPLETED, STATE_NAMES, TIMED_OUT, Request
from blis_simpy.workload.lengths import MAX_TOKENS
from blis_simpy.workload.samplers import RequestSampler

SESSION_DEFAULT_TIMEOUT_US = 300_000_000

ACTIVE = "active"
COMPLETED_SESSION = "completed"
CANCELLED = "cancelled"
HORIZON_INTERRUPTED = "horizon_interrupted"
END_STATES = (COMPLETED_SESSION, CANCELLED, HORIZON_INTERRUPTED)

_EMPTY = np.zeros(0, dtype=np.int32)


def session_deadline(arrival_us: int, timeout_us: int | None) -> int:
    """Absolute deadline of a session round: ``timeout`` if given (0 ⇒ none), else 300 s."""
    if timeout_us is None:
        return arrival_us + SESSION_DEFAULT_TIMEOUT_US
    return arrival_us + timeout_us if timeout_us > 0 else 0


@dataclass(eq=False)
class SessionBlueprint:
    """One closed-loop session: what its client sends (fixed) and where it stands (state).

    ``timeout_us`` None = the 300 s session default, 0 = none. ``prefix`` is the client's
    prefix-group token IDs (empty without a group).
    """

    session_id: str
    sampler: RequestSampler
    rng: np.random.Generator
    max_rounds: int
    think_time_us: int
    horizon_us: int
    timeout_us: int | None = None
    accumulate: bool = False
    prefix: np.ndarray = field(default_factory=lambda: _EMPTY)
    client_id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    prefix_group: str = ""
    streaming: bool = False
    # ---- state
    round: int = 0                 # index of the outstanding round
    current_id: str = ""           # ID of the outstanding round's request
    context: np.ndarray = field(default_factory=lambda: _EMPTY)
    state: str = ACTIVE
    reason: str = ""               # cancelled: timeout|dropped|rejected; horizon: next_round|in_flight
    ended_us: int = -1             # tick of the event that ended the session

    def _end(self, state: str, reason: str, tick_us: int) -> None:
        self.state, self.reason, self.ended_us = state, reason, tick_us


@dataclass
class SessionCounters:
    """How the closed-loop sessions of a run ended (INV-11)."""

    sessions: int = 0
    completed: int = 0
    cancelled_timeout: int = 0
    cancelled_dropped: int = 0
    cancelled_rejected: int = 0
    horizon_interrupted: int = 0   # next round would arrive after the horizon (BLIS's rule)
    in_flight_at_horizon: int = 0  # a round was still in flight when the run stopped
    active: int = 0                # not ended (0 after finalize)
    followups: int = 0             # follow-up requests generated

    @property
    def cancelled(self) -> int:
        return self.cancelled_timeout + self.cancelled_dropped + self.cancelled_rejected

    def ended(self) -> int:
        return self.completed + self.cancelled + self.horizon_interrupted + self.in_flight_at_horizon


_COUNTER = {(COMPLETED_SESSION, ""): "completed", (CANCELLED, "timeout"): "cancelled_timeout",
            (CANCELLED, "dropped"): "cancelled_dropped", (CANCELLED, "rejected"): "cancelled_rejected",
            (HORIZON_INTERRUPTED, "next_round"): "horizon_interrupted",
            (HORIZON_INTERRUPTED, "in_flight"): "in_flight_at_horizon"}


class SessionManager:
    """Generates the follow-up rounds of closed-loop sessions (see the module docstring).

    ``blueprints`` in BLIS's order (client order, sorted session IDs); each must name its
    round-0 request in ``current_id``. One manager serves one run.
    """

    def __init__(self, blueprints: list[SessionBlueprint]):
        self.sessions: dict[str, SessionBlueprint] = {}
        for bp in blueprints:
            if bp.session_id in self.sessions:
                raise ValueError(f"duplicate session {bp.session_id!r}")
            self.sessions[bp.session_id] = bp
        self.counters = SessionCounters(sessions=len(self.sessions), active=len(self.sessions))
        self.followups: list[Request] = []   # every follow-up generated, in generation order

    # ------------------------------------------------------------------ events
    def on_request_done(self, req, tick_us: int) -> list[Request]:
        """A request ended (completed, timed out or dropped) at ``tick_us``: the follow-up
        requests to submit (empty, or the next round)."""
        s = self._session_of(req)
        if s is None:
            return []
        state = req.state
        if isinstance(state, str):
            state = STATE_NAMES.index(state)
        if state == TIMED_OUT:
            self._end(s, CANCELLED, "timeout", tick_us)
            return []
        if state != COMPLETED:          # dropped: BLIS sees it still queued
            self._end(s, CANCELLED, "dropped", tick_us)
            return []
        if s.round + 1 >= s.max_rounds:
            self._end(s, COMPLETED_SESSION, "", tick_us)
            return []
        arrival = tick_us + s.think_time_us
        if arrival > s.horizon_us:
            self._end(s, HORIZON_INTERRUPTED, "next_round", tick_us)
            return []
        nxt = self._next_round(s, req, arrival)
        if nxt is None:                 # its prompt would pass the token cap: never sent
            self._end(s, CANCELLED, "dropped", tick_us)
            return []
        return [nxt]

    def on_request_rejected(self, req, tick_us: int) -> None:
        """A session request was rejected by admission or routing: BLIS never calls back
        for it (no follow-up); the session is recorded as cancelled (rejected)."""
        s = self._session_of(req)
        if s is not None:
            self._end(s, CANCELLED, "rejected", tick_us)

    def _session_of(self, req) -> SessionBlueprint | None:
        sid = getattr(req, "session_id", "")
        if not sid:
            return None
        s = self.sessions.get(sid)
        if s is None or s.state != ACTIVE or req.id != s.current_id:
            return None
        return s

    def _end(self, s: SessionBlueprint, state: str, reason: str, tick_us: int) -> None:
        s._end(state, reason, tick_us)
        c = self.counters
        name = _COUNTER[(state, reason)]
        setattr(c, name, getattr(c, name) + 1)
        c.active -= 1

    def _next_round(self, s: SessionBlueprint, done, arrival: int) -> Request | None:
        """Round ``r + 1``, or None when its accumulated context and new tokens would be
        more than ``MAX_TOKENS`` (2^24; the session ends cancelled, dropped)."""
        rng = s.rng
        new_in, out, mod = s.sampler.draw(rng)
        if s.accumulate:
            inp_done = np.asarray(done.input_tokens, dtype=np.int32)
            out_done = np.asarray(done.output_tokens, dtype=np.int32)
            gen = min(max(int(done.pi) - len(inp_done), 0), len(out_done))
            if len(s.context) + len(inp_done) + gen + len(new_in) > MAX_TOKENS:
                return None
            s.context = np.concatenate((s.context, inp_done, out_done[:gen]))
            inp = np.concatenate((s.prefix, s.context, new_in))
        else:
            inp = np.concatenate((s.prefix, new_in))
        r = s.round + 1
        c = self.counters
        rid = f"session_{s.session_id}_round_{r}_{c.followups}"
        c.followups += 1
        req = Request(rid, arrival, inp, out, max_output_len=len(out),
                      deadline_us=session_deadline(arrival, s.timeout_us),
                      tenant_id=s.tenant_id, slo_class=s.slo_class, session_id=s.session_id,
                      round_index=r, client_id=s.client_id, prefix_group=s.prefix_group,
                      prefix_length=len(s.prefix), streaming=s.streaming, model=s.model,
                      text_tokens=mod[0], image_tokens=mod[1], audio_tokens=mod[2],
                      video_tokens=mod[3])
        s.round = r
        s.current_id = rid
        self.followups.append(req)
        return req

    # ------------------------------------------------------------------ end of run
    def finalize(self, *, stopped_at_horizon: bool, end_us: int = -1) -> SessionCounters:
        """End of the run. If the horizon stopped it, sessions with a round still in flight
        end horizon-interrupted (in flight). If the run drained (no event left), a session
        still active is an INV-11 violation: :class:`InvariantError`."""
        for s in self.sessions.values():
            if s.state != ACTIVE:
                continue
            if not stopped_at_horizon:
                raise InvariantError(f"session {s.session_id} never ended: no terminal event for "
                                     f"its round {s.round} ({s.current_id}) although the run drained",
                                     request=s.current_id)
            self._end(s, HORIZON_INTERRUPTED, "in_flight", end_us)
        self.check()
        return self.counters

    def check(self) -> None:
        """INV-11: the per-state counters add up to the sessions, and agree with them."""
        c = self.counters
        states = [s.state for s in self.sessions.values()]
        if c.ended() + c.active != c.sessions or states.count(ACTIVE) != c.active \
                or c.sessions != len(states):
            raise InvariantError(f"session accounting broken: {c}")
