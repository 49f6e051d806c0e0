"""The autoscaler: a SimPy process that scales the serving instances over the run
(docs/control-plane.md, "Autoscaling").

The simulation builds ``max_instances`` instances (engines of ``dp`` ranks); each is
``off``, ``loading``, ``serving`` or ``draining``. The first ``initial`` serve from time 0.
Every ``interval_us`` (first at ``interval_us``) the process builds a read-only
:class:`~blis_simpy.autoscaling.base.AutoscaleState`, asks the policy for the number of
instances, clamps it to ``[min, max]`` and moves instances:

* **up**: an ``off`` instance (lowest index first) starts ``loading`` and serves after the
  loading delay (a keyed event at ``decision + delay``, :data:`~blis_simpy.des.AUTOSCALE`:
  before any arrival of that µs, so it takes a request arriving then);
* **down**: ``loading`` instances are cancelled first (newest first; they never serve), then
  ``serving`` ones (highest index first) start ``draining``: the router no longer sees them
  (:attr:`Cluster.routable <blis_simpy.cluster.cluster.Cluster.routable>`), they finish what
  they hold, and turn ``off`` when the cluster counts none of their requests in flight, at the
  end of the step their last request left in.

GPU time: an instance counts its TP × DP GPUs from when it starts loading (time 0 for the
initial ones) until it turns off or the run ends (:attr:`AutoscaleRecord.spans`).

The process never outlives the run: as the timeline monitor (:mod:`blis_simpy.cluster.monitor`)
it wakes for a decision at ``t`` only while an event at or after ``t`` (within the horizon),
other than an instance of its own becoming ready, is queued. A decision reads only snapshots
and changes only which instances the router sees, so a run with an autoscaler whose count
never changes gives the outputs of the fixed deployment of ``initial`` instances.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from blis_simpy.autoscaling.base import AutoscalePolicy, AutoscaleState, PoolState
from blis_simpy.des import AUTOSCALE, wait_until_due
from blis_simpy.engine.listener import InstanceListener
from blis_simpy.metrics.autoscale import AutoscaleSetup
from blis_simpy.plugins import call_failure, plugin_error, shown
from blis_simpy.routing.base import as_index
from blis_simpy.snapshot import SnapshotProvider, make_snapshot

log = logging.getLogger("blis_simpy.cluster")

OFF, LOADING, SERVING, DRAINING = "off", "loading", "serving", "draining"
STATES = (OFF, LOADING, SERVING, DRAINING)
FIELD = "cluster.autoscaler.policy"
#: decisions kept in the record (one per interval), and count changes; past these the record
#: stops growing (the autoscaler goes on deciding; docs/metrics.md, "Autoscaling")
MAX_DECISIONS = 100_000
MAX_CHANGES = 1_000_000


@dataclass(slots=True)
class Unit:
    """One configured instance (an engine of ``dp`` ranks) and its state."""

    index: int
    ranks: list
    state: str = OFF
    since_us: int = 0      # when its current span of GPU time began
    serving_us: int = -1   # when it began serving in that span (-1: not yet)
    token: int = 0         # bumped when a loading is cancelled: its ready event does nothing


@dataclass
class AutoscaleRecord(AutoscaleSetup):
    """What the autoscaler did (times in µs).

    ``changes``: ``(t_us, serving, loading, draining)`` instances after every change (the
    first at 0); ``spans``: ``(instance, start_us, serving_us, end_us)``, each span of GPU
    time and when in it the instance began serving (-1: cancelled while loading);
    ``decisions``: ``(t_us, instances chosen, arrived so far)`` per decision (arrivals counted
    before any arrival of that µs); the set-up (:class:`AutoscaleSetup`) first."""

    changes: list[tuple[int, int, int, int]] = field(default_factory=list)
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)
    decisions: list[tuple[int, int, int]] = field(default_factory=list)
    scale_ups: int = 0          # instances started
    scale_downs: int = 0        # instances removed (cancelled or drained)
    end_us: int = 0

    @property
    def gpu_us(self) -> int:
        """GPU-µs: the spans' lengths × GPUs per instance."""
        return sum(end - start for _, start, _, end in self.spans) * self.gpus_per_instance


