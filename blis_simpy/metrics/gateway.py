"""The gateway queue's results (docs/metrics.md, "Gateway queue"): shed requests, queue wait,
depth, and per-flow (tenant or SLO class) throughput, SLO attainment and Jain's fairness index.

**Jain's fairness index** (R. Jain, D. Chiu, W. Hawe, "A Quantitative Measure of Fairness and
Discrimination for Resource Allocation in Shared Computer Systems", DEC-TR-301, 1984) of
``x_1 … x_n`` is ``(Σ x_i)² / (n · Σ x_i²)``: 1 when every ``x_i`` is equal, ``1/n`` when one
flow gets everything. Here ``x_i`` is flow i's **weight-normalised throughput**: its completed
requests per second divided by its fair-share weight (1 without fair share), over the flows
that offered at least one request. So a 2:1 weighted share that the queue delivers exactly
scores 1. None when no flow completed anything.

Per-flow SLO attainment is the SLO section's (docs/metrics.md, "SLOs and goodput"): requests
of the flow meeting every target of their class over the flow's offered requests (those that
arrived at the cluster); None without an SLO target or under ``--streaming-metrics`` (the
per-request latencies are not kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blis_simpy.metrics.percentile import Distribution

__all__ = ["FlowResult", "GatewayReport", "gateway_report", "jain_index"]


def jain_index(xs) -> float | None:
    """Jain's fairness index of the non-negative values ``xs``; None when all are 0 or none."""
    xs = [float(x) for x in xs]
    sq = sum(x * x for x in xs)
    if not xs or sq == 0.0:
        return None
    s = sum(xs)
    return s * s / (len(xs) * sq)


@dataclass
class FlowResult:
    """One flow: its weight, requests arrived (offered to the cluster), entered the gateway,
    sent on, shed and completed, completed per second, that over its weight, its mean queue
    wait (µs) and its SLO attainment (%, None: not judged)."""

    weight: float
    arrived: int
    entered: int
    dispatched: int
    shed: int
    completed: int
    throughput_rps: float
    normalised_throughput: float
    mean_wait_us: float
    slo_attainment_pct: float | None

    def to_dict(self) -> dict:
        return {"weight": self.weight, "arrived": self.arrived, "entered": self.entered,
                "dispatched": self.dispatched, "shed": self.shed, "completed": self.completed,
                "throughput_rps": self.throughput_rps,
                "normalised_throughput": self.normalised_throughput,
                "mean_wait_ms": self.mean_wait_us / 1000,
                "slo_attainment_pct": self.slo_attainment_pct}


@dataclass
class GatewayReport:
    """The ``"gateway"`` part of the JSON document and the table's "Gateway queue"."""

    flow_key: str
    entered: int
    dispatched: int
    shed: int
    still_queued: int
    peak_depth: int
    shed_by_reason: dict[str, int]
    wait: Distribution
    flows: dict[str, FlowResult] = field(default_factory=dict)
    jain_index: float | None = None

    def to_dict(self) -> dict:
        return {"flow_key": self.flow_key, "entered": self.entered, "dispatched": self.dispatched,
                "shed": self.shed,
                "shed_by_reason": {k: self.shed_by_reason[k] for k in sorted(self.shed_by_reason)},
                "still_queued": self.still_queued, "peak_depth": self.peak_depth,
                "wait": self.wait.to_dict_ms(),
                "per_flow": {k: v.to_dict() for k, v in self.flows.items()},
                "jain_fairness_index": self.jain_index}


def gateway_report(counters, *, flow_key: str, weight, duration_s: float,
                   met_by_flow: dict[str, int] | None) -> GatewayReport:
    """The report of a finished gateway: ``counters`` its
    :class:`~blis_simpy.cluster.gateway.GatewayCounters`, ``weight(flow)`` a flow's weight,
    ``duration_s`` the simulated time of the throughputs, ``met_by_flow`` the requests of each
    flow meeting every SLO target (None: not judged)."""
    c = counters
    flows = {}
    waits: dict[str, list[int]] = {}
    for f, w in zip(c.dispatched_flows, c.waits_us, strict=True):
        waits.setdefault(f, []).append(w)
    names = sorted(set(c.arrived_by_flow) | set(c.offered_by_flow))
    for f in names:
        done = c.completed_by_flow[f]
        rps = done / duration_s if duration_s > 0 else 0.0
        w = float(weight(f))
        arrived = c.arrived_by_flow[f]
        att = None
        if met_by_flow is not None:
            att = 100.0 * met_by_flow.get(f, 0) / arrived if arrived else 0.0
        ws = waits.get(f, [])
        flows[f] = FlowResult(w, arrived, c.offered_by_flow[f], c.dispatched_by_flow[f],
                              c.shed_by_flow[f], done, rps, rps / w,
                              sum(ws) / len(ws) if ws else 0.0, att)
    jain = jain_index(r.normalised_throughput for r in flows.values() if r.arrived)
    return GatewayReport(flow_key, c.offered, c.dispatched, c.shed, c.queued, c.peak_depth,
                         dict(c.shed_by_reason), Distribution.from_values(c.waits_us), flows, jain)
