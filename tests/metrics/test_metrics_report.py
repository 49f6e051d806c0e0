"""Report rendering: BLIS's stdout layout (docs/metrics.md), the JSON document, rich tables and
atomic results files."""

from __future__ import annotations

import io
import json
import os
import re

import pytest
from rich.console import Console

from blis_simpy.errors import ConfigError
from blis_simpy.metrics.blis_text import render_blis
from blis_simpy.metrics.fitness import FitnessResult
from blis_simpy.metrics.percentile import Distribution
from blis_simpy.metrics.report import (
    FLOAT_MAX,
    PDMetrics,
    Report,
    TraceSummary,
    render_json,
    write_results,
)
from blis_simpy.metrics.summary import aggregate
from blis_simpy.metrics.tables import render_tables
from tests.metrics.helpers import from_replay_case, from_rows_case, instance, load_expected, req

TINY_BLOCK = """=== Simulation Metrics ===
{
  "instance_id": "cluster",
  "completed_requests": 1,
  "still_queued": 0,
  "still_running": 0,
  "injected_requests": 152,
  "total_input_tokens": 10,
  "total_output_tokens": 4,
  "vllm_estimated_duration_s": 2,
  "responses_per_sec": 0.5,
  "tokens_per_sec": 2,
  "e2e_mean_ms": 1.5,
  "e2e_p90_ms": 1.5,
  "e2e_p95_ms": 1.5,
  "e2e_p99_ms": 1.5,
  "ttft_mean_ms": 0.5,
  "ttft_p90_ms": 0.5,
  "ttft_p95_ms": 0.5,
  "ttft_p99_ms": 0.5,
  "itl_mean_ms": 0.25,
  "itl_p90_ms": 0.25,
  "itl_p95_ms": 0.25,
  "itl_p99_ms": 0.25,
  "scheduling_delay_p99_ms": 0.1,
  "preemption_count": 0,
  "dropped_unservable": 151,
  "length_capped_requests": 0,
  "timed_out_requests": 0
}
"""

A09_ANOMALY = """=== Anomaly Counters ===
Priority Inversions: 0
HOL Blocking Events: 0
Rejected Requests (Admission): 0
Rejected Requests (Routing): 0
Dropped Unservable: 151
Length-Capped Requests: 0
"""


def _tiny(instance_id="instance_0", **kw):
    counters = dict(completed_requests=1, total_input_tokens=10, total_output_tokens=4,
                    sim_ended_time=2_000_000, dropped_unservable=151)
    counters.update(kw)
    return instance(instance_id, requests=[req("request_0", 0, 10, 5)],
                    ttft={"request_0": 500}, e2e={"request_0": 1500}, itl={"request_0": 250.0},
                    sched={"request_0": 100}, all_itls={250: 4}, **counters)


def test_render_blis_a09_like_single_instance():
    """One instance (no per-instance block), an unservable drop triggers the anomaly
    section, every KV rate is 0 so no KV section; replay prints run's two rejection lines."""
    report = Report([_tiny()], is_replay=True)
    assert render_blis(report) == TINY_BLOCK + A09_ANOMALY


def test_anomaly_section_text_equals_blis_a09():
    raw = load_expected("A09_max_model_len")["sections_raw"]["anomaly_counters"]
    out = render_blis(Report([_tiny()]))
    assert "=== Anomaly Counters ===\n" + raw + "\n" in out


def test_kv_section_and_preemption_rate():
    m = _tiny(dropped_unservable=0, completed_requests=3, preemption_count=1, cache_hit_rate=0.46849)
    text = render_blis(Report([m]))
    assert text.endswith("=== KV Cache Metrics ===\nPreemption Rate: 0.3333\n"
                         "Cache Hit Rate: 0.4685\nKV Thrashing Rate: 0.0000\n")
    assert "Anomaly" not in text


