"""BLIS ``run``'s stdout for a :class:`~blis_simpy.metrics.report.Report`, byte for byte
(docs/metrics.md, "Text sections"); used for both ``run`` and ``replay``."""

from __future__ import annotations

from collections.abc import Mapping

from blis_simpy.metrics import gojson
from blis_simpy.metrics.fitness import FitnessResult
from blis_simpy.metrics.raw import ModelMetrics, SLOMetrics
from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.metrics.report import AnomalyCounters, PDMetrics, Report, TraceSummary, is_idle_ratio
from blis_simpy.metrics.streaming import accuracy_note
from blis_simpy.metrics.summary import metrics_output

__all__ = ["render_blis"]


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


def _pd_lines(pd: PDMetrics) -> list[str]:
    ratio = pd.load_imbalance_ratio
    lines = ["=== PD Metrics ===",
             f"Disaggregated Requests: {pd.disaggregated_count}",
             f"Dropped at Decode KV: {pd.dropped_at_decode_kv}",
             f"Prefill Throughput: {pd.prefill_throughput:.4f} sub-req/s",
             f"Decode Throughput: {pd.decode_throughput:.4f} sub-req/s",
             ("Load Imbalance Ratio: inf (one pool idle)" if is_idle_ratio(ratio)
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
    """BLIS ``run``'s stdout for ``report``, sections in BLIS's order (docs/metrics.md)."""
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
    if report.cluster.streaming is not None:      # --streaming-metrics: say so (not in BLIS)
        lines.append(accuracy_note())
    return "".join(line + "\n" for line in lines)
