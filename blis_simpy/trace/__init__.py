"""Decision traces (docs/metrics.md, "Decision trace"): records, counterfactual regret, summary.

``--trace-level decisions`` makes the cluster keep a :class:`DecisionTrace`: one
:class:`AdmissionRecord` per admission call and one :class:`RoutingRecord` per routing
decision, with the top-K counterfactual candidates (``--counterfactual-k``) and the regret
of the choice. :func:`summarize` condenses it for ``--summarize-trace``.
"""

from __future__ import annotations

from blis_simpy.trace.counterfactual import counterfactual
from blis_simpy.trace.records import (
    AdmissionRecord,
    Candidate,
    DisaggregationRecord,
    GatewayRecord,
    KVTransferRecord,
    PoolRoutingRecord,
    RoutingRecord,
    TraceRecords,
)
from blis_simpy.trace.summary import summarize

TRACE_LEVELS = ("none", "decisions")


class DecisionTrace(TraceRecords):
    """The in-memory trace of one run; ``k`` = number of counterfactual candidates."""

    def __init__(self, k: int = 0):
        super().__init__()
        if k < 0:
            raise ValueError(f"counterfactual k must be >= 0, got {k}")
        self.k = k

    def record_admission(self, req, clock_us: int, admitted: bool, reason: str) -> None:
        self.admissions.append(AdmissionRecord(req.id, clock_us, admitted, reason))

    def record_gateway(self, req_id: str, clock_us: int, action: str, entry, queue_depth: int,
                       reason: str = "", wait_us: int = 0) -> None:
        """A gateway-queue decision on the queued ``entry`` (:class:`GatewayRecord`)."""
        self.gateway.append(GatewayRecord(req_id, clock_us, action, entry.flow, entry.band,
                                          queue_depth, reason, wait_us))

    def record_routing(self, req, state, decision, chosen_id: str) -> None:
        scores = dict(decision.scores) if decision.scores is not None else None
        cands, regret = counterfactual(state.snapshots, scores, chosen_id, self.k)
        self.routings.append(RoutingRecord(req.id, state.clock_us, chosen_id, decision.reason,
                                           scores, cands, regret))

    def record_disaggregation(self, req, clock_us: int, disaggregate: bool) -> None:
        self.disaggregations.append(DisaggregationRecord(req.id, clock_us, disaggregate))

    def record_pool_routing(self, pool: str, parent_id: str, state, decision, chosen_id: str) -> None:
        """A prefill- or decode-pool routing decision (``pool`` = "prefill" or "decode")."""
        scores = dict(decision.scores) if decision.scores is not None else None
        cands, regret = counterfactual(state.snapshots, scores, chosen_id, self.k)
        rec = PoolRoutingRecord(parent_id, state.clock_us, chosen_id, scores, cands, regret)
        (self.prefill_routings if pool == "prefill" else self.decode_routings).append(rec)

    def record_kv_transfer(self, parent) -> None:
        duration = parent.transfer_complete_us - parent.transfer_start_us
        if duration < 0:
            duration = 0
        self.kv_transfers.append(KVTransferRecord(
            parent.id, parent.transfer_start_us, duration, parent.num_kv_blocks,
            parent.prefill_instance, parent.decode_instance))

    def summary(self):
        return summarize(self)


__all__ = [
    "TRACE_LEVELS", "AdmissionRecord", "Candidate", "DecisionTrace", "DisaggregationRecord",
    "GatewayRecord", "KVTransferRecord", "PoolRoutingRecord", "RoutingRecord", "TraceRecords", "counterfactual",
    "summarize",
]
