"""Closed-loop clients (docs/workloads.md, "Closed-loop clients").

``N`` clients share a request pool: the requests of the workload source (a distribution, a
preset, a workload spec or a trace) in their order. Client ``k`` (0-based) sends the next
request of the pool, with its arrival time replaced by the send time (and a deadline moved
with it), and sends again when that request has ended — completed (also length-capped),
timed out, dropped, or rejected by admission or routing — plus a think time. So the j-th
request sent is the j-th of the source; the pool's end (or ``num_requests``) ends the load.

**Stages** (``concurrency_stages``), one after the other from 0: stage ``i`` runs
``concurrency_i`` clients for its duration, or — inference-perf's concurrent stage — until
it has sent ``num_requests`` requests and all of them have ended (the next stage starts
then); after the last stage no client sends. Client ``k`` is active while ``k`` is below the
running stage's concurrency. A client decides at each send: active (and the stage's count
not reached) ⇒ it sends; else it waits, and the next stage that makes it active sends for
it at its start (an in-flight request is never cancelled: a lower concurrency takes effect
as requests end). ``concurrency: N`` is one endless stage.

**Think times** are integer µs drawn from the ``think-time`` stream
(:func:`blis_simpy.rng.derive_seed` of the workload seed; one generator for the run, drawn
in the order requests end): ``constant`` ``mean_ms × 1000`` rounded half up; ``exponential`` a unit
exponential × mean, truncated; ``lognormal`` ``exp(μ + σZ)`` with ``μ = ln(mean) − σ²/2``
(so its mean is ``mean``), truncated.

**How terminal events arrive.** The manager takes the closed-loop session manager's place in
the cluster (``Cluster.sessions``): the cluster hands it every terminal event
(:meth:`on_request_done`; with PD pools the parent's, at parent completion or failure) and
every rejection (:meth:`on_request_rejected`), as it does for sessions. A send is a keyed
event (:data:`blis_simpy.des.FOLLOWUP_ARRIVAL`) at the send time that runs the request's
``ClusterArrival`` (``Cluster.client_arrival``). Times are integer µs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from blis_simpy.des import FOLLOWUP_ARRIVAL
from blis_simpy.units import MAX_INT64

__all__ = ["ClientStage", "ClosedLoopClients", "ThinkTimeSampler"]


@dataclass(frozen=True, slots=True)
class ThinkTimeSampler:
    """Think times in integer µs: ``dist`` constant | exponential | lognormal, mean ``mean_ms``
    milliseconds, ``sigma`` the lognormal's standard deviation of the log."""

    dist: str = "constant"
    mean_ms: float = 0.0
    sigma: float = 1.0

    def draw_us(self, rng: np.random.Generator) -> int:
        mean_us = self.mean_ms * 1000.0
        if self.dist == "constant":
            return int(math.floor(mean_us + 0.5))
        if self.dist == "exponential":
            x = rng.standard_exponential() * mean_us
        elif self.dist == "lognormal":
            mu = math.log(mean_us) - self.sigma * self.sigma / 2.0
            x = math.exp(min(mu + self.sigma * rng.standard_normal(), 700.0))
        else:
            raise ValueError(f"unknown think-time distribution {self.dist!r}")
        return int(min(x, MAX_INT64 // 4))


@dataclass(frozen=True, slots=True)
class ClientStage:
    """``concurrency`` clients for ``duration_us`` µs (MAX_INT64: endless), or — inference-perf's
    concurrent stage — until ``num_requests`` requests have been sent and have all ended."""

    concurrency: int
    duration_us: int = MAX_INT64
    num_requests: int = 0


class ClosedLoopClients:
    """The clients of a closed-loop run (module docstring).

    ``pool``: the requests to send, in order; ``stages``: :class:`ClientStage` s run one after
    the other from 0; ``think``: the think-time sampler and ``rng`` its generator;
    ``max_requests``: a cap on the requests sent (0: the pool's end)."""

    def __init__(self, pool: Iterable, stages: list[ClientStage], think: ThinkTimeSampler,
                 rng: np.random.Generator, *, max_requests: int = 0):
        self._pool = iter(pool)
        self._left = max_requests if max_requests > 0 else -1
        self.think = think
        self.rng = rng
        self.stages = list(stages)
        self.clients = max((st.concurrency for st in self.stages), default=0)
        self._waiting = list(range(self.clients))     # a heap of clients waiting for a stage
        #: in-flight request ID -> (its client, the stage that sent it)
        self._client_of: dict[str, tuple[int, int]] = {}
        self.stage = -1                               # the running stage (len(stages): done)
        self.stage_starts_us: list[int] = []          # when each stage started
        self._sent = self._open = 0                   # requests the stage sent, and not ended
        self.exhausted = False                        # the pool (or the cap) has run out
        #: every request sent, in send order (arrival = send time), and the client that sent it
        self.followups: list = []
        self.sent_by: list[int] = []
        self.env = None
        self._arrive = None

    # ------------------------------------------------------------------ wiring
    def attach(self, cluster) -> None:
        """Start on ``cluster``'s clock: stage 0 starts at 0, a keyed event."""
        self.env = cluster.env
        self._arrive = cluster.client_arrival
        self.env.call_at(0, FOLLOWUP_ARRIVAL, self._start, 0)

    @property
    def concurrency(self) -> int:
        """The running stage's concurrency (0 once every stage has ended)."""
        return self.stages[self.stage].concurrency if 0 <= self.stage < len(self.stages) else 0

    # ------------------------------------------------------------------ stages
    def _start(self, i: int) -> None:
        """Stage ``i`` starts now: its end is timed, or awaited; the waiting clients it makes
        active send."""
        if i != self.stage + 1:
            return                                    # already ended another way
        now = self.env.now
        self.stage = i
        self._sent = self._open = 0
        if i >= len(self.stages):
            return
        self.stage_starts_us.append(now)
        st = self.stages[i]
        if not st.num_requests and st.duration_us < MAX_INT64 - now:
            end = now + st.duration_us
            if end <= self.env.horizon_us:
                self.env.call_at(end, FOLLOWUP_ARRIVAL, self._start, i + 1)
        waiting = self._waiting
        while waiting and waiting[0] < st.concurrency and not self.exhausted and self._quota():
            self._send(heapq.heappop(waiting))

    def _quota(self) -> bool:
        """The running stage may send another request."""
        n = self.stages[self.stage].num_requests if 0 <= self.stage < len(self.stages) else 0
        return not n or self._sent < n

    # ------------------------------------------------------------------ sends
    def _send(self, k: int) -> None:
        """Client ``k`` sends the next pool request now, or waits for a stage that makes it
        active, or stops: the pool has run out."""
        if self.exhausted:
            return
        if k >= self.concurrency or not self._quota():
            heapq.heappush(self._waiting, k)
            return
        req = next(self._pool, None) if self._left != 0 else None
        if req is None:
            self.exhausted = True
            return
        now = self.env.now
        self._left -= 1
        self._sent += 1
        self._open += 1
        shift = now - req.arrival_us
        req.arrival_us = req.origin_us = now
        if req.deadline_us > 0:
            req.deadline_us += shift
        self._client_of[req.id] = (k, self.stage)
        self.followups.append(req)
        self.sent_by.append(k)
        self._arrive(req)

    def _ended(self, req, tick_us: int) -> None:
        sent = self._client_of.pop(req.id, None)
        if sent is None:
            return
        k, stage = sent
        env = self.env
        at = tick_us + self.think.draw_us(self.rng)
        if stage == self.stage:
            self._open -= 1
            n = self.stages[stage].num_requests
            if n and self._sent >= n and not self._open:    # drained: the next stage starts
                env.call_at(max(tick_us, env.now), FOLLOWUP_ARRIVAL, self._start, stage + 1)
        if at <= env.horizon_us and not self.exhausted:
            env.call_at(max(at, env.now), FOLLOWUP_ARRIVAL, self._send, k)

    # ------------------------------------------------------------------ the cluster's calls
    def on_request_done(self, req, tick_us: int) -> list:
        """A request ended (completed, timed out or dropped) at ``tick_us``: its client thinks,
        then sends again. Sends are scheduled here, so nothing is returned for the cluster to
        submit. Events for requests no client sent (PD sub-requests) are ignored."""
        self._ended(req, tick_us)
        return []

    def on_request_rejected(self, req, tick_us: int) -> None:
        """A request was rejected by admission or routing: it frees its client as an end does."""
        self._ended(req, tick_us)

    def finalize(self, *, stopped_at_horizon: bool, end_us: int = -1):
        """End of the run: nothing to settle (no session counters)."""
        return None
