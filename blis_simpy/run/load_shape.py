"""The shape of the load over time (docs/workloads.md, "Closed-loop clients" and
"Time-varying open load"): a workload source's requests sent by closed-loop clients, or a
distribution's requests re-timed by a piecewise rate.

Both keep the source's requests and their order and replace only their arrival times, so
the j-th request offered is the j-th the source would have offered.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_right

from blis_simpy.bounds import MAX_REQUESTS
from blis_simpy.cluster.clients import ClientStage, ClosedLoopClients, ThinkTimeSampler
from blis_simpy.config.scenario import DistributionWorkload, TraceWorkload
from blis_simpy.errors import ConfigError
from blis_simpy.rng import derive_seed, numpy_rng
from blis_simpy.run.describe import RunDescription
from blis_simpy.units import MAX_INT64, seconds_to_us

__all__ = ["RetimedRequests", "arrival_rate_changes", "closed_loop_workload",
           "distribution_workload_spec", "generated", "rate_pieces", "time_varying_workload"]

#: the random streams of this module (docs/determinism.md, "Random streams")
THINK_STREAM, RATE_STREAM = "think-time", "rate-schedule"


def closed_loop_workload(d: RunDescription, source) -> tuple[list, int, ClosedLoopClients, int]:
    """No request offered up front, the horizon (µs), the :class:`ClosedLoopClients` that send
    the source's requests, and the workload seed. ``source(d, lazy=True)`` gives the source's
    requests (the pool), horizon, session manager and seed. The pool is never cut by the
    source's own arrival times: a distribution's is its ``num_requests`` (all requests up to
    10,000,000 when 0), a trace's runs without its replay horizon unless ``horizon_us`` is set.
    A source with closed-loop multi-turn sessions is refused."""
    s = d.scenario
    w = s.workload
    if isinstance(w, DistributionWorkload):
        cap = w.num_requests
        pool = generated(d, distribution_workload_spec(d), None, cap or MAX_REQUESTS, True)
        horizon, seed = s.horizon, s.seed
    else:
        pool, horizon, sessions, seed = source(d, lazy=True)
        if sessions is not None:
            raise d.attribute(ConfigError(
                "closed-loop clients cannot send a workload with closed-loop multi-turn sessions "
                "(their rounds follow their own sessions)", field="workload.concurrency"))
        if isinstance(w, TraceWorkload) and s.horizon_us is None:
            horizon = MAX_INT64
        cap = w.num_requests or 0 if not isinstance(w, TraceWorkload) else 0
    if w.concurrency_stages is not None:
        stages = [ClientStage(st.concurrency, num_requests=st.num_requests) if st.num_requests else
                  ClientStage(st.concurrency, max(seconds_to_us(st.duration_s), 1))
                  for st in w.concurrency_stages]
    else:
        stages = [ClientStage(w.concurrency)]
    t = w.think_time
    think = ThinkTimeSampler(t.dist, t.mean_ms, t.sigma) if t is not None else ThinkTimeSampler()
    rng = numpy_rng(derive_seed(seed, THINK_STREAM))
    return [], horizon, ClosedLoopClients(pool, stages, think, rng, max_requests=cap), seed


class RetimedRequests:
    """The requests of ``pool`` with the k-th one arriving at ``times[k]`` (µs, increasing),
    built lazily as the run reaches them."""

    def __init__(self, pool, times, rate_changes=None):
        self._pool = pool
        self.times = times
        self.last_arrival_us = times[-1] if len(times) else 0
        #: where the arrival rate changes (µs; the saturation test per piece, docs/metrics.md)
        self.rate_changes = rate_changes

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self):
        for r, t in zip(self._pool, self.times, strict=False):
            shift = t - r.arrival_us
            r.arrival_us = r.origin_us = t
            if r.deadline_us > 0:
                r.deadline_us += shift
            yield r

    def count_arriving_after(self, t_us: int) -> int:
        """Requests arriving strictly after ``t_us`` (µs)."""
        return len(self.times) - bisect_right(self.times, t_us)


def time_varying_workload(d: RunDescription, stream: bool) -> tuple[object, int, None, int]:
    """A distribution workload whose arrivals follow ``workload.stages``, ``rate_schedule`` or
    ``rate_csv`` (:mod:`blis_simpy.workload.rate_schedule`): the requests (lazy when
    ``stream``), the horizon (µs), no session manager, the seed. ``num_requests`` caps the
    arrivals only when written (its default of 100 would cut a day's traffic short)."""
    from blis_simpy.workload import rate_schedule as R
    s = d.scenario
    w = s.workload
    key, pieces = rate_pieces(d)
    cap = w.num_requests if "num_requests" in w.model_fields_set else 0
    horizon = s.horizon
    if cap <= 0:
        n = R.expected_arrivals(pieces, horizon)
        if n == float("inf"):
            raise d.attribute(ConfigError(
                "the last rate never ends: set horizon_us (--horizon) or workload.num_requests",
                field=f"workload.{key}"))
        if n > MAX_REQUESTS:
            raise d.attribute(ConfigError(
                f"about {n:.4g} arrivals, more than the {MAX_REQUESTS} a workload may have: set "
                "workload.num_requests or a shorter horizon", field=f"workload.{key}"))
    times = R.arrival_times(pieces, w.arrival, w.arrival_cv,
                            numpy_rng(derive_seed(s.seed, RATE_STREAM)), horizon_us=horizon,
                            max_requests=cap)
    spec = distribution_workload_spec(d)
    pool = generated(d, spec, None, len(times), True) if len(times) else []
    reqs = RetimedRequests(pool, times, R.rate_changes(pieces))
    return (reqs if stream else RequestList(reqs, reqs.rate_changes)), horizon, None, s.seed


class RequestList(list):
    """The requests of a time-varying load as a list, still carrying ``rate_changes`` (µs)
    for the saturation test: the workload's input (a rate CSV: maybe a pipe) is read once."""

    __slots__ = ("rate_changes",)

    def __init__(self, requests, rate_changes):
        super().__init__(requests)
        self.rate_changes = rate_changes


def rate_pieces(d: RunDescription) -> tuple[str, list]:
    """The scenario key and the :class:`~blis_simpy.workload.rate_schedule.RatePiece` list of
    a time-varying distribution workload (``workload.stages``, ``rate_schedule`` or
    ``rate_csv``; errors located on the key or in the CSV)."""
    from blis_simpy.workload import rate_schedule as R
    w = d.scenario.workload
    if w.stages is not None:
        return "stages", R.stage_pieces(w.stages)
    if w.rate_schedule is not None:
        return "rate_schedule", R.schedule_pieces([(p.at_s, p.rate) for p in w.rate_schedule])
    try:
        return "rate_csv", R.schedule_pieces(R.read_rate_csv(w.rate_csv))
    except ConfigError as exc:
        raise (exc if exc.file else d.attribute(exc)) from None


def arrival_rate_changes(d: RunDescription, requests):
    """Where the arrival rate of an open-loop time-varying load changes (µs, increasing; the
    saturation test per piece, docs/metrics.md), or None for any other workload (closed-loop
    concurrency stages included: their clients are not a rate). ``requests``: the workload's
    requests (a lazy :class:`RetimedRequests` or a :class:`RequestList` carries them; any
    other list does not, and the pieces are read again)."""
    from blis_simpy.workload import rate_schedule as R
    w = d.scenario.workload
    if w.closed_loop or not getattr(w, "time_varying", False):
        return None
    changes = getattr(requests, "rate_changes", None)
    return changes if changes is not None else R.rate_changes(rate_pieces(d)[1])


# ---------------------------------------------------------------------------- a distribution source
def distribution_workload_spec(d: RunDescription):
    """The one-client workload spec of a distribution workload (errors on its scenario keys)."""
    from blis_simpy.workload import LengthParams, distribution_spec
    s = d.scenario
    w = s.workload
    lp = lambda x: LengthParams(x.mean, x.stdev, x.min, x.max)  # noqa: E731
    with _distribution_keys(d):
        return distribution_spec(w.rate, w.num_requests, s.seed, lp(w.prompt_tokens),
                                 lp(w.output_tokens), w.prefix_tokens, w.arrival, w.arrival_cv)


def generated(d: RunDescription, spec, horizon: int | None, max_requests: int, stream: bool):
    """The requests of a distribution ``spec`` up to ``horizon`` (µs), at most ``max_requests``:
    a lazy stream when ``stream``, else a list."""
    from blis_simpy.workload import generate_requests
    from blis_simpy.workload.generated_stream import stream_workload
    kw = {"seed": d.scenario.seed, "horizon": horizon, "max_requests": max_requests}
    with _distribution_keys(d):
        reqs = stream_workload(spec, **kw) if stream else None
        return reqs if reqs is not None else generate_requests(spec, **kw)


@contextlib.contextmanager
def _distribution_keys(d: RunDescription):
    """A distribution's errors (worded on BLIS's flags) on their ``workload.`` keys."""
    try:
        yield
    except ConfigError as exc:
        from blis_simpy.workload.distribution import FIELD_KEYS
        key = FIELD_KEYS.get(exc.field or "")
        if key is not None:
            exc = ConfigError(exc.problem, field=f"workload.{key}")
        raise d.attribute(exc) from None
