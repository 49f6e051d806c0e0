"""The end-of-run report and its three renderings (spec/08 §4–§5).

A :class:`Report` holds everything printed at the end of a run: per-instance records, the
cluster aggregate (after any PD correction), admission/routing rejections, tier-shed counts,
the priority-policy name, and the optional fitness, PD and decision-trace summaries. Those
three optional parts are plain data (:class:`~blis_simpy.metrics.summary.FitnessResult`,
:class:`PDMetrics`, :class:`TraceSummary`, or mappings with the same field names) that their
producers fill; this module only prints them.

Renderers:

* :func:`render_blis` — BLIS ``run``'s stdout, byte for byte (used for both ``run`` and
  ``replay``: replay also prints the ``Rejected Requests (Admission)`` /
  ``Rejected Requests (Routing)`` pair, see the conformance README).
* :func:`render_json` — one JSON document for pipes (schema below).
* :func:`render_tables` — rich tables for a terminal.

``render_json`` schema (keys always present, in this order; ``null`` when a part is absent)::

    {
      "command": "run" | "replay",
      "num_instances": int,
      "cluster": MetricsOutput,              # spec/08 §4, without "requests"
      "instances": [MetricsOutput, ...],     # every instance, index order
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
      "trace_summary": {TraceSummary fields} | null
    }

Distribution objects are ``{"mean", "p50", "p95", "p99", "min", "max", "count"}`` in µs.
Numbers are written as Go would (:mod:`blis_simpy.metrics.gojson`).

:func:`write_results` writes a JSON file atomically (temporary file + ``os.replace``).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property

from blis_simpy.metrics import gojson
from blis_simpy.metrics.percentile import Distribution
from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.metrics.summary import (
    FitnessResult,
    ModelMetrics,
    SLOMetrics,
    aggregate,
    hol_blocking_events,
    metrics_output,
    per_model_metrics,
    preemption_rate,
    priority_inversions,
    slo_distributions,
)

__all__ = [
    "AnomalyCounters",
    "PDMetrics",
    "Report",
    "TraceSummary",
    "render_blis",
    "render_json",
    "render_tables",
    "write_results",
]

FLOAT_MAX = sys.float_info.max


# ------------------------------------------------------------------- optional sections
@dataclass
class PDMetrics:
    """``=== PD Metrics ===`` (spec/06 §9). Throughputs in sub-requests/s, times in µs."""

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
        ratio = self.load_imbalance_ratio
        return {
            "disaggregated_count": self.disaggregated_count,
            "dropped_at_decode_kv": self.dropped_at_decode_kv,
            "prefill_throughput": self.prefill_throughput,
            "decode_throughput": self.decode_throughput,
            "load_imbalance_ratio": FLOAT_MAX if math.isinf(ratio) else ratio,
            "parent_ttft": self.parent_ttft.to_dict(),
            "transfer_duration": self.transfer_duration.to_dict(),
            "contention": self.contention,
            "peak_concurrent_transfers": self.peak_concurrent_transfers,
            "mean_transfer_queue_depth": self.mean_transfer_queue_depth,
        }


@dataclass
class TraceSummary:
    """``=== Trace Summary ===`` (spec/08 §6); the PD part prints only with disaggregation
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

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["target_distribution"] = {k: self.target_distribution[k]
                                    for k in sorted(self.target_distribution)}
        return d


@dataclass(frozen=True)
class AnomalyCounters:
    """``=== Anomaly Counters ===`` values (spec/08 §5 item 4)."""

    priority_inversions: int = 0
    hol_blocking_events: int = 0
    rejected_requests_admission: int = 0
    shed_by_tier: dict[str, int] = field(default_factory=dict)
    rejected_requests_routing: int = 0
    dropped_unservable: int = 0
    length_capped_requests: int = 0
    #: PD parents dropped at decode KV allocation ([SEED] line, printed when > 0)
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