def test_per_slo_section_c25b_like():
    """Two classes: printed sorted, values in µs with two decimals (hand-computed)."""
    reqs = [req("a", 0, slo_class="critical"), req("b", 1, slo_class="batch"),
            req("c", 2, slo_class="batch")]
    m = instance("instance_0", requests=reqs, ttft={"a": 50, "b": 100, "c": 300},
                 e2e={"a": 400, "b": 1000, "c": 2000}, completed_requests=3,
                 sim_ended_time=10_000)
    text = render_blis(Report([m], priority_policy="constant"))
    assert text.split("}\n", 1)[1] == (
        "=== Per-SLO Metrics ===\n"
        "  batch:\n"
        "    TTFT: mean=200.00 p99=298.00 (n=2)\n"
        "    E2E:  mean=1500.00 p99=1990.00 (n=2)\n"
        "  critical:\n"
        "    TTFT: mean=50.00 p99=50.00 (n=1)\n"
        "    E2E:  mean=400.00 p99=400.00 (n=1)\n")
    # one class only (empty class = default): no section
    m1 = instance("instance_0", requests=[req("a", 0), req("b", 0, slo_class="default")],
                  e2e={"a": 1, "b": 2}, completed_requests=2, sim_ended_time=10)
    assert "Per-SLO" not in render_blis(Report([m1]))


@pytest.mark.parametrize("name", ["C25_policy_config_slo", "C25b_sjf_slo"])
def test_per_slo_section_equals_blis(name):
    """Cluster maps rebuilt from the results file and the trace's SLO classes."""
    exp, _, m = from_replay_case(name)
    text = render_blis(Report([m]))
    assert "=== Per-SLO Metrics ===\n" + exp["sections_raw"]["per_slo"] + "\n" in text


def test_per_slo_section_equals_blis_run_case():
    exp, _, m = from_rows_case("E31_workload_spec_servegen")
    text = render_blis(Report([m]))
    assert "=== Per-SLO Metrics ===\n" + exp["sections_raw"]["per_slo"] + "\n" in text


def _full_report():
    i0 = instance("instance_0",
                  requests=[req("r0", 0, 4, 3, slo_class="critical", model="llama",
                                assigned_instance="instance_0"),
                            req("r1", 10, 4, 5, slo_class="batch", model="llama",
                                assigned_instance="instance_0")],
                  ttft={"r0": 1000, "r1": 3000}, e2e={"r0": 5000, "r1": 20000},
                  itl={"r0": 2000.0, "r1": 4250.0}, sched={"r0": 0, "r1": 500},
                  all_itls={2000: 2, 4000: 3, 5000: 1}, completed_requests=2,
                  total_input_tokens=8, total_output_tokens=6, sim_ended_time=1_000_000,
                  waitq_len_sum=30, step_samples=10, cache_hit_rate=0.5, length_capped_requests=1)
    i1 = instance("instance_1", requests=[req("r2", 20, 4, 2, assigned_instance="instance_1")],
                  ttft={"r2": 700}, still_running=1, total_input_tokens=4,
                  sim_ended_time=900_000, waitq_len_sum=0, step_samples=4)
    pd = PDMetrics(disaggregated_count=2, dropped_at_decode_kv=1, prefill_throughput=2.0,
                   decode_throughput=0.0, load_imbalance_ratio=FLOAT_MAX,
                   parent_ttft=Distribution.from_values([1000, 3000]),
                   transfer_duration=Distribution(), contention=True,
                   peak_concurrent_transfers=0, mean_transfer_queue_depth=0.0)
    trace = {"total_decisions": 3, "admitted_count": 2, "rejected_count": 1,
             "unique_targets": 2, "target_distribution": {"instance_1": 1, "instance_0": 2},
             "mean_regret": 0.25, "max_regret": 0.5, "disaggregation_count": 2,
             "disaggregated_count": 2, "kv_transfer_count": 2, "mean_transfer_duration": 76.8}
    return Report([i0, i1], rejected_by_admission=1, rejected_at_routing=2,
                  shed_by_tier={"standard": 1, "critical": 0}, priority_policy="slo-based",
                  fitness=FitnessResult(0.75, {"throughput": 0.5, "mean_e2e": 0.25}),
                  trace_summary=trace, pd=pd)


