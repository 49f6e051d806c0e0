"""The end-of-run report: its data, its JSON rendering and results files (docs/metrics.md).

A :class:`Report` holds everything printed at the end of a run: per-instance records, the
cluster aggregate (after any PD correction), admission/routing rejections, tier-shed counts,
the priority-policy name, and the optional fitness, PD and decision-trace summaries. Those
three optional parts are plain data (:class:`~blis_simpy.metrics.fitness.FitnessResult`,
:class:`PDMetrics`, :class:`TraceSummary`, or mappings with the same field names) that their
producers fill; the renderers only print them.

Renderers:

* :func:`~blis_simpy.metrics.blis_text.render_blis` — BLIS ``run``'s stdout, byte for byte
  (used for both ``run`` and ``replay``: replay also prints the
  ``Rejected Requests (Admission)`` / ``Rejected Requests (Routing)`` pair, see the
  conformance README).
* :func:`render_json` — one JSON document for pipes (schema below).
* :func:`~blis_simpy.metrics.tables.render_tables` — rich tables for a terminal.

``render_json`` schema (keys always present, in this order; ``null`` when a part is absent)::

    {
      "command": "run" | "replay",
      "num_instances": int,
      "cluster": Scope,                      # summary.scope_output: latencies in ms
      "instances": [Scope, ...],             # every instance, index order
      "anomaly_counters": {"priority_inversions", "hol_blocking_events",
                           "rejected_requests_admission", "shed_by_tier": {class: n},
                           "rejected_requests_routing", "dropped_unservable",
                           "length_capped_requests", "dropped_kv_allocations"},
      "kv_cache": {"preemption_rate", "cache_hit_rate", "kv_thrashing_rate"},
      "per_slo": {class: {"ttft": Distribution, "e2e": Distribution}},   # all classes
      "per_model": {model: {"model", "ttft", "e2e", "throughput_rps", "tokens_per_sec",
                            "total_requests"}},
      "fitness": {"score", "components": {key: value}} | null,
      "pd": {PDMetrics fields; distributions as objects} | null,
      "trace_summary": {TraceSummary fields} | null,
      "total_kv_blocks": int | [int, ...] | null,   # GPU KV blocks of every instance (DP rank);
                                                    # a list in instance order where they differ
      "kv_capacity": {KVCapacity pieces} | null,    # the auto-sized capacity of the deployment
      "request_accounting": {"offered", "completed", "still_queued", "still_running",
                             "still_in_control_plane", "still_in_queueing_delay", "not_arrived",
                             "dropped_unservable", "timed_out", "rejected_admission",
                             "rejected_routing"} | null   # where every offered request ended;
                                                          # all but "offered" add up to it
    }

With closed-loop sessions one more key follows: ``"sessions": {"total", "completed",
"cancelled_timeout", "cancelled_dropped", "cancelled_rejected", "horizon_interrupted",
"in_flight_at_horizon", "followup_requests"}`` (how the sessions ended; absent without sessions).
With vLLM's CPU offload tier (``engine.kv_cpu_gib > 0``) one more key follows: ``"kv_offload":
{"cluster": {counters}, "instances": [{counters}, ...]}`` (durations in ms; docs/metrics.md,
"CPU KV offload";
absent otherwise). With a gateway queue (``cluster.gateway``) one more key follows: ``"gateway": {"flow_key",
"entered", "dispatched", "shed", "shed_by_reason", "still_queued", "peak_depth", "wait":
Distribution, "per_flow": {flow: {...}}, "jain_fairness_index"}``
(:meth:`~blis_simpy.metrics.gateway.GatewayReport.to_dict`; docs/metrics.md, "Gateway queue";
absent otherwise). With ``--streaming-metrics`` one more key follows: ``"streaming_metrics": {"relative_accuracy":
0.01, "note": "..."}`` (the percentiles are DDSketch estimates, docs/metrics.md). When the
offered load exceeds what the deployment sustains, ``"saturation"`` follows
(:meth:`~blis_simpy.metrics.saturation.SaturationVerdict.to_dict`; absent otherwise).

Then, only when asked for (:func:`planning_part`; docs/metrics.md, "SLOs and goodput"):
``"slo"`` when an SLO target is set (:meth:`~blis_simpy.metrics.slo.SLOReport.to_dict`) and
``"deployment"`` (``{"total_gpus", "gpu_hour_usd", "cost_per_hour_usd",
"cost_per_million_output_tokens_usd"}``) when an SLO target or a GPU-hour price is known.
With an autoscaler (``cluster.autoscaler``) the last key is ``"autoscaling"``
(:mod:`blis_simpy.metrics.autoscale`: instance count over time, GPU-hours, cost, per-interval
SLO attainment); the ``--results-path`` file never carries it.

Every latency is in ms with the unit in its key (docs/metrics.md, "The JSON document").
Distribution objects are ``{"mean_ms", "p50_ms", "p95_ms", "p99_ms", "min_ms", "max_ms",
"count"}`` (:meth:`~blis_simpy.metrics.percentile.Distribution.to_dict_ms`; ``null``
statistics when empty); ``pd`` has ``prefill_throughput_rps``/``decode_throughput_rps`` and
``trace_summary`` ``mean_transfer_duration_ms``.
Numbers are written as Go would (:mod:`blis_simpy.metrics.gojson`).

:func:`write_results` writes a JSON file all-or-nothing (:mod:`blis_simpy.atomic`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property

from blis_simpy.metrics import gojson
from blis_simpy.metrics.cost import DeploymentCost
from blis_simpy.metrics.fitness import FitnessResult
from blis_simpy.metrics.percentile import Distribution
from blis_simpy.metrics.raw import (
    ModelMetrics,
    SLOMetrics,
    hol_blocking_events,
    per_model_metrics,
    preemption_rate,
    priority_inversions,
    slo_distributions,
)
from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.metrics.saturation import SaturationVerdict
from blis_simpy.metrics.slo import SLOReport
from blis_simpy.metrics.streaming import RELATIVE_ACCURACY, accuracy_note
from blis_simpy.metrics.summary import aggregate, scope_output

__all__ = [
    "AnomalyCounters",
    "PDMetrics",
    "Report",
    "gateway_part",
    "TraceSummary",
    "is_idle_ratio",
    "planning_part",
    "saturation_part",
    "render_json",
    "report_dict",
    "write_results",
]

FLOAT_MAX = sys.float_info.max


def is_idle_ratio(r: float) -> bool:
    """``PDMetrics.load_imbalance_ratio`` means "one pool idle" (printed ``inf``)."""
    return math.isinf(r) or r >= FLOAT_MAX


# ------------------------------------------------------------------- optional sections
@dataclass
class PDMetrics:
    """``=== PD Metrics ===`` (docs/disaggregation.md). Throughputs in sub-requests/s, times in µs."""

    disaggregated_count: int = 0
    dropped_at_decode_kv: int = 0
    prefill_throughput: float = 0.0
    decode_throughput: float = 0.0
    #: ``max/min`` of the pool throughputs; 1.0 when both are 0; ``FLOAT_MAX`` (or inf)
    #: when exactly one is 0 — printed as ``inf (one pool idle)``
    load_imbalance_ratio: float = 1.0
    parent_ttft: Distribution = field(default_factory=Distribution)
    transfer_duration: Distribution = field(default_factory=Distribution)
    #: ``--pd-transfer-contention``: print the two contention lines (even when 0)
    contention: bool = False
    peak_concurrent_transfers: int = 0
    mean_transfer_queue_depth: float = 0.0

    def to_dict(self) -> dict:
        """Our JSON form: throughputs ``_rps`` (sub-requests/s), times in ms."""
        ratio = self.load_imbalance_ratio
        return {
            "disaggregated_count": self.disaggregated_count,
            "dropped_at_decode_kv": self.dropped_at_decode_kv,
            "prefill_throughput_rps": self.prefill_throughput,
            "decode_throughput_rps": self.decode_throughput,
            "load_imbalance_ratio": FLOAT_MAX if math.isinf(ratio) else ratio,
            "parent_ttft": self.parent_ttft.to_dict_ms(),
            "transfer_duration": self.transfer_duration.to_dict_ms(),
            "contention": self.contention,
            "peak_concurrent_transfers": self.peak_concurrent_transfers,
            "mean_transfer_queue_depth": self.mean_transfer_queue_depth,
        }


@dataclass
class TraceSummary:
    """``=== Trace Summary ===`` (docs/metrics.md); the PD part prints only with disaggregation
    records (``disaggregation_count > 0``). ``mean_transfer_duration`` in µs."""

    total_decisions: int = 0
    admitted_count: int = 0
    rejected_count: int = 0
    unique_targets: int = 0
    target_distribution: dict[str, int] = field(default_factory=dict)
    mean_regret: float = 0.0
    max_regret: float = 0.0
    disaggregation_count: int = 0
    disaggregated_count: int = 0
    kv_transfer_count: int = 0
    mean_transfer_duration: float = 0.0
    #: PD: the instances the prefill and decode pools' routing chose ({"prefill": {instance:
    #: n}, "decode": {...}}); BLIS's text counts standard routing only (``unique_targets``)
    pool_target_distribution: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def targets_any_routing(self) -> int:
        """Instances chosen by any routing, the PD pools' included (BLIS's text prints
        ``unique_targets``: standard routing only, 0 in a PD run)."""
        return len(set(self.target_distribution).union(*self.pool_target_distribution.values()))

    def to_dict(self) -> dict:
        """Our JSON form: the fields in order, ``mean_transfer_duration_ms`` in ms, and
        ``unique_targets`` counting the pools' targets too (:attr:`targets_any_routing`, as the
        table does)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["unique_targets"] = self.targets_any_routing
        d["target_distribution"] = {k: self.target_distribution[k]
                                    for k in sorted(self.target_distribution)}
        return {("mean_transfer_duration_ms" if k == "mean_transfer_duration" else k):
                (v / 1000 if k == "mean_transfer_duration" else v) for k, v in d.items()}


