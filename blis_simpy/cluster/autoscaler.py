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
  they hold, and turn ``off`` when the cluster counts none of their requests in flight (with
  prefill/decode pools: and they send no prompt KV), at the end of the step their last request
  left in (:attr:`Instance.busy_until_us <blis_simpy.engine.instance.Instance.busy_until_us>`).

GPU time: an instance counts its TP × DP GPUs from when it starts loading (time 0 for the
initial ones) until it turns off or the run ends (:attr:`AutoscaleRecord.spans`).

**Pools.** The instances form one or more :class:`ScaledPool`: one pool named ``""``, or with
prefill/decode disaggregation ``prefill`` and ``decode``, each with its own bounds, GPUs per
instance and loading delay. The policy sees one :class:`PoolState` per pool and returns a count
per pool; each pool scales as above on its own instances. The cluster routes only to the
serving instances (:meth:`Cluster.set_serving <blis_simpy.cluster.cluster.Cluster.set_serving>`;
a PD cluster recomputes its two pools from them).

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
from blis_simpy.errors import ConfigError
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


@dataclass(slots=True)
class ScaledPool:
    """One pool the autoscaler scales: its name (``""``, ``prefill`` or ``decode``), its
    instances (:class:`Unit`, index order), its bounds, the GPUs of one instance (TP × DP) and
    its loading delay (µs)."""

    name: str
    units: list[Unit]
    min_instances: int
    max_instances: int
    gpus_per_instance: int
    loading_delay_us: int

    def counts(self) -> tuple[int, int, int]:
        """Instances ``(serving, loading, draining)``."""
        return state_counts(self.units)


def state_counts(units) -> tuple[int, int, int]:
    """How many of ``units`` are ``(serving, loading, draining)``."""
    states = [u.state for u in units]
    return states.count(SERVING), states.count(LOADING), states.count(DRAINING)