def test_render_blis_every_section_in_order():
    report = _full_report()
    text = render_blis(report)
    heads = [ln for ln in text.splitlines() if ln.startswith("===")]
    assert heads == ["=== Simulation Metrics ===", "=== Simulation Metrics ===",
                     "=== Fitness Evaluation ===", "=== Anomaly Counters ===",
                     "=== KV Cache Metrics ===", "=== Per-SLO Metrics ===",
                     "=== Per-Model Metrics ===", "=== PD Metrics ===", "=== Trace Summary ===",
                     "=== PD Disaggregation Summary ==="]
    # instance_1 completed nothing: only instance_0's block, then the cluster's
    assert '"instance_id": "instance_0"' in text and '"instance_id": "instance_1"' not in text
    assert text.index('"instance_id": "instance_0"') < text.index('"instance_id": "cluster"')
    # HOL: averages 3 and 0, mean 1.5 -> instance_0 > 3 is false -> 0 events
    # inversions (slo-based): classes critical/batch have one request each -> 0
    tail = text[text.index("=== Fitness Evaluation ==="):]
    assert tail == (
        "=== Fitness Evaluation ===\n"
        "Score: 0.750000\n"
        "  mean_e2e: 0.250000\n"
        "  throughput: 0.500000\n"
        "=== Anomaly Counters ===\n"
        "Priority Inversions: 0\n"
        "HOL Blocking Events: 0\n"
        "Rejected Requests (Admission): 1\n"
        "  Shed (critical): 0\n"
        "  Shed (standard): 1\n"
        "Rejected Requests (Routing): 2\n"
        "Dropped Unservable: 0\n"
        "Length-Capped Requests: 1\n"
        "Dropped KV Allocations: 1\n"
        "=== KV Cache Metrics ===\n"
        "Preemption Rate: 0.0000\n"
        "Cache Hit Rate: 0.2500\n"
        "KV Thrashing Rate: 0.0000\n"
        "=== Per-SLO Metrics ===\n"
        "  batch:\n"
        "    TTFT: mean=3000.00 p99=3000.00 (n=1)\n"
        "    E2E:  mean=20000.00 p99=20000.00 (n=1)\n"
        "  critical:\n"
        "    TTFT: mean=1000.00 p99=1000.00 (n=1)\n"
        "    E2E:  mean=5000.00 p99=5000.00 (n=1)\n"
        "  default:\n"
        "    TTFT: mean=700.00 p99=700.00 (n=1)\n"
        "    E2E:  mean=0.00 p99=0.00 (n=0)\n"
        "=== Per-Model Metrics ===\n"
        "  llama:\n"
        "    TTFT: p50=2000.00 p99=2980.00 (n=2)\n"
        "    E2E:  p50=12500.00 p99=19850.00 (n=2)\n"
        "    Throughput: 2.00 req/s, 8.00 tok/s\n"
        "=== PD Metrics ===\n"
        "Disaggregated Requests: 2\n"
        "Dropped at Decode KV: 1\n"
        "Prefill Throughput: 2.0000 sub-req/s\n"
        "Decode Throughput: 0.0000 sub-req/s\n"
        "Load Imbalance Ratio: inf (one pool idle)\n"
        "Parent TTFT (us): mean=2000.0 p50=2000.0 p95=2900.0 p99=2980.0\n"
        "Peak Concurrent Transfers: 0\n"
        "Mean Transfer Queue Depth: 0.0000\n"
        "=== Trace Summary ===\n"
        "Total Decisions: 3\n"
        "  Admitted: 2\n"
        "  Rejected: 1\n"
        "Unique Targets: 2\n"
        "Target Distribution:\n"
        "  instance_0: 2\n"
        "  instance_1: 1\n"
        "Mean Regret: 0.250000\n"
        "Max Regret: 0.500000\n"
        "=== PD Disaggregation Summary ===\n"
        "Disaggregation Decisions: 2\n"
        "  Disaggregated: 2\n"
        "KV Transfers: 2\n"
        "Mean Transfer Duration (µs): 76.80\n")