@dataclass(frozen=True)
class AnomalyCounters:
    """``=== Anomaly Counters ===`` values (docs/metrics.md, "Anomaly counters")."""

    priority_inversions: int = 0
    hol_blocking_events: int = 0
    rejected_requests_admission: int = 0
    shed_by_tier: dict[str, int] = field(default_factory=dict)
    rejected_requests_routing: int = 0
    dropped_unservable: int = 0
    length_capped_requests: int = 0
    #: PD parents dropped at decode KV allocation (divergences.md P12; printed when > 0)
    dropped_kv_allocations: int = 0

    def any(self) -> bool:
        return any((self.priority_inversions, self.hol_blocking_events,
                    self.rejected_requests_admission, self.rejected_requests_routing,
                    self.dropped_unservable, self.length_capped_requests,
                    self.dropped_kv_allocations))

    def to_dict(self) -> dict:
        return {
            "priority_inversions": self.priority_inversions,
            "hol_blocking_events": self.hol_blocking_events,
            "rejected_requests_admission": self.rejected_requests_admission,
            "shed_by_tier": {k: self.shed_by_tier[k] for k in sorted(self.shed_by_tier)},
            "rejected_requests_routing": self.rejected_requests_routing,
            "dropped_unservable": self.dropped_unservable,
            "length_capped_requests": self.length_capped_requests,
            "dropped_kv_allocations": self.dropped_kv_allocations,
        }


