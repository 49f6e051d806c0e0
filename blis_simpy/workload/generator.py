"""The workload-spec v2 generator (docs/workloads.md, "The workload-spec v2").

Normative order (it fixes reproducibility):

1. upgrade v1 and validate the spec; expand ``inference_perf`` or load
   ``servegen_data`` into clients; working client list = clients followed by the
   cohort-expanded clients — :mod:`blis_simpy.workload.expand`;
2. ``G`` = the ``"workload-gen"`` stream of the workload seed (:mod:`blis_simpy.rng`);
3. client rate ``λ_i = aggregate_rate · f_i / Σf / 1e6`` requests per µs;
4. prefixes: walk the clients in order; every new non-empty ``prefix_group`` draws its
   token IDs from ``G`` (length: the first positive ``prefix_length`` in the group, else 50);
5. per-client cap (when ``max_requests > 0``): BLIS uses ``2 × max_requests``. A standard
   client's arrivals are strictly increasing (IAT ≥ 1) and each client has its own RNG, so
   its requests beyond the first ``max_requests`` can never survive step 7 — we stop there,
   which yields the identical request list with half the work. Multi-turn clients keep
   the literal ``2 ×`` (their rounds are not in arrival order);
6. each client with ``λ > 0`` gets a child RNG ``R`` seeded by ``G.Int63()``; then
   * standard: ``t = 0``; repeat: ``t += IAT(R)``; stop at the horizon; skip (no draws)
     outside the lifecycle windows; draw input length, output length, input IDs, output IDs
     (multimodal: modality lengths, input IDs, output length, output IDs); prepend the
     group prefix;
   * multi-turn (``reasoning.multi_turn``): sessions, see :func:`_session_requests`;
7. stable-sort by arrival (ties keep client order), truncate to ``max_requests``;
8. closed loop: keep only the round-0 requests of closed-loop sessions, name the
   requests ``request_<index>``, and build one :class:`SessionBlueprint` per kept session
   (client order, sorted session IDs), each with its own RNG seeded by ``Int63()`` draws
   from the blueprint stream (``seed + 7919``).

Token IDs are uniform in ``[0, 128000)``, drawn vectorised (``R.integers(..., size=n)``).
Bit-parity with Go's ``math/rand`` is impossible; determinism and structure are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from blis_simpy.bounds import MAX_REQUESTS, MAX_TOKENS
from blis_simpy.errors import ConfigError
from blis_simpy.request import Request
from blis_simpy.rng import child_seed, derive_seed, numpy_rng, to_signed64
from blis_simpy.units import MAX_INT64
from blis_simpy.workload.arrivals import make_arrival_sampler
from blis_simpy.workload.expand import expand_cohorts, expand_inference_perf, load_servegen
from blis_simpy.workload.samplers import VOCAB_SIZE, RequestSampler
from blis_simpy.workload.sessions import (
    SESSION_DEFAULT_TIMEOUT_US,
    SessionBlueprint,
    SessionManager,
    session_deadline,
)
from blis_simpy.workload.spec import ClientSpec, WorkloadSpecV2, upgrade_v1, validate_spec

log = logging.getLogger(__name__)

__all__ = ["SESSION_DEFAULT_TIMEOUT_US", "VOCAB_SIZE", "GeneratedWorkload", "compute_deadline",
           "generate_requests", "generate_workload", "is_closed_loop", "prepare_spec"]

DEFAULT_PREFIX_LENGTH = 50
RNG_STREAM = "workload-gen"
BLUEPRINT_SEED_OFFSET = 7919
CLIENT_CAP_FACTOR = 1   # standard clients; BLIS: 2, 1 gives the same requests (docstring, step 5)
SESSION_CAP_FACTOR = 2  # multi-turn clients: BLIS's literal cap


def prepare_spec(spec: WorkloadSpecV2, base_dir: str | None = None
                 ) -> tuple[WorkloadSpecV2, list[ClientSpec]]:
    """Step 1: upgrade, validate, expand the sources; returns the (expanded) spec and the
    working client list. ``base_dir``: folder of the spec file (ServeGen paths)."""
    spec = upgrade_v1(spec)
    validate_spec(spec)
    if spec.inference_perf is not None:
        spec = expand_inference_perf(spec)
        validate_spec(spec)
    elif spec.servegen_data is not None:
        spec = load_servegen(spec, base_dir)
        validate_spec(spec)
    return spec, list(spec.clients) + expand_cohorts(spec.cohorts)


def is_multi_turn(c: ClientSpec) -> bool:
    return c.reasoning is not None and c.reasoning.multi_turn is not None


def is_closed_loop(c: ClientSpec) -> bool:
    """``closed_loop`` if given, else true iff the client has ``reasoning.multi_turn``."""
    if c.closed_loop is not None:
        return c.closed_loop
    return is_multi_turn(c)


def compute_deadline(arrival_us: int, c: ClientSpec) -> int:
    """Absolute deadline in µs (0 = none): ``timeout`` if given (0 ⇒ none), else the 300 s
    session default for closed-loop clients, else none."""
    if c.timeout is not None:
        return arrival_us + c.timeout if c.timeout > 0 else 0
    return arrival_us + SESSION_DEFAULT_TIMEOUT_US if is_closed_loop(c) else 0


def client_rates(spec: WorkloadSpecV2, clients: list[ClientSpec]) -> list[float]:
    """Per-client rates in requests per µs (fractions normalised; all zero ⇒ all 0)."""
    total = sum(c.rate_fraction for c in clients)
    if total <= 0:
        return [0.0] * len(clients)
    return [spec.aggregate_rate * c.rate_fraction / total / 1e6 for c in clients]


def draw_prefixes(clients: list[ClientSpec], g: np.random.Generator) -> dict[str, np.ndarray]:
    """Step 4: one token-ID array per prefix group, drawn from ``g`` in client order."""
    prefixes: dict[str, np.ndarray] = {}
    lengths: dict[str, int] = {}
    for c in clients:            # first positive length of each group
        if c.prefix_group and c.prefix_length > 0:
            lengths.setdefault(c.prefix_group, c.prefix_length)
    for c in clients:
        grp = c.prefix_group
        if grp and grp not in prefixes:
            n = lengths.get(grp, DEFAULT_PREFIX_LENGTH)
            prefixes[grp] = g.integers(0, VOCAB_SIZE, size=n, dtype=np.int32)
    return prefixes


def _windows(c: ClientSpec) -> list[tuple[int, int]]:
    return [(w.start_us, w.end_us) for w in c.lifecycle.windows] if c.lifecycle else []


def _inside(t: int, windows: list[tuple[int, int]]) -> bool:
    return any(s <= t < e for s, e in windows)


def _new_request(c: ClientSpec, t: int, inp, outp, mod, prefix, deadline: int, *,
                 session_id: str = "", round_index: int = 0, reason_ratio: float = 0.0) -> Request:
    plen = 0 if prefix is None else len(prefix)
    if plen:
        inp = np.concatenate((prefix, inp))
    return Request("", t, inp, outp, max_output_len=len(outp), deadline_us=deadline,
                   tenant_id=c.tenant_id, slo_class=c.slo_class, session_id=session_id,
                   round_index=round_index, client_id=c.id, prefix_group=c.prefix_group,
                   prefix_length=plen, streaming=c.streaming, model=c.model,
                   reason_ratio=reason_ratio, text_tokens=mod[0], image_tokens=mod[1],
                   audio_tokens=mod[2], video_tokens=mod[3])


def _client_requests(c: ClientSpec, idx: int, rate: float, rng: np.random.Generator,
                     prefix: np.ndarray | None, horizon: int, cap: int | None) -> list[Request]:
    """Step 6 for one standard client: its requests in arrival order (IDs unset)."""
    f = f"client[{idx}]"
    arrival = make_arrival_sampler(c.arrival.process, rate, c.arrival.cv, f"{f}.arrival")
    sampler = RequestSampler(c, f)
    out: list[Request] = []
    if cap is not None and cap <= 0:
        return out
    for r in client_arrivals(c, arrival, sampler, rng, prefix, horizon):
        out.append(r)
        _bounded(out, cap, f)
        if cap is not None and len(out) >= cap:
            break
    return out


def client_arrivals(c: ClientSpec, arrival, sampler: RequestSampler, rng: np.random.Generator,
                    prefix: np.ndarray | None, horizon: int) -> Iterator[Request]:
    """Step 6 for one standard client, lazily: its requests in arrival order (IDs unset),
    each drawn when the iteration reaches it (``arrival``: its arrival sampler; times in µs,
    strictly increasing, before ``horizon`` and inside the client's windows)."""
    for t, (inp, outp, mod) in _client_draws(c, arrival, sampler, rng, horizon):
        yield _new_request(c, t, inp, outp, mod, prefix, compute_deadline(t, c))


def client_arrival_times(c: ClientSpec, arrival, sampler: RequestSampler, rng: np.random.Generator,
                         horizon: int) -> Iterator[int]:
    """The arrival times (µs) :func:`client_arrivals` gives for the same arguments, with the
    same draws from ``rng`` but no request built: what counting a stream needs."""
    for t, _ in _client_draws(c, arrival, sampler, rng, horizon):
        yield t


def _client_draws(c: ClientSpec, arrival, sampler: RequestSampler, rng: np.random.Generator,
                  horizon: int) -> Iterator[tuple[int, tuple]]:
    """``(arrival µs, sampler.draw(rng))`` for each request of a standard client, in order."""
    windows = _windows(c)
    end = horizon
    if windows:  # nothing is generated after the last window: stop there (same result)
        end = min(end, max(e for _, e in windows))
    t = 0
    while t < end:
        t += arrival.iat(rng)
        if t >= end:
            break
        if windows and not _inside(t, windows):
            continue
        yield t, sampler.draw(rng)


#: arrivals a horizon-bound workload may draw (those outside its windows are skipped)
MAX_ARRIVAL_DRAWS = 10 * MAX_REQUESTS


def _bounded(out: list, cap: int | None, field: str) -> None:
    """Refuse a client that generates more than twice :data:`~blis_simpy.bounds.MAX_REQUESTS`
    requests beyond its cap (a horizon-bound workload at a huge rate, a session of endless
    rounds) instead of filling memory: no valid workload gets there."""
    if len(out) > (cap or 0) + 2 * MAX_REQUESTS:     # past any Poisson noise of the estimate
        raise ConfigError(f"generates more than {MAX_REQUESTS:,} requests (the limit, "
                          "docs/scenarios.md \"Limits\"); set num_requests, or lower the rate, "
                          "the rounds or the horizon", field=field)


def _session_requests(c: ClientSpec, idx: int, rate: float, rng: np.random.Generator,
                      prefix: np.ndarray | None, horizon: int, cap: int | None) -> list[Request]:
    """Step 6 for a multi-turn client (docs/workloads.md): every round of every session.

    A session starting at ``t0`` draws its ID ``sess_<R.Int63()>``; round ``r`` (arrival
    ``t_r``, ``t_0 = t0``): stop if ``t_r ≥ horizon`` (this and later rounds are dropped);
    draw input length, output length, new input IDs, output IDs, then the reason ratio
    (``clamp(sample/100, 0, 1)``, if the client has a ratio distribution); the input is the
    new tokens, or with ``accumulate`` and ``r > 0`` the accumulated context + new tokens;
    a round outside the lifecycle windows is skipped (no request, no context growth), else
    the request is emitted (group prefix prepended, deadline ``timeout`` or the 300 s
    session default) and, with ``accumulate``, context += new input + outputs. Then
    ``t_{r+1} = t_r + think_time_us + output_len`` (1 µs per output token). With
    ``accumulate``, the session ends at the first round whose context + new tokens would
    pass 2^24 (``MAX_TOKENS``): that round and later ones are not generated.

    ``single_session``: one session at ``IAT`` (``window0.start + IAT`` with windows),
    dropped if it starts at/after the horizon or outside the windows. Otherwise a session
    starts at each arrival of the client's process (they overlap), outside-window
    arrivals skipped, until the horizon or the per-client cap (counted in requests).
    """
    f = f"client[{idx}]"
    mt = c.reasoning.multi_turn
    arrival = make_arrival_sampler(c.arrival.process, rate, c.arrival.cv, f"{f}.arrival")
    sampler = RequestSampler(c, f)
    windows = _windows(c)
    accumulate = mt.context_growth == "accumulate"
    out: list[Request] = []

    def session(t0: int) -> None:
        sid = f"sess_{child_seed(rng)}"
        context = np.zeros(0, dtype=np.int32)
        t = t0
        for r in range(mt.max_rounds):
            if t >= horizon:
                break
            new_in, outp, mod = sampler.draw(rng)
            if accumulate and r > 0 and len(context) + len(new_in) > MAX_TOKENS:
                break           # context + new tokens would pass the cap (the shared prefix
                                # is not counted): the session ends
            inp = np.concatenate((context, new_in)) if accumulate and r > 0 else new_in
            ratio = sampler.reason_ratio(rng)
            if not windows or _inside(t, windows):
                out.append(_new_request(c, t, inp, outp, mod, prefix,
                                        session_deadline(t, c.timeout), session_id=sid,
                                        round_index=r, reason_ratio=ratio))
                _bounded(out, cap, f)
                if accumulate:
                    context = np.concatenate((context, new_in, outp))
            t = t + mt.think_time_us + len(outp)

    if mt.single_session:
        t0 = arrival.iat(rng) + (windows[0][0] if windows else 0)
        if t0 < horizon and (not windows or _inside(t0, windows)):
            session(t0)
        return out
    end = horizon
    if windows:
        end = min(end, max(e for _, e in windows))
    t = 0
    while t < end and (cap is None or len(out) < cap):
        t += arrival.iat(rng)
        if t >= end:
            break
        if windows and not _inside(t, windows):
            continue
        session(t)
    return out


@dataclass
class GeneratedWorkload:
    """The requests of a spec (sorted by arrival, ``request_<i>``) and the blueprints of
    its closed-loop sessions (their round-0 requests are in ``requests``)."""

    requests: list[Request]
    blueprints: list[SessionBlueprint] = field(default_factory=list)
    seed: int = 0
    horizon_us: int = MAX_INT64

    def session_manager(self) -> SessionManager | None:
        """A manager over the blueprints (None without closed-loop sessions). Blueprints
        carry session state: one manager, one run."""
        return SessionManager(self.blueprints) if self.blueprints else None


def generate_workload(spec: WorkloadSpecV2, *, seed: int | None = None,
                      horizon: int | None = None, max_requests: int | None = None,
                      base_dir: str | None = None) -> GeneratedWorkload:
    """Generate the requests and session blueprints of a v2 spec.

    ``seed`` (default ``spec.seed``) is the workload seed; ``horizon`` in µs (default
    ``spec.horizon`` if > 0, else unbounded); ``max_requests`` (default
    ``spec.num_requests``; ≤ 0 = unlimited). The CLI passes the explicitly given flags.
    ``base_dir``: folder of the spec file (a relative ServeGen path is tried there second).
    """
    spec, clients, horizon, max_requests = prepare_generation(spec, horizon, max_requests, base_dir)
    seed = spec.seed if seed is None else seed
    g = numpy_rng(derive_seed(seed, RNG_STREAM))
    rates = client_rates(spec, clients)
    prefixes = draw_prefixes(clients, g)
    tagged: list[tuple[Request, int]] = []
    for i, (c, rate) in enumerate(zip(clients, rates, strict=True)):
        if rate <= 0:
            continue
        rng = numpy_rng(child_seed(g))
        if is_multi_turn(c):
            cap = SESSION_CAP_FACTOR * max_requests if max_requests > 0 else None
            reqs = _session_requests(c, i, rate, rng, prefixes.get(c.prefix_group), horizon, cap)
        else:
            cap = CLIENT_CAP_FACTOR * max_requests if max_requests > 0 else None
            reqs = _client_requests(c, i, rate, rng, prefixes.get(c.prefix_group), horizon, cap)
        tagged.extend((r, i) for r in reqs)
    tagged.sort(key=lambda x: x[0].arrival_us)  # stable: ties keep client order
    if max_requests > 0:
        del tagged[max_requests:]
    closed = {i for i, c in enumerate(clients) if is_multi_turn(c) and is_closed_loop(c)}
    if closed:
        tagged = [(r, i) for r, i in tagged if i not in closed or r.round_index == 0]
    for k, (r, _) in enumerate(tagged):
        r.id = f"request_{k}"
    blueprints = _blueprints(clients, closed, tagged, prefixes, seed, horizon) if closed else []
    return GeneratedWorkload([r for r, _ in tagged], blueprints, seed, horizon)


def check_workload(spec: WorkloadSpecV2, *, horizon: int | None = None,
                   max_requests: int | None = None, base_dir: str | None = None) -> None:
    """Every check :func:`generate_workload` makes before drawing a request (the clients it
    expands to, ServeGen files, the bound on generation), without generating:
    ``blis-simpy validate`` says what ``run`` would."""
    prepare_generation(spec, horizon, max_requests, base_dir)


def prepare_generation(spec: WorkloadSpecV2, horizon: int | None, max_requests: int | None,
                       base_dir: str | None) -> tuple[WorkloadSpecV2, list[ClientSpec], int, int]:
    """Step 1 and the bounds on generation: the expanded spec, the working client list, the
    horizon (µs; unbounded: ``MAX_INT64``) and the request cap (≤ 0: none)."""
    spec, clients = prepare_spec(spec, base_dir)
    if horizon is None:
        horizon = spec.horizon if spec.horizon > 0 else MAX_INT64
    elif horizon <= 0:
        raise ConfigError(f"must be > 0, got {horizon}", field="horizon")
    if max_requests is None:
        max_requests = spec.num_requests
    if max_requests <= 0 and horizon >= MAX_INT64:
        raise ConfigError("workload requires either num_requests or --horizon to bound generation",
                          field="num_requests")
    if max_requests <= 0:
        _check_expected_count(spec, clients, horizon)
    return spec, clients, horizon, max_requests


def _check_expected_count(spec: WorkloadSpecV2, clients: list[ClientSpec], horizon: int) -> None:
    """A workload bound by its horizon alone must not be expected to generate more than
    :data:`~blis_simpy.bounds.MAX_REQUESTS` requests: Σ over clients of rate × the time its
    windows are open before the horizon (all of it without windows) — × the most rounds a
    session can have before the horizon (each round takes think time + at least 1 µs) for a
    multi-turn client. Nor may it draw more than :data:`MAX_ARRIVAL_DRAWS` arrivals (rate ×
    the span up to its last window's end: arrivals outside the windows are drawn, then
    skipped). Refused up front, in ``validate`` too, instead of generating for hours."""
    expected = 0.0
    draws = 0.0
    for c, rate in zip(clients, client_rates(spec, clients), strict=True):
        windows = _windows(c)
        span = min(horizon, max(e for _, e in windows)) if windows else horizon
        open_us = sum(max(0, min(e, horizon) - s) for s, e in windows) if windows else horizon
        single = is_multi_turn(c) and c.reasoning.multi_turn.single_session
        n = 1.0 if single else rate * open_us
        draws += 1.0 if single else rate * span
        if is_multi_turn(c):
            mt = c.reasoning.multi_turn
            n *= min(mt.max_rounds, span / (mt.think_time_us + 1) + 1)
        expected += n
    if expected > MAX_REQUESTS:
        raise ConfigError(f"a horizon of {horizon:,} us at these rates is about {expected:.3g} "
                          f"requests, more than the limit of {MAX_REQUESTS:,} (docs/scenarios.md "
                          "\"Limits\"); set num_requests, or lower the rate, the rounds or the horizon",
                          field="num_requests")
    if draws > MAX_ARRIVAL_DRAWS:
        raise ConfigError(f"a horizon of {horizon:,} us at these rates draws about {draws:.3g} "
                          f"arrivals (most outside the clients' windows), more than the limit of "
                          f"{MAX_ARRIVAL_DRAWS:,}; end the horizon at the last window or set "
                          "num_requests", field="num_requests")


def _blueprints(clients: list[ClientSpec], closed: set[int], tagged, prefixes, seed: int,
                horizon: int) -> list[SessionBlueprint]:
    """One blueprint per kept closed-loop session: client order, sorted session IDs; each
    RNG seeded by an ``Int63()`` draw of the blueprint stream (``seed + 7919``).

    Sessions belong to the client that generated them. (BLIS re-matches round-0 requests
    to clients by tenant, SLO class and model, which differs only when two closed-loop
    clients share all three: BLIS then gives the first one's blueprint to both's sessions.)
    """
    bp_rng = numpy_rng(to_signed64(seed + BLUEPRINT_SEED_OFFSET))
    round0: dict[int, dict[str, Request]] = {}
    for r, i in tagged:
        if i in closed:
            round0.setdefault(i, {})[r.session_id] = r
    out = []
    for i, c in enumerate(clients):
        if i not in closed or i not in round0:
            continue
        mt = c.reasoning.multi_turn
        sampler = RequestSampler(c, f"client[{i}]")
        prefix = prefixes.get(c.prefix_group)
        for sid in sorted(round0[i]):
            out.append(SessionBlueprint(
                session_id=sid, sampler=sampler, rng=numpy_rng(child_seed(bp_rng)),
                max_rounds=mt.max_rounds, think_time_us=mt.think_time_us, horizon_us=horizon,
                timeout_us=c.timeout, accumulate=mt.context_growth == "accumulate",
                prefix=prefix if prefix is not None else np.zeros(0, dtype=np.int32),
                client_id=c.id, tenant_id=c.tenant_id, slo_class=c.slo_class, model=c.model,
                prefix_group=c.prefix_group, streaming=c.streaming,
                current_id=round0[i][sid].id))
    return out


def generate_requests(spec: WorkloadSpecV2, *, seed: int | None = None,
                      horizon: int | None = None, max_requests: int | None = None,
                      base_dir: str | None = None) -> list[Request]:
    """The requests of :func:`generate_workload` (sorted by arrival, ``request_<i>``).

    For closed-loop sessions these are only the round-0 requests; the follow-ups need the
    session manager of :func:`generate_workload`.
    """
    return generate_workload(spec, seed=seed, horizon=horizon, max_requests=max_requests,
                             base_dir=base_dir).requests