def test_render_blis_no_completion_prints_no_json():
    m = instance("instance_0", still_queued=3)
    assert render_blis(Report([m])) == ""
    text = render_blis(Report([m, instance("instance_1")], rejected_at_routing=5))
    assert text.startswith("=== Anomaly Counters ===\n") and "Simulation Metrics" not in text


def test_per_instance_blocks_need_more_than_one_instance():
    m = _tiny(dropped_unservable=0)
    assert render_blis(Report([m])).count("=== Simulation Metrics ===") == 1
    assert render_blis(Report([m], num_instances=2)).count("=== Simulation Metrics ===") == 2


def test_explicit_cluster_is_used():
    a = _tiny("instance_0", dropped_unservable=0)
    corrected = aggregate([a])
    corrected.still_running = 7                       # e.g. a PD correction
    text = render_blis(Report([a], cluster=corrected))
    assert '"still_running": 7' in text and '"injected_requests": 8' in text


def test_pd_and_trace_sections_equal_blis_text():
    raw = load_expected("D29_pd_transfer_contention")["sections_raw"]["pd"]
    pd = PDMetrics(500, 0, 21.7101, 21.7101, 1.0,
                   Distribution(mean=45665.3, p50=46248.5, p95=82654.3, p99=98532.7, count=500),
                   Distribution(mean=810561.7, p50=745113.5, p95=1749780.6, p99=2221094.4,
                                count=500), True, 36, 19.192)
    text = render_blis(Report([instance()], pd=pd))
    assert text == "=== PD Metrics ===\n" + raw + "\n"
    raw = load_expected("C24_weighted_trace_summary")["sections_raw"]["trace_summary"]
    ts = TraceSummary(2000, 2000, 0, 4, {"instance_0": 496, "instance_1": 497,
                                         "instance_2": 496, "instance_3": 511}, 0.0, 0.0)
    assert render_blis(Report([instance()], trace_summary=ts)) == "=== Trace Summary ===\n" + raw + "\n"


def test_render_json_document():
    report = _full_report()
    doc = json.loads(render_json(report))
    assert list(doc) == ["command", "num_instances", "cluster", "instances", "anomaly_counters",
                         "kv_cache", "per_slo", "per_model", "fitness", "pd", "trace_summary",
                         "total_kv_blocks", "kv_capacity", "request_accounting"]
    assert doc["request_accounting"] is None          # not given: unknown
    assert doc["command"] == "run" and doc["num_instances"] == 2
    assert doc["cluster"]["instance_id"] == "cluster" and doc["cluster"]["completed_requests"] == 2
    assert [b["instance_id"] for b in doc["instances"]] == ["instance_0", "instance_1"]
    assert doc["anomaly_counters"]["shed_by_tier"] == {"critical": 0, "standard": 1}
    assert doc["anomaly_counters"]["dropped_kv_allocations"] == 1
    assert doc["kv_cache"] == {"preemption_rate": 0, "cache_hit_rate": 0.25, "kv_thrashing_rate": 0}
    # one unit (ms) named in every key; empty statistics are null, never 0
    assert doc["per_slo"]["batch"]["e2e"] == {"mean_ms": 20, "p50_ms": 20, "p95_ms": 20,
                                              "p99_ms": 20, "min_ms": 20, "max_ms": 20, "count": 1}
    assert doc["per_slo"]["default"]["e2e"]["mean_ms"] is None
    assert doc["per_slo"]["default"]["e2e"]["count"] == 0
    assert doc["pd"]["parent_ttft"] == {"mean_ms": 2, "p50_ms": 2, "p95_ms": 2.9, "p99_ms": 2.98,
                                        "min_ms": 1, "max_ms": 3, "count": 2}
    assert doc["pd"]["transfer_duration"]["p99_ms"] is None
    assert doc["pd"]["prefill_throughput_rps"] == 2
    assert doc["trace_summary"]["mean_transfer_duration_ms"] == 0.0768
    # instance_0: 2 done (E2E 5 and 20 ms, TTFT 1 and 3 ms, sched 0 and 0.5 ms, ITL 2,2,4,4,4,5 ms)
    i0 = doc["instances"][0]
    assert (i0["e2e_mean_ms"], i0["e2e_p50_ms"], i0["e2e_count"]) == (12.5, 12.5, 2)
    assert (i0["ttft_p50_ms"], i0["scheduling_delay_mean_ms"], i0["scheduling_delay_p50_ms"]) == (2, 0.25, 0.25)
    assert (i0["itl_p50_ms"], i0["itl_count"], i0["unfinished_requests"]) == (4, 6, 0)
    # instance_1: its one request has a TTFT but is still running: no E2E (null), counted
    i1 = doc["instances"][1]
    assert i1["unfinished_requests"] == 1 and i1["ttft_mean_ms"] == 0.7 and i1["ttft_count"] == 1
    assert all(i1[f"{lat}_{st}_ms"] is None for lat in ("e2e", "itl", "scheduling_delay")
               for st in ("mean", "p50", "p90", "p95", "p99"))
    assert (i1["e2e_count"], i1["itl_count"], i1["scheduling_delay_count"]) == (0, 0, 0)
    assert doc["per_model"]["llama"]["throughput_rps"] == 2
    assert doc["fitness"] == {"score": 0.75, "components": {"mean_e2e": 0.25, "throughput": 0.5}}
    assert doc["pd"]["load_imbalance_ratio"] == FLOAT_MAX
    assert doc["trace_summary"]["target_distribution"] == {"instance_0": 2, "instance_1": 1}
    empty = json.loads(render_json(Report([instance()], is_replay=True)))
    assert empty["command"] == "replay" and empty["fitness"] is None and empty["pd"] is None
    assert empty["per_slo"] == {} and empty["per_model"] == {}