class _DrainWatch(InstanceListener):
    """The listener of a draining instance's ranks: the cluster's, then a look whether the
    instance holds nothing more (the autoscaler turns it off then)."""

    def __init__(self, inner, autoscaler: Autoscaler, unit: Unit):
        self.inner = inner
        self.autoscaler = autoscaler
        self.unit = unit
        self.wants_request_state = inner.wants_request_state
        self.quiet_steps = getattr(inner, "quiet_steps", False)

    def on_request_done(self, inst, req, tick_us: int) -> None:
        self.inner.on_request_done(inst, req, tick_us)
        self.autoscaler.request_left(self.unit, tick_us)

    def on_event_end(self, inst) -> None:
        self.inner.on_event_end(inst)


class Autoscaler:
    """Scale ``cluster``'s instances with ``policy`` (see the module docstring).

    ``instances``: every built rank, ``dp`` per configured instance; ``loading_delay_us``:
    from the decision to serving; ``max_num_running_reqs``: one rank's batch cap (the
    policies' batch occupancy). Starts its process at once."""

    def __init__(self, env, cluster, instances: list, policy: AutoscalePolicy, *,
                 interval_us: int, min_instances: int, max_instances: int, initial: int,
                 loading_delay_us: int, gpus_per_instance: int, dp: int = 1,
                 max_num_running_reqs: int = 1, horizon_us: int):
        self.env = env
        self.cluster = cluster
        self.policy = policy
        self.dp = dp
        self.interval_us = interval_us
        self.min = min_instances
        self.max = max_instances
        self.loading_delay_us = loading_delay_us
        self.max_num_running_reqs = max_num_running_reqs
        self.limit_us = horizon_us
        self.units = [Unit(e, instances[e * dp:(e + 1) * dp]) for e in range(len(instances) // dp)]
        for u in self.units[:initial]:
            u.state = SERVING
            u.serving_us = 0
        self.record = AutoscaleRecord(policy.name, interval_us, loading_delay_us, min_instances,
                                      max_instances, gpus_per_instance)
        self._changed(0)
        self.process = env.process(self._run())

    # ------------------------------------------------------------------ views
    def state_of(self, index: int) -> str:
        """The state of the instance whose rank has cluster index ``index``."""
        return self.units[index // self.dp].state

    def counts(self) -> tuple[int, int, int]:
        """Instances ``(serving, loading, draining)``."""
        states = [u.state for u in self.units]
        return states.count(SERVING), states.count(LOADING), states.count(DRAINING)

    def state(self, now_us: int) -> AutoscaleState:
        """What the policy sees now (one pool, named ``""``): every snapshot read now, as a
        metrics server would report it, without touching the routers' snapshot cache (with a
        periodic refresh a read would move the cache's next refresh)."""
        serving, loading, draining = self.counts()
        inflight = self.cluster.inflight
        snaps = tuple(make_snapshot(inst.id, inst.index, *SnapshotProvider.read(inst),
                                    inflight[inst.index], inst.model)
                      for u in self.units if u.state == SERVING for inst in u.ranks)
        pool = PoolState("", snaps, serving, loading, draining, self.min, self.max,
                         self.max_num_running_reqs, self.dp)
        return AutoscaleState((pool,), now_us)

    # ------------------------------------------------------------------ the process
    def _run(self):
        env, limit, step = self.env, self.limit_us, self.interval_us
        t = 0
        while True:
            nxt = t + step
            if nxt > limit:
                return
            # an event at or after nxt, other than our instances becoming ready (those alone
            # do not keep the run going), must be queued
            if not (yield from wait_until_due(env, nxt, limit, self._own)):
                return
            yield env.wake_at(nxt, AUTOSCALE)
            t = nxt
            self.decide(t)

    def _own(self, event) -> bool:
        """Is ``event`` one of our instances becoming ready?"""
        return getattr(event, "fn", None) == self._ready

    def decide(self, now_us: int) -> int:
        """One decision at ``now_us``: ask the policy, clamp, scale. Returns the count."""
        state = self.state(now_us)
        n = self._desired(state)
        n = min(max(n, self.min), self.max)
        rec = self.record
        if len(rec.decisions) < MAX_DECISIONS:
            rec.decisions.append((now_us, n, self.cluster.counters.arrived))
        self.scale_to(n, now_us)
        return n

    def _desired(self, state: AutoscaleState) -> int:
        pol = self.policy
        try:
            res = pol.desired(state)
        except Exception as exc:
            if pol._blis_builtin:
                raise
            raise call_failure(pol, "desired", exc, field=FIELD) from None
        if isinstance(res, dict) and set(res) == {""}:
            res = res[""]
        n = as_index(res)
        if n is None:
            raise plugin_error(pol, f"returned {shown(res)} from desired(); expected an int or "
                               "{pool name: int} for the pools ['']", field=FIELD)
        return n

    # ------------------------------------------------------------------ scaling
    def scale_to(self, n: int, now_us: int) -> None:
        """Move instances so that ``n`` serve or load (as far as ``off`` ones allow)."""
        active = [u for u in self.units if u.state in (SERVING, LOADING)]
        rec = self.record
        if n > len(active):
            for u in [u for u in self.units if u.state == OFF][:n - len(active)]:
                u.state = LOADING
                u.since_us = now_us
                u.serving_us = -1
                rec.scale_ups += 1
                if self.loading_delay_us == 0:
                    self._ready((u, u.token))
                else:
                    self.env.call_at(now_us + self.loading_delay_us, AUTOSCALE, self._ready,
                                     (u, u.token))
        elif n < len(active):
            loading = sorted((u for u in active if u.state == LOADING),
                             key=lambda u: (-u.since_us, -u.index))
            serving = sorted((u for u in active if u.state == SERVING), key=lambda u: -u.index)
            for u in (loading + serving)[:len(active) - n]:
                rec.scale_downs += 1
                if u.state == LOADING:
                    u.token += 1
                    self._off(u, now_us)
                else:
                    u.state = DRAINING
                    self._set_routable()
                    if self._idle(u):
                        self.check_drained(u)
                    else:
                        self._watch(u)
        self._changed(now_us)

    def _ready(self, arg) -> None:
        unit, token = arg
        if unit.state != LOADING or unit.token != token:
            return                   # cancelled while loading
        unit.state = SERVING
        unit.serving_us = self.env.now
        self._changed(self.env.now)
        gateway = getattr(self.cluster, "gateway", None)
        if gateway is not None:      # room for queued requests may have opened
            gateway.ring()

    def _idle(self, u: Unit) -> bool:
        inflight = self.cluster.inflight
        return all(inflight[inst.index] == 0 for inst in u.ranks)

    def _watch(self, u: Unit) -> None:
        for inst in u.ranks:
            inst.listener = _DrainWatch(inst.listener, self, u)

    def request_left(self, u: Unit, tick_us: int) -> None:
        """A request left draining ``u`` at ``tick_us`` (the end of its last step, which may
        lie ahead of the clock: the engine does a step's bookkeeping when it begins): when
        none is left in flight, ``u`` turns off at that time."""
        if self._idle(u):
            self.env.call_at(max(tick_us, self.env.now), AUTOSCALE, self.check_drained, u)

    def check_drained(self, u: Unit) -> None:
        """Turn a draining instance off once the cluster counts none of its requests in flight."""
        if u.state != DRAINING or not self._idle(u):
            return
        for inst in u.ranks:
            if isinstance(inst.listener, _DrainWatch):
                inst.listener = inst.listener.inner
        self._off(u, self.env.now)
        self._changed(self.env.now)

    def _off(self, u: Unit, now_us: int) -> None:
        self.record.spans.append((u.index, u.since_us, u.serving_us, now_us))
        u.state = OFF

    def _set_routable(self) -> None:
        self.cluster.routable = [inst for u in self.units if u.state == SERVING for inst in u.ranks]

    def _changed(self, now_us: int) -> None:
        """Record the counts after a change (one row per time: a later change at the same µs
        replaces it) and show the router the serving instances."""
        self._set_routable()
        row = (now_us, *self.counts())
        ch = self.record.changes
        if ch and ch[-1][0] == now_us:
            ch[-1] = row
        elif (not ch or ch[-1][1:] != row[1:]) and len(ch) < MAX_CHANGES:
            ch.append(row)

    def finish(self, end_us: int) -> AutoscaleRecord:
        """Close the spans of the instances still active at ``end_us`` (the run's end)."""
        rec = self.record
        rec.end_us = end_us
        for u in self.units:
            if u.state != OFF:
                rec.spans.append((u.index, u.since_us, u.serving_us, max(end_us, u.since_us)))
        rec.spans.sort()
        return rec
