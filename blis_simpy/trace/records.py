"""Decision-trace records (docs/metrics.md, "Decision trace"), appended in event order by the cluster.

Times are integer µs. ``scores`` is a copy of the policy's score map (higher = better) or
``None``; ``candidates`` are the top-K counterfactual alternatives
(:mod:`blis_simpy.trace.counterfactual`) and ``regret`` = best score − chosen score (≥ 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class AdmissionRecord:
    request_id: str
    clock_us: int
    admitted: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class GatewayRecord:
    """A gateway-queue decision (docs/control-plane.md, "Gateway queue"): ``action`` is
    ``queued`` (the request entered the queue), ``dispatched`` (it left for the router after
    ``wait_us``) or ``shed`` (``reason``: queue_full, band_full or displaced); ``queue_depth``
    is the number of queued requests after the decision."""

    request_id: str
    clock_us: int
    action: str
    flow: str
    band: int
    queue_depth: int
    reason: str = ""
    wait_us: int = 0


@dataclass(frozen=True, slots=True)
class Candidate:
    """One counterfactual alternative: an instance, its score and what the router saw."""

    instance_id: str
    score: float
    queue_depth: int
    batch_size: int
    in_flight_requests: int
    kv_utilization: float
    free_kv_blocks: int


@dataclass(frozen=True, slots=True)
class RoutingRecord:
    """A standard routing decision (also PD-local routing)."""

    request_id: str
    clock_us: int
    chosen_instance: str
    reason: str = ""
    scores: dict[str, float] | None = None
    candidates: tuple[Candidate, ...] = ()
    regret: float = 0.0


@dataclass(frozen=True, slots=True)
class DisaggregationRecord:
    request_id: str
    clock_us: int
    disaggregate: bool


@dataclass(frozen=True, slots=True)
class PoolRoutingRecord:
    """Prefill- or decode-pool routing of a disaggregated request's sub-request."""

    parent_request_id: str
    clock_us: int
    chosen_instance: str
    scores: dict[str, float] | None = None
    candidates: tuple[Candidate, ...] = ()
    regret: float = 0.0


@dataclass(frozen=True, slots=True)
class KVTransferRecord:
    parent_request_id: str
    transfer_start_time_us: int
    transfer_duration_us: int
    num_kv_blocks: int
    prefill_instance_id: str
    decode_instance_id: str


@dataclass
class TraceRecords:
    """Every record of one run, by kind, each list in event order."""

    admissions: list[AdmissionRecord] = field(default_factory=list)
    #: with a gateway queue only (empty otherwise)
    gateway: list[GatewayRecord] = field(default_factory=list)
    routings: list[RoutingRecord] = field(default_factory=list)
    disaggregations: list[DisaggregationRecord] = field(default_factory=list)
    prefill_routings: list[PoolRoutingRecord] = field(default_factory=list)
    decode_routings: list[PoolRoutingRecord] = field(default_factory=list)
    kv_transfers: list[KVTransferRecord] = field(default_factory=list)