def test_render_tables():
    buf = io.StringIO()
    console = Console(file=buf, width=160, record=True, color_system=None)
    render_tables(_full_report(), console)
    text = console.export_text()
    for token in ("Summary", "Latency (ms)", "Counters", "KV cache", "Per SLO class", "Per model",
                  "Prefill/decode disaggregation", "Decision trace", "Fitness", "critical",
                  "llama", "inf (one pool idle)", "shed (standard)", "2.00 req/s"):
        assert token in text, token
    assert "12.500" in text                      # llama E2E p50, ms
    # the cluster latency table: instance_0's two requests, instance_1's has no E2E
    assert re.search(r"│ E2E +│ +12\.50 │ +12\.50 │ +18\.50 │ +19\.25 │ +19\.85 │ +2 │", text), text


@pytest.mark.parametrize("width", [60, 80])
def test_latency_table_keeps_every_digit_when_narrow(width):
    """An hour-long E2E (3,600,000.123 ms) in a narrow, non-terminal console: whole ms above
    1 s, and a number that does not fit is folded onto the next line, never cut."""
    big = instance("instance_0", requests=[req("r0", 0, 4, 3)], ttft={"r0": 3_600_000_123},
                   e2e={"r0": 3_600_000_123}, sched={"r0": 1_234_567_891}, completed_requests=1,
                   total_input_tokens=4, total_output_tokens=2, sim_ended_time=3_600_000_200)
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    render_tables(Report([big]), console)
    text = console.export_text()
    assert "…" not in text
    digits = re.sub(r"[^0-9\n│]", "", text.split("Latency (ms)")[1].split("Counters")[0])
    cells = ["".join(parts) for parts in zip(*[ln.split("│") for ln in digits.splitlines()
                                                 if ln.count("│") == 8], strict=True)]
    assert "3600000" in "".join(cells) and "1234568" in "".join(cells)


def test_write_results_atomic(tmp_path):
    path = tmp_path / "results.json"
    write_results(path, {"a": 1.0, "b": [0.5]})
    assert path.read_text() == '{\n  "a": 1,\n  "b": [\n    0.5\n  ]\n}'
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)
    # a failure while encoding leaves the old file and no temporary file
    with pytest.raises(ValueError):
        write_results(path, {"a": float("nan")})
    assert json.loads(path.read_text()) == {"a": 1, "b": [0.5]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_write_results_failure_during_replace(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(ConfigError, match="cannot write results: disk full"):
        write_results(path, [1, 2])
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
