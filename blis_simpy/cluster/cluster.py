"""The cluster control plane: arrivals, admission, routing, in-flight accounting
(docs/control-plane.md).

One SimPy environment holds every event. The arrival process walks the pre-sorted request
list; each request then passes ``ClusterArrival → AdmissionDecision → RoutingDecision`` as
timed cluster events (keys of :mod:`blis_simpy.des`), and routing injects it into the
chosen instance. Policies are plain deciders that see :class:`RouterState` snapshots built
by a :class:`SnapshotProvider` (Immediate or Periodic refresh, INV-7); the in-flight count
of each instance is kept here, synchronously: +1 at routing, −1 when the instance reports
the request completed, dropped or timed out.

With a :class:`~blis_simpy.trace.DecisionTrace` attached, every admission call and every
routing decision is recorded (docs/metrics.md, "Decision trace").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from blis_simpy.admission.base import AdmissionPolicy
from blis_simpy.des import ADMISSION, CLUSTER_ARRIVAL, FOLLOWUP_ARRIVAL, ROUTING, SimEnv
from blis_simpy.engine.instance import Instance
from blis_simpy.engine.listener import InstanceListener
from blis_simpy.plugins import Pluggable, call_failure, plugin_error
from blis_simpy.request_view import as_view
from blis_simpy.routing.base import Router, as_index, decision_problem, shown
from blis_simpy.snapshot import InstanceView, RouterState, SnapshotProvider

log = logging.getLogger("blis_simpy.cluster")


@dataclass(slots=True)
class ControlPlaneCounters:
    """Where every request of the workload went (request conservation, INV-1)."""

    offered: int = 0            # requests in the workload
    arrived: int = 0            # ClusterArrival processed
    admitted: int = 0
    rejected_by_admission: int = 0
    routed: int = 0             # injected into an instance
    rejected_at_routing: int = 0
    shed_by_tier: dict[str, int] = field(default_factory=dict)
    #: SLO class ("" = none) -> ClusterArrivals processed (the offered requests of SLO attainment)
    arrived_by_class: dict[str, int] = field(default_factory=dict)


class Cluster(InstanceListener, Pluggable, family="cluster", name="standard"):
    """Instances on one shared clock behind admission and routing.

    Cluster classes are a registry (``cluster.implementation``): this one is ``standard``,
    :class:`~blis_simpy.cluster.pd.PDCluster` is ``pd`` (prefill/decode pools).
    """

    def __init__(self, env: SimEnv, instances: list[Instance], admission: AdmissionPolicy,
                 router: Router, *, admission_latency_us: int = 0, routing_latency_us: int = 0,
                 snapshot_refresh_interval_us: int = 0, trace=None):
        self.env = env
        self.instances = instances
        self.admission = admission
        self.router = router
        self.admission_latency_us = admission_latency_us
        self.routing_latency_us = routing_latency_us
        self.snapshots = SnapshotProvider(instances, snapshot_refresh_interval_us)
        #: read-only views of the instances for scorers (RouterState.views), by index
        self.views = tuple(InstanceView(inst) for inst in instances)
        self.trace = trace
        self.inflight = [0] * len(instances)
        #: the instances routing chooses among when no pool restricts it: all of them, or with
        #: an autoscaler the serving ones (:mod:`blis_simpy.cluster.autoscaler` replaces the list)
        self.routable = instances
        self.counters = ControlPlaneCounters()
        #: with PD pools: prefill sub-requests routed in place of their parents, and decode
        #: sub-requests injected after their transfer (always 0 here; see PDCluster)
        self.prefill_routed = 0
        self.decode_injected = 0
        self._n = len(instances)
        #: closed-loop sessions (docs/workloads.md): a SessionManager or None; see :meth:`session_done`
        self.sessions = None
        #: the gateway queue between admission and routing (cluster/gateway.py) or None
        self.gateway = None
        # Skipping the admission snapshots is invisible only when they are always fresh (a
        # periodic refresh at admission time changes what routing sees later).
        self._admission_blind = not admission.uses_snapshots and snapshot_refresh_interval_us == 0
        for inst in instances:
            inst.listener = self
        if 0 < env.horizon_us < admission_latency_us + routing_latency_us:
            log.warning("horizon %d us is shorter than admission + routing latency", env.horizon_us)

    # ------------------------------------------------------------------ arrivals
    def start(self, requests) -> None:
        """Start the arrival process over ``requests`` (sorted by arrival time)."""
        self.counters.offered += len(requests)
        self.env.process(self._arrivals(requests))

    def _arrivals(self, requests):
        """The arrival process: each ClusterArrival at its time, and, when no other event
        could come in between, the request's AdmissionDecision and RoutingDecision in the
        same process (:meth:`_on_arrival`). The next request is read before this one is
        handled (as the loop would right after) to know whether it arrives in the same µs."""
        env = self.env
        it = iter(requests)
        req = next(it, None)
        while req is not None:
            yield env.wake_at(req.arrival_us, CLUSTER_ARRIVAL)
            nxt = next(it, None)
            self._on_arrival(req, nxt is None or nxt.arrival_us != req.arrival_us)
            req = nxt

    def submit_followup(self, req) -> None:
        """A session follow-up: a ClusterArrival pushed after every pre-generated one."""
        self.counters.offered += 1
        self.env.call_at(req.arrival_us, FOLLOWUP_ARRIVAL, self._on_arrival, req)

    def client_arrival(self, req) -> None:
        """A closed-loop client's send (:mod:`blis_simpy.cluster.clients`), now: an offered
        request and its ClusterArrival, in the client's keyed event (then admission and
        routing as for a session follow-up)."""
        self.counters.offered += 1
        self._on_arrival(req)

    def _on_arrival(self, req, alone: bool = True) -> None:
        """ClusterArrival, then admission after the admission latency: in this event when
        that latency is 0, ``alone`` (no other pre-generated arrival in this µs) and nothing
        is queued before the AdmissionDecision's place (``SimEnv.quiet_through``: BLIS's
        order, with one event fewer); otherwise as the keyed AdmissionDecision event."""
        c = self.counters
        c.arrived += 1
        by_class = c.arrived_by_class
        by_class[req.slo_class] = by_class.get(req.slo_class, 0) + 1
        if self.gateway is not None:
            self.gateway.arrived(req)
        self.env.call_after(self.admission_latency_us, ADMISSION, self._on_admission, req, inline=alone)

    # ------------------------------------------------------------------ router state
    def router_state(self, req=None, among=None) -> RouterState:
        """Snapshots of the instances ``req`` may go to (index order) and the clock.

        ``among`` restricts the candidates to those instances (a PD pool). A request naming
        a model only sees instances serving that model (docs/control-plane.md).
        """
        now_us = self.env.now
        snap = self.snapshots.snapshot
        inflight = self.inflight
        insts = self.routable if among is None else among
        model = req.model if req is not None else ""
        if model:
            snaps = tuple(snap(inst, inflight[inst.index], now_us) for inst in insts
                          if not inst.model or inst.model == model)
        else:
            snaps = tuple(snap(inst, inflight[inst.index], now_us) for inst in insts)
        return RouterState(snaps, now_us, self.views)

    def set_serving(self, instances: list[Instance]) -> None:
        """Route only to ``instances`` (index order): the autoscaler's serving ones
        (:mod:`blis_simpy.cluster.autoscaler`)."""
        self.routable = instances

    def snapshot(self, inst: Instance):
        """The snapshot of one instance, as a policy would see it now."""
        return self.snapshots.snapshot(inst, self.inflight[inst.index], self.env.now)

    # ------------------------------------------------------------------ admission
    def _on_admission(self, req) -> None:
        if self._admission_blind:
            state = RouterState((), self.env.now)
        else:
            state = self.router_state(req)
        if self.admission._blis_builtin:
            ok, reason = self.admission.admit(req, state)
        else:
            ok, reason = self._plugin_admit(req, state)
        if self.trace is not None:
            self.trace.record_admission(req, state.clock_us, ok, reason)
        c = self.counters
        if not ok:
            c.rejected_by_admission += 1
            if self.admission.sheds_by_tier:
                tier = req.slo_class or "standard"
                c.shed_by_tier[tier] = c.shed_by_tier.get(tier, 0) + 1
            log.debug("admission rejected %s: %s", req.id, reason)
            if self.sessions is not None:
                self.session_rejected(req)
            return
        c.admitted += 1
        self._after_admission(req)

    def _plugin_admit(self, req, state) -> tuple[bool, str]:
        """A plugin admission policy's ``(admitted, reason)``, checked: an exception or any
        other result is that policy's one-line error."""
        pol = self.admission
        field = "cluster.admission.policy"
        try:
            res = pol.admit(as_view(req), state)
        except Exception as exc:
            raise call_failure(pol, "admit", exc, field=field) from None
        if not (isinstance(res, tuple) and len(res) == 2 and isinstance(res[1], str)
                and isinstance(res[0], (bool, np.bool_))):
            raise plugin_error(pol, f"returned {shown(res)} from admit(); expected a tuple "
                               "(admitted: bool, reason: str)", field=field)
        return bool(res[0]), res[1]

    def _after_admission(self, req) -> None:
        """An admitted request goes to routing after the routing latency: at once when that
        latency is 0 and nothing is queued before the RoutingDecision's place (as in
        :meth:`_on_arrival`), else as the keyed RoutingDecision event. With a gateway queue it
        enters the queue instead, which sends it on (:meth:`to_routing`)."""
        if self.gateway is not None:
            self.gateway.offer(req)
            return
        self.env.call_after(self.routing_latency_us, ROUTING, self._on_routing, req)

    def attach_gateway(self, policy, cfg) -> None:
        """Put a gateway queue (``cfg``: the scenario's ``cluster.gateway``) with ``policy``
        between admission and routing (docs/control-plane.md, "Gateway queue")."""
        from blis_simpy.cluster.gateway import Gateway
        self.gateway = Gateway(self.env, policy, route=self.to_routing, state=self.router_state,
                               on_shed=self._gateway_shed, max_depth=cfg.max_depth,
                               band_queue_limit=cfg.band_queue_limit,
                               band_inflight_limit=cfg.band_inflight_limit,
                               dispatch_tick_us=cfg.dispatch_tick_us, trace=self.trace)

    def _gateway_shed(self, req) -> None:
        """The gateway shed ``req``: a session ends, or a closed-loop client is freed, as on a
        rejection."""
        if self.sessions is not None:
            self.session_rejected(req)

    def to_routing(self, req) -> None:
        """A request the gateway sends on: routing after the routing latency."""
        self.env.call_after(self.routing_latency_us, ROUTING, self._on_gateway_routing, req)

    def _on_gateway_routing(self, req) -> None:
        self.gateway.routed()
        self.route(req, None, self.router)

    # ------------------------------------------------------------------ routing
    def _on_routing(self, req) -> None:
        self.route(req, None, self.router)

    def choose(self, req, among, router: Router, *, what: str = "request"):
        """Ask ``router`` for an instance among ``among`` (None = all); None if there is
        no candidate. Returns ``(instance, state, decision)``."""
        state = self.router_state(req, among)
        if not state.snapshots:
            log.warning("no routable instance for %s %s (model %r)", what, req.id, req.model)
            return None
        try:
            decision = router.route(req if router._blis_builtin else as_view(req), state)
        except Exception as exc:
            if router._blis_builtin:
                raise
            raise call_failure(router, "route", exc, field=f"{router.config_field}.policy") from None
        if router._blis_builtin:
            target = decision.target
            if not 0 <= target < self._n or not any(s.index == target for s in state.snapshots):
                raise ValueError(f"routing policy {router.name!r} returned instance index "
                                 f"{target}, not one of the {len(state.snapshots)} candidates")
        else:       # a plugin: its decision is checked (docs/extending.md)
            problem = decision_problem(decision, state)
            if problem is not None:
                raise plugin_error(router, problem, field=f"{router.config_field}.policy")
            target = as_index(decision.target)
        if decision.priority:
            req.priority = decision.priority
        return self.instances[target], state, decision

    def route(self, req, among, router: Router) -> Instance | None:
        """Standard routing (docs/control-plane.md): choose, trace, count in flight, inject, observe.

        When the chosen instance is a rank of a data-parallel engine, the engine's front
        door re-picks the rank (:meth:`~blis_simpy.engine.dp.DPEngine.pick`); the trace,
        the in-flight count and the router's ``observe`` see the rank actually used."""
        chosen = self.choose(req, among, router)
        if chosen is None:
            self.counters.rejected_at_routing += 1
            if self.gateway is not None:
                self.gateway.left(req)
            if self.sessions is not None:
                self.session_rejected(req)
            return None
        inst, state, decision = chosen
        if inst.dp_engine is not None:
            inst = inst.dp_engine.pick(inst)
        if self.trace is not None:
            self.trace.record_routing(req, state, decision, inst.id)
        self.inflight[inst.index] += 1
        self.counters.routed += 1
        inst.inject(req, self.env.now)
        self.tell_router(router, req, inst.index)
        return inst

    @staticmethod
    def tell_router(router: Router, req, index: int) -> None:
        """Tell ``router`` where ``req`` went; a plugin's failure there is its own error."""
        try:
            router.observe(req if router._blis_builtin else as_view(req), index)
        except Exception as exc:
            if router._blis_builtin:
                raise
            raise call_failure(router, "observe", exc, field=f"{router.config_field}.policy") from None

    # ------------------------------------------------------------------ listener
    def on_request_done(self, inst: Instance, req, tick_us: int) -> None:
        k = inst.index
        if self.inflight[k] > 0:
            self.inflight[k] -= 1
        else:
            log.warning("in-flight count of %s would go negative (clamped at 0)", inst.id)
        if self.gateway is not None:
            self.gateway.left(req)
        if self.sessions is not None:
            self.session_done(req, tick_us)

    def session_done(self, req, tick_us: int) -> None:
        """Closed-loop sessions and clients (docs/workloads.md): hand a terminal event (completed, timed out,
        dropped) to the session manager and submit its follow-ups as ClusterArrivals.

        Instances reach it through :meth:`on_request_done`; with PD, call it with the parent
        request at parent completion (divergences.md P9) — sub-requests carry no session ID, so
        the manager ignores them. Rejections (admission, routing) reach the manager's
        ``on_request_rejected`` instead: BLIS invokes no callback for them, so they never
        produce a follow-up; the session is only recorded as cancelled. No-op without a
        session manager.
        """
        if self.sessions is None:
            return
        for f in self.sessions.on_request_done(req, tick_us):
            self.submit_followup(f)

    def session_rejected(self, req) -> None:
        """A request rejected by admission or routing, now: the session manager records it (a
        session is cancelled; a closed-loop client is freed, :mod:`blis_simpy.cluster.clients`)."""
        self.sessions.on_request_rejected(req, self.env.now)