# ------------------------------------------------------------------------ BLIS stdout
def _metrics_block(m: InstanceMetrics) -> list[str]:
    return ["=== Simulation Metrics ===", gojson.dumps(metrics_output(m, include_requests=False))]


def _fitness_lines(f: FitnessResult) -> list[str]:
    lines = ["=== Fitness Evaluation ===", f"Score: {f.score:.6f}"]
    lines += [f"  {k}: {f.components[k]:.6f}" for k in sorted(f.components)]
    return lines


def _anomaly_lines(a: AnomalyCounters) -> list[str]:
    lines = ["=== Anomaly Counters ===",
             f"Priority Inversions: {a.priority_inversions}",
             f"HOL Blocking Events: {a.hol_blocking_events}",
             f"Rejected Requests (Admission): {a.rejected_requests_admission}"]
    lines += [f"  Shed ({k}): {a.shed_by_tier[k]}" for k in sorted(a.shed_by_tier)]
    lines += [f"Rejected Requests (Routing): {a.rejected_requests_routing}",
              f"Dropped Unservable: {a.dropped_unservable}",
              f"Length-Capped Requests: {a.length_capped_requests}"]
    if a.dropped_kv_allocations > 0:
        lines.append(f"Dropped KV Allocations: {a.dropped_kv_allocations}")
    return lines


def _kv_lines(rates: tuple[float, float, float]) -> list[str]:
    pr, hit, thr = rates
    return ["=== KV Cache Metrics ===", f"Preemption Rate: {pr:.4f}", f"Cache Hit Rate: {hit:.4f}",
            f"KV Thrashing Rate: {thr:.4f}"]


def _slo_lines(per_slo: Mapping[str, SLOMetrics]) -> list[str]:
    lines = ["=== Per-SLO Metrics ==="]
    for cls in sorted(per_slo):
        s = per_slo[cls]
        lines += [f"  {cls}:",
                  f"    TTFT: mean={s.ttft.mean:.2f} p99={s.ttft.p99:.2f} (n={s.ttft.count})",
                  f"    E2E:  mean={s.e2e.mean:.2f} p99={s.e2e.p99:.2f} (n={s.e2e.count})"]
    return lines


def _model_lines(per_model: Mapping[str, ModelMetrics]) -> list[str]:
    lines = ["=== Per-Model Metrics ==="]
    for mdl in sorted(per_model):
        s = per_model[mdl]
        lines += [f"  {mdl}:",
                  f"    TTFT: p50={s.ttft.p50:.2f} p99={s.ttft.p99:.2f} (n={s.ttft.count})",
                  f"    E2E:  p50={s.e2e.p50:.2f} p99={s.e2e.p99:.2f} (n={s.e2e.count})",
                  f"    Throughput: {s.throughput_rps:.2f} req/s, {s.tokens_per_sec:.2f} tok/s"]
    return lines


def _is_idle_ratio(r: float) -> bool:
    return math.isinf(r) or r >= FLOAT_MAX


def _pd_lines(pd: PDMetrics) -> list[str]:
    ratio = pd.load_imbalance_ratio
    lines = ["=== PD Metrics ===",
             f"Disaggregated Requests: {pd.disaggregated_count}",
             f"Dropped at Decode KV: {pd.dropped_at_decode_kv}",
             f"Prefill Throughput: {pd.prefill_throughput:.4f} sub-req/s",
             f"Decode Throughput: {pd.decode_throughput:.4f} sub-req/s",
             ("Load Imbalance Ratio: inf (one pool idle)" if _is_idle_ratio(ratio)
              else f"Load Imbalance Ratio: {ratio:.4f}")]
    for label, d in (("Parent TTFT (us)", pd.parent_ttft),
                     ("KV Transfer Duration (us)", pd.transfer_duration)):
        if d.count > 0:
            lines.append(f"{label}: mean={d.mean:.1f} p50={d.p50:.1f} p95={d.p95:.1f} "
                         f"p99={d.p99:.1f}")
    if pd.contention:
        lines += [f"Peak Concurrent Transfers: {pd.peak_concurrent_transfers}",
                  f"Mean Transfer Queue Depth: {pd.mean_transfer_queue_depth:.4f}"]
    return lines


