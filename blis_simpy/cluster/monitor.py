"""The timeline monitor: per-instance state sampled over simulated time (``--timeline``).

A :class:`Monitor` is a SimPy process beside the instances that samples every instance at
``0, I, 2I, …`` µs (``I`` = the interval): requests running and waiting, KV blocks in use
and in all, preemptions and engine steps begun so far (cumulative) and, with prefill/decode pools, the KV
transfers in flight on the fabric (started, not yet completed; cluster-wide). The rows go
to a :class:`Timeline`; :mod:`blis_simpy.metrics.timeline_file` writes it as CSV or
Parquet, the calibration twin (:mod:`blis_simpy.calibrate.twin`) sums it over instances.

**What a sample means.** The sample at ``t`` is the state after every event before ``t``
and before any event at ``t`` (its wake has key :data:`SAMPLE_KEY`, below every model
event key; docs/architecture.md, "Time and event order"). Between events nothing changes,
so this is the state over ``[t_prev_event, t)``. The engine does a step's bookkeeping when
the step begins (BLIS's model, docs/engine.md): a request leaves ``running`` and frees its KV
blocks when its *last* step begins, not when that step ends.

**A pure observer.** The monitor only reads (``len`` of the queues, counters), so it never
changes the state. It never changes the order of the model's events either: SimPy orders
the heap by ``(time, key, insertion id)`` and insertion ids only grow, so the model events
keep their relative order; a step the fast engine would have run inline runs as its own
event instead, which gives the same order by construction (:meth:`SimEnv.due_before`).
And it never outlives the run: it schedules a sample at ``t`` only while a model event at
or after ``t`` (and within the horizon) is already queued; otherwise it waits, after every
event, for the latest queued one (key :data:`AFTER_KEY`) and looks again. So the clock, the
end of the run and whether the horizon stopped it are what they are without a monitor
(tests/report/test_timeline.py runs with and without and compares the outputs byte for
byte). When no event is left, one last sample at the next grid point records the final
state without waking.

Caps: the interval is at least :data:`MIN_INTERVAL_US` and at most
:data:`MAX_INTERVAL_US`; a run keeps at most :data:`MAX_SAMPLES` samples and
:data:`MAX_ROWS` rows (samples × instances); past that the timeline stops and
:attr:`Timeline.truncated` is set. Units: ``*_us`` integer µs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blis_simpy.des import OBSERVER_AFTER, OBSERVER_BEFORE, wait_until_due
from blis_simpy.metrics.timeline_file import COLUMNS, GATEWAY_COLUMN, STATE

__all__ = ["AFTER_KEY", "COLUMNS", "MAX_INTERVAL_US", "MAX_ROWS", "MAX_SAMPLES", "MIN_INTERVAL_US",
           "SAMPLE_KEY", "Monitor", "Timeline"]

SAMPLE_KEY = OBSERVER_BEFORE  # before every model event at the same time (those keys are >= 2)
AFTER_KEY = OBSERVER_AFTER    # after every model event at the same time
MIN_INTERVAL_US = 1_000      # 1 ms
MAX_INTERVAL_US = 86_400_000_000   # one simulated day
MAX_SAMPLES = 100_000
MAX_ROWS = 2_000_000


@dataclass
class Timeline:
    """The samples, as columns (see :data:`COLUMNS`): row ``s * n + i`` is instance ``i`` at
    sample ``s``. ``role`` is ``prefill``/``decode`` with pools, else empty;
    ``kv_transfers_in_flight`` is None without pools. With an autoscaler (``scaled``) one more
    column, ``state``: the instance's ``off``/``loading``/``serving``/``draining``."""

    interval_us: int
    instances: list[str]
    roles: list[str]
    pd: bool = False
    scaled: bool = False
    truncated: bool = False
    times_us: list[int] = field(default_factory=list)        # one per sample
    cols: dict[str, list] = field(default_factory=lambda: {c: [] for c in (*COLUMNS, STATE)})

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns written: :data:`COLUMNS`, ``gateway_queue_depth`` with a gateway queue
        and ``state`` with an autoscaler."""
        return (COLUMNS + ((GATEWAY_COLUMN,) if GATEWAY_COLUMN in self.cols else ())
                + ((STATE,) if self.scaled else ()))

    @property
    def n_samples(self) -> int:
        return len(self.times_us)

    def totals(self, name: str) -> list[int]:
        """Column ``name`` summed over the instances, one value per sample."""
        col, n = self.cols[name], len(self.instances)
        return [sum(col[s * n:(s + 1) * n]) for s in range(self.n_samples)]

    def rows(self) -> list[dict]:
        """The rows as dicts (column order)."""
        names = self.columns
        cols = [self.cols[c] for c in names]
        return [dict(zip(names, vals, strict=True)) for vals in zip(*cols, strict=True)]


class Monitor:
    """Sample ``sim``'s instances every ``interval_us`` (see the module docstring).

    ``sim``: a :class:`~blis_simpy.run.simulation.Simulation` not yet run; the monitor
    starts at once (first sample at the current time, 0 for a new simulation). ``max_samples``
    lowers the sample cap. Raises ValueError for an interval outside
    [:data:`MIN_INTERVAL_US`, :data:`MAX_INTERVAL_US`]."""

    def __init__(self, sim, interval_us: int, *, max_samples: int | None = None):
        interval_us = int(interval_us)
        if not MIN_INTERVAL_US <= interval_us <= MAX_INTERVAL_US:
            raise ValueError(f"timeline interval must be in [{MIN_INTERVAL_US / 1000:g}, "
                             f"{MAX_INTERVAL_US / 1000:g}] ms, got {interval_us / 1000:g} ms")
        self.env = sim.env
        self.limit_us = sim.horizon_us
        self.insts = list(sim.instances)
        cluster = sim.cluster
        self.fabric = getattr(cluster, "fabric", None) if sim.pools.enabled else None
        roles = list(getattr(cluster, "roles", [])) if self.fabric is not None else []
        roles += [""] * (len(self.insts) - len(roles))
        self.autoscaler = getattr(sim, "autoscaler", None)
        self.timeline = Timeline(interval_us, [i.id for i in self.insts], roles,
                                 pd=self.fabric is not None, scaled=self.autoscaler is not None)
        self.gateway = getattr(cluster, "gateway", None)
        if self.gateway is not None:
            self.timeline.cols[GATEWAY_COLUMN] = []
        cap = max(1, min(MAX_SAMPLES, MAX_ROWS // max(len(self.insts), 1)))
        self.max_samples = min(cap, max_samples) if max_samples else cap
        self.process = self.env.process(self._run())

    def _sample(self, t_us: int) -> None:
        tl = self.timeline
        tl.times_us.append(t_us)
        c = tl.cols
        transfers = self.fabric.active if self.fabric is not None else None
        if self.gateway is not None:
            c[GATEWAY_COLUMN].extend([self.gateway.counters.queued] * len(self.insts))
        for inst, role in zip(self.insts, tl.roles, strict=True):
            kv = inst.kv
            c["t_us"].append(t_us)
            c["instance"].append(inst.id)
            c["role"].append(role)
            c["running"].append(len(inst.running))
            c["waiting"].append(len(inst.waitq))
            c["kv_blocks_used"].append(kv.used)
            c["kv_blocks_total"].append(kv.total_blocks)
            c["preemptions"].append(inst.metrics.preemption_count)
            c["kv_transfers_in_flight"].append(transfers)
            c["steps"].append(inst.step_count)
            if self.autoscaler is not None:
                c[STATE].append(self.autoscaler.state_of(inst.index))

    def _run(self):
        env, limit, step = self.env, self.limit_us, self.timeline.interval_us
        t = env.now
        while True:
            self._sample(t)
            nxt = t + step
            if nxt > limit:
                return
            if self.timeline.n_samples >= self.max_samples:
                self.timeline.truncated = True
                return
            if not (yield from wait_until_due(env, nxt, limit)):
                self._sample(nxt)     # the run is over: the final state, without waking
                return                # (within the cap: checked above)
            yield env.wake_at(nxt, SAMPLE_KEY)
            t = nxt