def _coerce(value, cls):
    """A mapping with ``cls``'s field names becomes ``cls``; instances pass through."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        kw = dict(value)
        for k in ("parent_ttft", "transfer_duration"):
            if cls is PDMetrics and isinstance(kw.get(k), Mapping):
                kw[k] = Distribution(**kw[k])
        return cls(**kw)
    raise TypeError(f"expected {cls.__name__} or a mapping, got {type(value).__name__}")


# ---------------------------------------------------------------------------- Report
@dataclass
class Report:
    """Everything printed at the end of a run.

    ``cluster`` defaults to :func:`~blis_simpy.metrics.summary.aggregate` of ``instances``
    (pass it explicitly when a PD correction was applied); ``num_instances`` defaults to
    ``len(instances)``. The derived sections are computed once, on first use.
    """

    instances: list[InstanceMetrics]
    cluster: InstanceMetrics | None = None
    num_instances: int = -1
    rejected_by_admission: int = 0
    rejected_at_routing: int = 0
    shed_by_tier: dict[str, int] = field(default_factory=dict)
    priority_policy: str = "constant"
    is_replay: bool = False
    fitness: FitnessResult | None = None
    trace_summary: TraceSummary | None = None
    pd: PDMetrics | None = None
    #: KV blocks of the instances (one number when they agree) and the auto-sized capacity
    #: pieces (:meth:`blis_simpy.kv.vllm_capacity.KVCapacity.to_dict`); None when unknown
    total_kv_blocks: int | list[int] | None = None
    kv_capacity: dict | None = None
    #: SLO attainment and goodput (None: no SLO target) and the deployment's GPUs and cost
    #: (None: not computed); see :func:`planning_part`
    slo: SLOReport | None = None
    deployment: DeploymentCost | None = None
    #: how the closed-loop sessions ended (:class:`~blis_simpy.workload.sessions.SessionCounters`;
    #: None without sessions); see :func:`sessions_part`
    sessions: object | None = None
    #: where every offered request is at the end of the run (the balance the simulation
    #: checks, :class:`~blis_simpy.cluster.invariants.RequestEndStates` as a dict); None: unknown
    request_accounting: dict[str, int] | None = None
    #: the CPU offload tier's counters per instance (``OffloadKVCache.offload_stats``); None:
    #: no offload tier; see :func:`offload_part`
    kv_offload: list[dict] | None = None
    #: the gateway queue's results (:class:`~blis_simpy.metrics.gateway.GatewayReport`); None:
    #: no gateway queue; see :func:`gateway_part`
    gateway: object | None = None
    #: what the autoscaler did (:class:`~blis_simpy.metrics.autoscale.AutoscaleReport`); None:
    #: no autoscaler; see :func:`autoscaling_part`
    autoscaling: object | None = None
    #: the saturation test (:class:`~blis_simpy.metrics.saturation.SaturationVerdict`); None:
    #: not run; shown only when it fires (:func:`saturation_part`)
    saturation: SaturationVerdict | None = None

    def __post_init__(self) -> None:
        self.instances = list(self.instances)
        if self.cluster is None:
            self.cluster = aggregate(self.instances)
        if self.num_instances < 0:
            self.num_instances = len(self.instances)
        if isinstance(self.fitness, Mapping):
            self.fitness = FitnessResult(score=self.fitness["score"],
                                         components=dict(self.fitness.get("components", {})))
        self.trace_summary = _coerce(self.trace_summary, TraceSummary)
        self.pd = _coerce(self.pd, PDMetrics)

    @cached_property
    def anomalies(self) -> AnomalyCounters:
        return AnomalyCounters(
            priority_inversions=priority_inversions(self.instances, self.priority_policy),
            hol_blocking_events=hol_blocking_events(self.instances),
            rejected_requests_admission=self.rejected_by_admission,
            shed_by_tier=dict(self.shed_by_tier),
            rejected_requests_routing=self.rejected_at_routing,
            dropped_unservable=self.cluster.dropped_unservable,
            length_capped_requests=self.cluster.length_capped_requests,
            dropped_kv_allocations=self.pd.dropped_at_decode_kv if self.pd else 0,
        )

    @cached_property
    def kv_rates(self) -> tuple[float, float, float]:
        """``(preemption_rate, cache_hit_rate, kv_thrashing_rate)``."""
        c = self.cluster
        return preemption_rate(c), c.cache_hit_rate, c.kv_thrashing_rate

    @cached_property
    def per_slo(self) -> dict[str, SLOMetrics]:
        return slo_distributions(self.cluster)

    @cached_property
    def per_model(self) -> dict[str, ModelMetrics]:
        return per_model_metrics(self.cluster)


# ------------------------------------------------------------------------------- JSON
def report_dict(report: Report) -> dict:
    """The structured document behind :func:`render_json` (see the module docstring)."""
    pr, hit, thr = report.kv_rates
    return {
        "command": "replay" if report.is_replay else "run",
        "num_instances": report.num_instances,
        "cluster": scope_output(report.cluster),
        "instances": [scope_output(m) for m in report.instances],
        "anomaly_counters": report.anomalies.to_dict(),
        "kv_cache": {"preemption_rate": pr, "cache_hit_rate": hit, "kv_thrashing_rate": thr},
        "per_slo": {k: v.to_dict() for k, v in report.per_slo.items()},
        "per_model": {k: v.to_dict() for k, v in report.per_model.items()},
        "fitness": report.fitness.to_dict() if report.fitness is not None else None,
        "pd": report.pd.to_dict() if report.pd is not None else None,
        "trace_summary": (report.trace_summary.to_dict()
                          if report.trace_summary is not None else None),
        "total_kv_blocks": report.total_kv_blocks,
        "kv_capacity": report.kv_capacity,
        "request_accounting": report.request_accounting,
    } | (sessions_part(report) | offload_part(report) | gateway_part(report) | _streaming_part(report)
         | saturation_part(report) | planning_part(report) | autoscaling_part(report))


def gateway_part(report: Report) -> dict:
    """``"gateway"`` with a gateway queue (absent otherwise)."""
    return {} if report.gateway is None else {"gateway": report.gateway.to_dict()}


def autoscaling_part(report: Report) -> dict:
    """``"autoscaling"`` with an autoscaler (absent otherwise): instance count over time,
    GPU-hours and cost, per-interval SLO attainment (docs/metrics.md, "Autoscaling")."""
    a = report.autoscaling
    return {"autoscaling": a.to_dict()} if a is not None else {}


def saturation_part(report: Report) -> dict:
    """``"saturation"`` when the saturation test fired (absent otherwise, so a run that
    sustains its load prints the document it always did; docs/metrics.md, "Saturation")."""
    v = report.saturation
    if v is None or not v.saturated:
        return {}
    return {"saturation": v.to_dict()}


def offload_part(report: Report) -> dict:
    """``"kv_offload"`` with vLLM's CPU offload tier (absent otherwise): the counters of every
    instance and their cluster totals (``peak_cpu_blocks``: the largest instance peak)."""
    per = report.kv_offload
    if not per:
        return {}
    per = [{(k[:-3] + "_ms" if k.endswith("_us") else k): (v / 1000 if k.endswith("_us") else v)
            for k, v in d.items()} for d in per]           # durations in ms, as every JSON key
    total = {k: (max if k == "peak_cpu_blocks" else sum)(d[k] for d in per) for k in per[0]}
    return {"kv_offload": {"cluster": total, "instances": per}}


def sessions_part(report: Report) -> dict:
    """``"sessions"`` when the run had closed-loop sessions (absent otherwise)."""
    s = report.sessions
    if s is None:
        return {}
    return {"sessions": {"total": s.sessions, "completed": s.completed,
                         "cancelled_timeout": s.cancelled_timeout, "cancelled_dropped": s.cancelled_dropped,
                         "cancelled_rejected": s.cancelled_rejected,
                         "horizon_interrupted": s.horizon_interrupted,
                         "in_flight_at_horizon": s.in_flight_at_horizon, "followup_requests": s.followups}}


def _streaming_part(report: Report) -> dict:
    """``--streaming-metrics`` only: how approximate the percentiles are (absent otherwise)."""
    if report.cluster.streaming is None:
        return {}
    return {"streaming_metrics": {"relative_accuracy": RELATIVE_ACCURACY, "note": accuracy_note()}}


def planning_part(report: Report) -> dict:
    """``"slo"`` when an SLO target is set; ``"deployment"`` when an SLO target or a GPU-hour
    price is known (absent otherwise, so BLIS's documents are unchanged)."""
    out: dict = {}
    if report.slo is not None:
        out["slo"] = report.slo.to_dict()
    dep = report.deployment
    if dep is not None and (report.slo is not None or dep.priced):
        out["deployment"] = dep.to_dict()
    return out


def render_json(report: Report) -> str:
    """One JSON document (2-space indent, trailing newline) for pipes."""
    return gojson.dumps(report_dict(report)) + "\n"


# ------------------------------------------------------------------------------ files
def write_results(path, obj, *, field: str | None = "--results-path", batch=None) -> None:
    """Write ``obj`` as Go-style indented JSON to ``path`` all-or-nothing
    (:mod:`blis_simpy.atomic`: a temporary file beside it, fsync'ed and renamed over it; a
    device such as ``/dev/null`` is written through, not replaced).

    With ``batch`` (a :class:`~blis_simpy.atomic.Batch`) the file is staged and commits with
    the batch; otherwise now. On any failure ``path`` is untouched and no temporary file is
    left; a write error is a ConfigError naming ``path`` and ``field``. Like Go's
    ``os.WriteFile(path, MarshalIndent(...), 0644)``, no trailing newline is written and the
    mode is 0644 minus the umask.
    """
    from blis_simpy.atomic import atomic_write
    data = gojson.dumps(obj).encode("utf-8")
    with atomic_write(path, batch=batch, field=field, what="cannot write results",
                      fsync=True) as f:
        f.write(data)