def _trace_lines(t: TraceSummary) -> list[str]:
    lines = ["=== Trace Summary ===",
             f"Total Decisions: {t.total_decisions}",
             f"  Admitted: {t.admitted_count}",
             f"  Rejected: {t.rejected_count}",
             f"Unique Targets: {t.unique_targets}"]
    if t.target_distribution:
        lines.append("Target Distribution:")
        lines += [f"  {k}: {t.target_distribution[k]}" for k in sorted(t.target_distribution)]
    lines += [f"Mean Regret: {t.mean_regret:.6f}", f"Max Regret: {t.max_regret:.6f}"]
    if t.disaggregation_count > 0:
        lines += ["=== PD Disaggregation Summary ===",
                  f"Disaggregation Decisions: {t.disaggregation_count}",
                  f"  Disaggregated: {t.disaggregated_count}",
                  f"KV Transfers: {t.kv_transfer_count}",
                  f"Mean Transfer Duration (µs): {t.mean_transfer_duration:.2f}"]
    return lines


def render_blis(report: Report) -> str:
    """BLIS ``run``'s stdout for ``report``, sections in spec/08 §5 order."""
    lines: list[str] = []
    if report.num_instances > 1:
        for inst in report.instances:
            if inst.completed_requests >= 1:
                lines += _metrics_block(inst)
    if report.cluster.completed_requests >= 1:
        lines += _metrics_block(report.cluster)
    if report.fitness is not None:
        lines += _fitness_lines(report.fitness)
    if report.anomalies.any():
        lines += _anomaly_lines(report.anomalies)
    if any(report.kv_rates):
        lines += _kv_lines(report.kv_rates)
    if len(report.per_slo) > 1:
        lines += _slo_lines(report.per_slo)
    if report.per_model:
        lines += _model_lines(report.per_model)
    if report.pd is not None:
        lines += _pd_lines(report.pd)
    if report.trace_summary is not None:
        lines += _trace_lines(report.trace_summary)
    return "".join(line + "\n" for line in lines)


# ------------------------------------------------------------------------------- JSON
def report_dict(report: Report) -> dict:
    """The structured document behind :func:`render_json` (see the module docstring)."""
    pr, hit, thr = report.kv_rates
    return {
        "command": "replay" if report.is_replay else "run",
        "num_instances": report.num_instances,
        "cluster": metrics_output(report.cluster, include_requests=False),
        "instances": [metrics_output(m, include_requests=False) for m in report.instances],
        "anomaly_counters": report.anomalies.to_dict(),
        "kv_cache": {"preemption_rate": pr, "cache_hit_rate": hit, "kv_thrashing_rate": thr},
        "per_slo": {k: v.to_dict() for k, v in report.per_slo.items()},
        "per_model": {k: v.to_dict() for k, v in report.per_model.items()},
        "fitness": report.fitness.to_dict() if report.fitness is not None else None,
        "pd": report.pd.to_dict() if report.pd is not None else None,
        "trace_summary": (report.trace_summary.to_dict()
                          if report.trace_summary is not None else None),
    }


def render_json(report: Report) -> str:
    """One JSON document (2-space indent, trailing newline) for pipes."""
    return gojson.dumps(report_dict(report)) + "\n"


# ----------------------------------------------------------------------------- tables
def _f(x: float, nd: int = 2) -> str:
    return f"{x:,.{nd}f}"


