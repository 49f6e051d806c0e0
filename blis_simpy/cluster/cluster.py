"""The cluster control plane: arrivals, admission, routing, in-flight accounting (spec/05).

One SimPy environment holds every event. The arrival process walks the pre-sorted request
list; each request then passes ``ClusterArrival → AdmissionDecision → RoutingDecision`` as
timed cluster events (keys of :mod:`blis_simpy.des`), and routing injects it into the
chosen instance. Policies are plain deciders that see :class:`RouterState` snapshots.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from blis_simpy.admission.base import AdmissionPolicy
from blis_simpy.cluster.snapshot import InstanceSnapshot, RouterState
from blis_simpy.des import ADMISSION, CLUSTER_ARRIVAL, FOLLOWUP_ARRIVAL, ROUTING, SimEnv
from blis_simpy.engine.instance import Instance, InstanceListener
from blis_simpy.routing.base import Router

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


class Cluster(InstanceListener):
    """Instances on one shared clock behind admission and routing."""

    def __init__(self, env: SimEnv, instances: list[Instance], admission: AdmissionPolicy,
                 router: Router, *, admission_latency_us: int = 0, routing_latency_us: int = 0):
        self.env = env
        self.instances = instances
        self.admission = admission
        self.router = router
        self.admission_latency_us = admission_latency_us
        self.routing_latency_us = routing_latency_us
        self.inflight = [0] * len(instances)
        self.counters = ControlPlaneCounters()
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
        env = self.env
        for req in requests:
            yield env.wake_at(req.arrival_us, CLUSTER_ARRIVAL)
            self._on_arrival(req)

    def submit_followup(self, req) -> None:
        """A session follow-up: a ClusterArrival pushed after every pre-generated one."""
        self.counters.offered += 1
        self.env.call_at(req.arrival_us, FOLLOWUP_ARRIVAL, self._on_arrival, req)

    def _on_arrival(self, req) -> None:
        self.counters.arrived += 1
        self.env.call_at(self.env.now + self.admission_latency_us, ADMISSION, self._on_admission, req)

    # ------------------------------------------------------------------ admission
    def router_state(self, req=None) -> RouterState:
        snaps = []
        model = req.model if req is not None else ""
        for inst in self.instances:
            if model and inst.model and inst.model != model:
                continue
            snaps.append(self.snapshot(inst))
        return RouterState(tuple(snaps), self.env.now)

    def snapshot(self, inst: Instance) -> InstanceSnapshot:
        kv = inst.kv
        return InstanceSnapshot(
            id=inst.id, index=inst.index, queue_depth=len(inst.waitq),
            batch_size=len(inst.running), kv_utilization=kv.used / kv.total_blocks,
            free_kv_blocks=kv.total_blocks - kv.used, cache_hit_rate=kv.cache_hit_rate(),
            in_flight_requests=self.inflight[inst.index], model=inst.model)

    def _on_admission(self, req) -> None:
        state = self.router_state(req)
        ok, reason = self.admission.admit(req, state)
        if not ok:
            self.counters.rejected_by_admission += 1
            log.debug("admission rejected %s: %s", req.id, reason)
            return
        self.counters.admitted += 1
        self.env.call_at(self.env.now + self.routing_latency_us, ROUTING, self._on_routing, req)

    # ------------------------------------------------------------------ routing
    def _on_routing(self, req) -> None:
        state = self.router_state(req)
        if not state.snapshots:
            log.warning("no routable instance for %s", req.id)
            self.counters.rejected_at_routing += 1
            return
        decision = self.router.route(req, state)
        target = decision.target
        if not 0 <= target < len(self.instances):
            raise ValueError(f"router returned invalid instance index {target}")
        if decision.priority:
            req.priority = decision.priority
        self.inflight[target] += 1
        self.counters.routed += 1
        self.instances[target].inject(req, self.env.now)
        self.router.observe(req, target)

    # ------------------------------------------------------------------ listener
    def on_request_done(self, inst: Instance, req, tick_us: int) -> None:
        k = inst.index
        if self.inflight[k] > 0:
            self.inflight[k] -= 1
        else:
            log.warning("in-flight count of %s would go negative", inst.id)