@dataclass
class AutoscaleRecord(AutoscaleSetup):
    """What the autoscaler did (times in µs).

    ``changes``: ``(t_us, serving, loading, draining)`` instances after every change (the
    first at 0); ``spans``: ``(instance, start_us, serving_us, end_us)``, each span of GPU
    time and when in it the instance began serving (-1: cancelled while loading);
    ``decisions``: ``(t_us, instances chosen, arrived so far)`` per decision (arrivals counted
    before any arrival of that µs); the set-up (:class:`AutoscaleSetup`) first. Counts are
    summed over the pools; with more than one pool, ``pools`` holds each pool's set-up
    (``name``, bounds, ``initial_instances``, ``gpus_per_instance``, ``loading_delay_us``),
    ``pool_changes`` rows ``(t_us, pool, serving, loading, draining)`` and ``pool_decisions``
    ``(t_us, {pool: instances chosen})``; each pool's ``units`` are its configured instances."""

    changes: list[tuple[int, int, int, int]] = field(default_factory=list)
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)
    decisions: list[tuple[int, int, int]] = field(default_factory=list)
    scale_ups: int = 0          # instances started
    scale_downs: int = 0        # instances removed (cancelled or drained)
    end_us: int = 0
    pools: list[dict] = field(default_factory=list)
    pool_changes: list[tuple[int, str, int, int, int]] = field(default_factory=list)
    pool_decisions: list[tuple[int, dict[str, int]]] = field(default_factory=list)

    def _setup_of(self, unit: int, key: str) -> int:
        """``key`` (``gpus_per_instance`` or ``loading_delay_us``) of configured instance
        ``unit``: its pool's, or the set-up's with one pool."""
        for p in self.pools:
            if unit in p["units"]:
                return p[key]
        return getattr(self, key)

    def gpus_of(self, unit: int) -> int:
        """GPUs of configured instance ``unit``."""
        return self._setup_of(unit, "gpus_per_instance")

    def loading_delay_of(self, unit: int) -> int:
        """The loading delay (µs) of configured instance ``unit``."""
        return self._setup_of(unit, "loading_delay_us")

    @property
    def gpu_us(self) -> int:
        """GPU-µs: Σ over the spans of their length × their instance's GPUs."""
        if not self.pools:
            return sum(end - start for _, start, _, end in self.spans) * self.gpus_per_instance
        return sum((end - start) * self.gpus_of(u) for u, start, _, end in self.spans)

    def pool_gpu_us(self, name: str) -> int:
        """GPU-µs of the instances of pool ``name``."""
        members = next(p["units"] for p in self.pools if p["name"] == name)
        return sum((end - start) * self.gpus_of(u) for u, start, _, end in self.spans
                   if u in members)


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

    ``pools``: every configured instance (an engine of ``dp`` ranks) once, in its pool;
    ``initial``: instances serving at time 0, by pool; ``max_num_running_reqs``: one rank's
    batch cap (the policies' batch occupancy). Starts its process at once."""

    def __init__(self, env, cluster, pools: list[ScaledPool], policy: AutoscalePolicy, *,
                 interval_us: int, initial: dict[str, int], dp: int = 1,
                 max_num_running_reqs: int = 1, horizon_us: int):
        self.env = env
        self.cluster = cluster
        self.policy = policy
        self.dp = dp
        self.interval_us = interval_us
        self.max_num_running_reqs = max_num_running_reqs
        self.limit_us = horizon_us
        #: prompt KVs each instance still sends (prefill/decode pools), or None
        self._sending = getattr(cluster, "kv_sending", None)
        if self._sending is not None:
            cluster.on_kv_sent = self._kv_sent
        self.pools = pools
        self._check_policy()
        self.units = sorted((u for p in pools for u in p.units), key=lambda u: u.index)
        if [u.index for u in self.units] != list(range(len(self.units))):
            raise ValueError("the scaled pools must hold every instance once")
        for p in pools:
            for u in p.units[:initial[p.name]]:
                u.state = SERVING
                u.serving_us = 0
        gpus = {p.gpus_per_instance for p in pools}
        delays = {p.loading_delay_us for p in pools}
        self.record = rec = AutoscaleRecord(
            policy.name, interval_us, delays.pop() if len(delays) == 1 else 0,
            sum(p.min_instances for p in pools), sum(p.max_instances for p in pools),
            gpus.pop() if len(gpus) == 1 else 0)
        if len(pools) > 1:
            rec.pools = [{"name": p.name, "min_instances": p.min_instances,
                          "max_instances": p.max_instances, "initial_instances": initial[p.name],
                          "gpus_per_instance": p.gpus_per_instance,
                          "loading_delay_us": p.loading_delay_us,
                          "units": frozenset(u.index for u in p.units)} for p in pools]
        self._changed(0)
        self.process = env.process(self._run())

    def _check_policy(self) -> None:
        """The policy's parameters against the pools (:meth:`AutoscalePolicy.check_pools`):
        a problem is a located error on its parameters; a plugin's failure there is its own."""
        pol = self.policy
        try:
            problem = pol.check_pools([p.name for p in self.pools])
        except Exception as exc:
            if pol._blis_builtin:
                raise
            raise call_failure(pol, "check_pools", exc, field=FIELD) from None
        if problem is not None:
            raise ConfigError(problem, field="cluster.autoscaler.params")

    # ------------------------------------------------------------------ views
    def state_of(self, index: int) -> str:
        """The state of the instance whose rank has cluster index ``index``."""
        return self.units[index // self.dp].state

    def counts(self) -> tuple[int, int, int]:
        """Instances ``(serving, loading, draining)``, over every pool."""
        return state_counts(self.units)

    def state(self, now_us: int) -> AutoscaleState:
        """What the policy sees now (one :class:`PoolState` per pool): every snapshot read now,
        as a metrics server would report it, without touching the routers' snapshot cache (with
        a periodic refresh a read would move the cache's next refresh)."""
        inflight = self.cluster.inflight
        out = []
        for p in self.pools:
            snaps = tuple(make_snapshot(inst.id, inst.index, *SnapshotProvider.read(inst),
                                        inflight[inst.index], inst.model)
                          for u in p.units if u.state == SERVING for inst in u.ranks)
            out.append(PoolState(p.name, snaps, *p.counts(), p.min_instances, p.max_instances,
                                 self.max_num_running_reqs, self.dp))
        gateway = getattr(self.cluster, "gateway", None)
        return AutoscaleState(tuple(out), now_us,
                              gateway.counters.queued if gateway is not None else 0)

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
        """One decision at ``now_us``: ask the policy, clamp each pool's count, scale.
        Returns the count summed over the pools."""
        state = self.state(now_us)
        wanted = self._desired(state)
        chosen = {}
        for p, ps in zip(self.pools, state.pools, strict=True):
            n = wanted.get(p.name, ps.current)
            chosen[p.name] = min(max(n, p.min_instances), p.max_instances)
        total = sum(chosen.values())
        rec = self.record
        if len(rec.decisions) < MAX_DECISIONS:
            rec.decisions.append((now_us, total, self.cluster.counters.arrived))
            if rec.pools:
                rec.pool_decisions.append((now_us, chosen))
        for p in self.pools:
            self._scale_pool(p, chosen[p.name], now_us)
        self._changed(now_us)
        return total

    def _desired(self, state: AutoscaleState) -> dict[str, int]:
        """The policy's counts by pool name (a pool it leaves out keeps its count)."""
        pol = self.policy
        try:
            res = pol.desired(state)
        except Exception as exc:
            if pol._blis_builtin:
                raise
            raise call_failure(pol, "desired", exc, field=FIELD) from None
        names = [p.name for p in self.pools]
        given = {names[0]: res} if not isinstance(res, dict) and len(names) == 1 else res
        counts = {k: as_index(v) for k, v in given.items()} if isinstance(given, dict) else None
        if counts is None or any(v is None for v in counts.values()) or not set(counts) <= set(names):
            one = "an int or " if len(names) == 1 else ""
            raise plugin_error(pol, f"returned {shown(res)} from desired(); expected {one}"
                               f"{{pool name: int}} for the pools {names}", field=FIELD)
        return counts

    # ------------------------------------------------------------------ scaling
    def _scale_pool(self, pool: ScaledPool, n: int, now_us: int) -> None:
        """Move instances of ``pool`` so that ``n`` serve or load (as far as ``off`` ones allow)."""
        units = pool.units
        active = [u for u in units if u.state in (SERVING, LOADING)]
        rec = self.record
        delay = pool.loading_delay_us
        if n > len(active):
            for u in [u for u in units if u.state == OFF][:n - len(active)]:
                u.state = LOADING
                u.since_us = now_us
                u.serving_us = -1
                rec.scale_ups += 1
                if delay == 0:
                    self._ready((u, u.token))
                else:
                    self.env.call_at(now_us + delay, AUTOSCALE, self._ready, (u, u.token))
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
                    if not self._idle(u):
                        self._watch(u)
                    elif self._free_at(u) <= now_us:
                        self.check_drained(u)
                    else:            # mid-step: its last request left when the step began
                        self.env.call_at(self._free_at(u), AUTOSCALE, self.check_drained, u)

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
        """Does ``u`` hold nothing: no request in flight and (prefill/decode pools) no prompt
        KV waiting to be sent?"""
        inflight = self.cluster.inflight
        sending = self._sending
        return all(inflight[inst.index] == 0 and (sending is None or sending[inst.index] == 0)
                   for inst in u.ranks)

    @staticmethod
    def _free_at(u: Unit) -> int:
        """When ``u``'s engines end their current step (µs)."""
        return max(inst.busy_until_us for inst in u.ranks)

    def _kv_sent(self, index: int) -> None:
        """A prompt KV left instance ``index`` (PD): a draining one may now hold nothing."""
        u = self.units[index // self.dp]
        if u.state == DRAINING and self._idle(u):
            self.env.call_at(max(self.env.now, self._free_at(u)), AUTOSCALE, self.check_drained, u)

    def _watch(self, u: Unit) -> None:
        for inst in u.ranks:
            inst.listener = _DrainWatch(inst.listener, self, u)

    def request_left(self, u: Unit, tick_us: int) -> None:
        """A request left draining ``u`` at ``tick_us`` (the end of its last step, which may
        lie ahead of the clock: the engine does a step's bookkeeping when it begins): when
        none is left in flight, ``u`` turns off at that time."""
        if self._idle(u):
            self.env.call_at(max(tick_us, self.env.now, self._free_at(u)), AUTOSCALE,
                             self.check_drained, u)

    def check_drained(self, u: Unit) -> None:
        """Turn a draining instance off once the cluster counts none of its requests in flight,
        it sends no prompt KV, and its engines' steps have ended."""
        if u.state != DRAINING or not self._idle(u):
            return
        free = self._free_at(u)
        if free > self.env.now:      # a step began since this check was set
            self.env.call_at(free, AUTOSCALE, self.check_drained, u)
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
        self.cluster.set_serving([inst for u in self.units if u.state == SERVING
                                  for inst in u.ranks])

    def _changed(self, now_us: int) -> None:
        """Record the counts after a change (one row per time: a later change at the same µs
        replaces it; per pool too with several) and show the router the serving instances."""
        self._set_routable()
        rec = self.record
        _log_row(rec.changes, (now_us, *self.counts()), 1)
        if rec.pools:
            for p in self.pools:
                _log_row(rec.pool_changes, (now_us, p.name, *p.counts()), 2)

    def finish(self, end_us: int) -> AutoscaleRecord:
        """Close the spans of the instances still active at ``end_us`` (the run's end)."""
        rec = self.record
        rec.end_us = end_us
        for u in self.units:
            if u.state != OFF:
                rec.spans.append((u.index, u.since_us, u.serving_us, max(end_us, u.since_us)))
        rec.spans.sort()
        return rec


def _log_row(rows: list, row: tuple, key: int) -> None:
    """Append ``row`` (its time first, its counts from ``key`` on, ``row[1:key]`` naming what
    they count) unless the same counts were logged last for it: a row of the same time and name
    is replaced."""
    name = row[1:key]
    k = len(rows) - 1
    while k >= 0 and rows[k][1:key] != name:
        k -= 1
    if k >= 0 and rows[k][0] == row[0]:
        rows[k] = row
    elif (k < 0 or rows[k][key:] != row[key:]) and len(rows) < MAX_CHANGES:
        rows.append(row)