def render_tables(report: Report, console) -> None:
    """Print the report as rich tables on ``console`` (a :class:`rich.console.Console`)."""
    from rich.table import Table

    c = metrics_output(report.cluster, include_requests=False)

    summary = Table(title="Summary", title_justify="left")
    summary.add_column("Metric")
    summary.add_column("Value", justify="right")
    summary.add_row("Instances", str(report.num_instances))
    summary.add_row("Completed / injected",
                    f"{c['completed_requests']:,} / {c['injected_requests']:,}")
    summary.add_row("Simulated duration", f"{_f(c['vllm_estimated_duration_s'], 3)} s")
    summary.add_row("Throughput", f"{_f(c['responses_per_sec'])} req/s")
    summary.add_row("Output tokens/s", f"{_f(c['tokens_per_sec'])} tok/s")
    summary.add_row("Input / output tokens",
                    f"{c['total_input_tokens']:,} / {c['total_output_tokens']:,}")
    console.print(summary)

    lat = Table(title="Latency (ms)", title_justify="left")
    lat.add_column("Metric")
    for h in ("mean", "p90", "p95", "p99"):
        lat.add_column(h, justify="right")
    for name, key in (("TTFT", "ttft"), ("E2E", "e2e"), ("ITL", "itl")):
        lat.add_row(name, *(_f(c[f"{key}_{s}_ms"], 3) for s in ("mean", "p90", "p95", "p99")))
    lat.add_row("Scheduling delay", "", "", "", _f(c["scheduling_delay_p99_ms"], 3))
    console.print(lat)

    a = report.anomalies
    cnt = Table(title="Counters", title_justify="left")
    cnt.add_column("Counter")
    cnt.add_column("Value", justify="right")
    rows = [("Still queued", c["still_queued"]), ("Still running", c["still_running"]),
            ("Timed out", c["timed_out_requests"]), ("Preemptions", c["preemption_count"]),
            ("KV allocation failures", report.cluster.kv_allocation_failures),
            ("Dropped unservable", a.dropped_unservable),
            ("Length-capped", a.length_capped_requests),
            ("Rejected (admission)", a.rejected_requests_admission)]
    rows += [(f"  shed ({k})", a.shed_by_tier[k]) for k in sorted(a.shed_by_tier)]
    rows += [("Rejected (routing)", a.rejected_requests_routing),
             ("Priority inversions", a.priority_inversions),
             ("HOL blocking events", a.hol_blocking_events)]
    if a.dropped_kv_allocations:
        rows.append(("Dropped KV allocations", a.dropped_kv_allocations))
    for label, v in rows:
        cnt.add_row(label, f"{v:,}")
    console.print(cnt)

    pr, hit, thr = report.kv_rates
    kv = Table(title="KV cache", title_justify="left")
    kv.add_column("Metric")
    kv.add_column("Value", justify="right")
    kv.add_row("Preemption rate", f"{pr:.4f}")
    kv.add_row("Cache hit rate", f"{hit:.2%}")
    kv.add_row("KV thrashing rate", f"{thr:.2%}")
    kv.add_row("Peak KV blocks", f"{report.cluster.peak_kv_blocks:,}")
    console.print(kv)

    if len(report.per_slo) > 1:
        t = Table(title="Per SLO class (ms)", title_justify="left")
        for h in ("Class", "n", "TTFT mean", "TTFT p99", "E2E mean", "E2E p99"):
            t.add_column(h, justify="left" if h == "Class" else "right")
        for cls, s in report.per_slo.items():
            t.add_row(cls, f"{s.e2e.count:,}", _f(s.ttft.mean / 1000, 3), _f(s.ttft.p99 / 1000, 3),
                      _f(s.e2e.mean / 1000, 3), _f(s.e2e.p99 / 1000, 3))
        console.print(t)

    if report.per_model:
        t = Table(title="Per model", title_justify="left")
        for h in ("Model", "n", "TTFT p50 (ms)", "TTFT p99 (ms)", "E2E p50 (ms)", "E2E p99 (ms)",
                  "req/s", "tok/s"):
            t.add_column(h, justify="left" if h == "Model" else "right")
        for mdl, s in report.per_model.items():
            t.add_row(mdl, f"{s.e2e.count:,}", _f(s.ttft.p50 / 1000, 3), _f(s.ttft.p99 / 1000, 3),
                      _f(s.e2e.p50 / 1000, 3), _f(s.e2e.p99 / 1000, 3), _f(s.throughput_rps),
                      _f(s.tokens_per_sec))
        console.print(t)

    if report.pd is not None:
        pd = report.pd
        t = Table(title="Prefill/decode disaggregation", title_justify="left")
        t.add_column("Metric")
        t.add_column("Value", justify="right")
        t.add_row("Disaggregated requests", f"{pd.disaggregated_count:,}")
        t.add_row("Dropped at decode KV", f"{pd.dropped_at_decode_kv:,}")
        t.add_row("Prefill throughput", f"{pd.prefill_throughput:.4f} sub-req/s")
        t.add_row("Decode throughput", f"{pd.decode_throughput:.4f} sub-req/s")
        r = pd.load_imbalance_ratio
        t.add_row("Load imbalance ratio", "inf (one pool idle)" if _is_idle_ratio(r) else f"{r:.4f}")
        if pd.parent_ttft.count:
            t.add_row("Parent TTFT p50 / p99", f"{_f(pd.parent_ttft.p50 / 1000, 3)} / "
                      f"{_f(pd.parent_ttft.p99 / 1000, 3)} ms")
        if pd.transfer_duration.count:
            t.add_row("KV transfer p50 / p99", f"{_f(pd.transfer_duration.p50 / 1000, 3)} / "
                      f"{_f(pd.transfer_duration.p99 / 1000, 3)} ms")
        if pd.contention:
            t.add_row("Peak concurrent transfers", f"{pd.peak_concurrent_transfers:,}")
            t.add_row("Mean transfer queue depth", f"{pd.mean_transfer_queue_depth:.4f}")
        console.print(t)

    if report.trace_summary is not None:
        ts = report.trace_summary
        t = Table(title="Decision trace", title_justify="left")
        t.add_column("Metric")
        t.add_column("Value", justify="right")
        t.add_row("Decisions (admitted / rejected)",
                  f"{ts.total_decisions:,} ({ts.admitted_count:,} / {ts.rejected_count:,})")
        t.add_row("Unique targets", f"{ts.unique_targets:,}")
        for k in sorted(ts.target_distribution):
            t.add_row(f"  {k}", f"{ts.target_distribution[k]:,}")
        t.add_row("Mean / max regret", f"{ts.mean_regret:.6f} / {ts.max_regret:.6f}")
        console.print(t)

    if report.fitness is not None:
        t = Table(title="Fitness", title_justify="left")
        t.add_column("Component")
        t.add_column("Value", justify="right")
        for k in sorted(report.fitness.components):
            t.add_row(k, f"{report.fitness.components[k]:.6f}")
        t.add_row("score", f"{report.fitness.score:.6f}")
        console.print(t)


# ------------------------------------------------------------------------------ files
def write_results(path, obj) -> None:
    """Write ``obj`` as Go-style indented JSON to ``path`` atomically.

    The text goes to a new temporary file in the same directory, is flushed and fsync'ed,
    then renamed over ``path`` (``os.replace``); on any failure the temporary file is removed
    and ``path`` is untouched. Like Go's ``os.WriteFile(path, MarshalIndent(...), 0644)``, no
    trailing newline is written and the mode is 0644 minus the umask.
    """
    data = gojson.dumps(obj).encode("utf-8")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    for attempt in range(100):
        tmp = os.path.join(directory, f".{base}.{os.getpid()}.{attempt}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        break
    else:  # pragma: no cover - 100 stale temp files
        raise FileExistsError(f"cannot create a temporary file next to {path}")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
