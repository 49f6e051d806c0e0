"""Aggregation, MetricsOutput, per-request rows, replay results and raw metrics (docs/metrics.md)."""

from __future__ import annotations

import logging
import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blis_simpy.metrics.fitness import FITNESS_KEYS, compute_fitness
from blis_simpy.metrics.percentile import Distribution
from blis_simpy.metrics.raw import (
    _count_pairs_over_double,
    hol_blocking_events,
    per_model_metrics,
    preemption_rate,
    priority_inversions,
    raw_throughput,
    slo_distributions,
)
from blis_simpy.metrics.summary import (
    aggregate,
    metrics_output,
    replay_results,
    request_rows,
)
from tests.metrics.helpers import from_replay_case, from_rows_case, instance, req

KEY_ORDER = [
    "instance_id", "completed_requests", "still_queued", "still_running", "injected_requests",
    "total_input_tokens", "total_output_tokens", "vllm_estimated_duration_s",
    "responses_per_sec", "tokens_per_sec", "e2e_mean_ms", "e2e_p90_ms", "e2e_p95_ms",
    "e2e_p99_ms", "ttft_mean_ms", "ttft_p90_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_mean_ms",
    "itl_p90_ms", "itl_p95_ms", "itl_p99_ms", "scheduling_delay_p99_ms",
    "preemption_count", "dropped_unservable", "length_capped_requests", "timed_out_requests",
]


# ------------------------------------------------------------------------ aggregate
def _two_instances():
    a = instance("instance_0", requests=[req("r1", 0), req("r2", 5)],
                 ttft={"r1": 100, "r2": 200}, e2e={"r1": 1000}, itl={"r1": 50.5},
                 sched={"r1": 10, "r2": 20}, all_itls={50: 3, 60: 1},
                 completed_requests=1, total_input_tokens=8, total_output_tokens=2,
                 ttft_sum=300, sim_ended_time=5000, kv_blocks_integral=7, peak_kv_blocks=9,
                 preemption_count=1, kv_allocation_failures=2, cache_hit_rate=0.5,
                 kv_thrashing_rate=0.25, still_queued=0, still_running=1, dropped_unservable=3,
                 length_capped_requests=1, timed_out_requests=0, step_counters_sum=4,
                 waitq_len_sum=6, running_len_sum=8, step_samples=3)
    b = instance("instance_1", requests=[req("r3", 7)], ttft={"r3": 300}, e2e={"r3": 3000},
                 itl={"r3": 70.0}, sched={"r3": 30}, all_itls={60: 2, 70: 1},
                 completed_requests=1, total_input_tokens=4, total_output_tokens=2, ttft_sum=300,
                 sim_ended_time=8000, kv_blocks_integral=5, peak_kv_blocks=4, preemption_count=0,
                 cache_hit_rate=0.0, kv_thrashing_rate=0.75, still_queued=2, timed_out_requests=1,
                 step_counters_sum=1, waitq_len_sum=1, running_len_sum=2, step_samples=2)
    b.completion_time = {"r3": 3007}
    return a, b


def test_aggregate_sums_maxes_means_and_merges():
    a, b = _two_instances()
    agg = aggregate([a, b])
    assert agg.instance_id == "cluster"
    assert agg.completed_requests == 2 and agg.total_input_tokens == 12
    assert agg.total_output_tokens == 4 and agg.ttft_sum == 600
    assert agg.kv_blocks_integral == 12 and agg.preemption_count == 1
    assert agg.kv_allocation_failures == 2 and agg.still_queued == 2 and agg.still_running == 1
    assert agg.dropped_unservable == 3 and agg.length_capped_requests == 1
    assert agg.timed_out_requests == 1
    assert agg.sim_ended_time == 8000 and agg.peak_kv_blocks == 9
    assert agg.cache_hit_rate == 0.25 and agg.kv_thrashing_rate == 0.5
    assert agg.all_itls == Counter({50: 3, 60: 3, 70: 1})
    assert agg.ttft == {"r1": 100, "r2": 200, "r3": 300}
    assert agg.e2e == {"r1": 1000, "r3": 3000}
    assert agg.completion_time == {"r3": 3007}
    assert set(agg.registry) == {"r1", "r2", "r3"}
    assert (agg.step_counters_sum, agg.waitq_len_sum, agg.step_samples) == (5, 7, 5)
    assert agg.injected_requests == 2 + 2 + 1 + 3 + 1
    # inputs untouched
    assert a.all_itls == Counter({50: 3, 60: 1}) and a.instance_id == "instance_0"


def test_aggregate_empty():
    agg = aggregate([])
    assert agg.completed_requests == 0 and agg.cache_hit_rate == 0.0 and agg.sim_ended_time == 0


def test_aggregate_warns_on_duplicate_ids(caplog):
    a = instance("instance_0", requests=[req("x", 0)], e2e={"x": 1})
    b = instance("instance_1", requests=[req("x", 0)], e2e={"x": 2})
    with caplog.at_level(logging.WARNING, logger="blis_simpy.metrics"):
        agg = aggregate([a, b])
    assert agg.e2e == {"x": 2}                    # later instance wins
    assert agg.registry["x"] is b.registry["x"]
    assert any("duplicate request ID 'x'" in r.getMessage() for r in caplog.records)


# -------------------------------------------------------------------- MetricsOutput
def test_metrics_output_hand_computed():
    m = instance("instance_3",
                 requests=[req("r0", 0), req("r1", 1000), req("r2", 2000)],
                 e2e={"r0": 1000, "r1": 3000, "r2": 2000}, ttft={"r0": 100, "r1": 300, "r2": 200},
                 sched={"r0": 0, "r1": 10, "r2": 5}, all_itls={8000: 3, 9000: 1},
                 completed_requests=3, total_input_tokens=12, total_output_tokens=6,
                 sim_ended_time=2_500_000, preemption_count=1)
    out = metrics_output(m, include_requests=False)
    assert list(out) == KEY_ORDER
    assert out["instance_id"] == "instance_3" and out["injected_requests"] == 3
    assert out["vllm_estimated_duration_s"] == 2.5
    assert out["responses_per_sec"] == 1.2 and out["tokens_per_sec"] == 2.4
    assert out["e2e_mean_ms"] == 2.0
    assert out["e2e_p90_ms"] == pytest.approx(2.8)        # rank 1.8: 2 + 1 * 0.8
    assert out["e2e_p99_ms"] == pytest.approx(2.98)
    assert out["ttft_mean_ms"] == pytest.approx(0.2)
    assert out["ttft_p95_ms"] == pytest.approx(0.29)
    assert out["itl_mean_ms"] == 8.25                     # (3*8000 + 9000) / 4 / 1000
    assert out["itl_p90_ms"] == pytest.approx(8.7)        # rank 2.7 over 8 8 8 9 ms
    assert out["scheduling_delay_p99_ms"] == pytest.approx(0.0099)  # 5 + 5 * 0.98 µs
    assert "kv_allocation_failures" not in out and "requests" not in out


def test_metrics_output_kv_failures_position_and_zero_completions():
    m = instance(completed_requests=0, still_queued=2, kv_allocation_failures=4,
                 sim_ended_time=1_000_000, ttft={"q": 500}, total_output_tokens=0)
    out = metrics_output(m, include_requests=True)
    keys = list(out)
    i = keys.index("kv_allocation_failures")
    assert keys[i - 1] == "scheduling_delay_p99_ms" and keys[i + 1] == "preemption_count"
    assert out["vllm_estimated_duration_s"] == 1.0
    # nothing completed: every latency / throughput field is 0 although a TTFT exists
    for k in KEY_ORDER[8:23]:
        assert out[k] == 0.0 and isinstance(out[k], float), k
    assert "requests" not in out                         # no registry row


def test_request_rows_keys_omission_and_order():
    rows_in = [
        req("request_10", 5000, n_in=7, n_out=2, slo_class="batch", tenant_id="t1",
            assigned_instance="instance_1", model="m"),
        req("request_2", 5000, n_in=3, n_out=4),
        req("request_1", 9000, n_in=5, n_out=0, assigned_instance="instance_0"),
        req("request_3", 1000, n_in=1, n_out=1),
    ]
    rows_in[1].length_capped = True
    m = instance(requests=rows_in, ttft={"request_10": 1500, "request_2": 2500},
                 itl={"request_10": 12.5}, e2e={"request_10": 40000},
                 sched={"request_2": 7}, completed_requests=1, sim_ended_time=10)
    rows = request_rows(m)
    assert [r["requestID"] for r in rows] == ["request_3", "request_10", "request_2", "request_1"]
    r10 = rows[1]
    assert r10 == {"arrived_at": 0.005, "requestID": "request_10", "num_prefill_tokens": 7,
                   "num_decode_tokens": 2, "ttft_ms": 1.5, "itl_ms": 0.0125, "e2e_ms": 40.0,
                   "scheduling_delay_ms": 0.0, "slo_class": "batch", "tenant_id": "t1",
                   "handled_by": "instance_1", "model": "m"}
    assert list(r10) == ["arrived_at", "requestID", "num_prefill_tokens", "num_decode_tokens",
                         "ttft_ms", "itl_ms", "e2e_ms", "scheduling_delay_ms", "slo_class",
                         "tenant_id", "handled_by", "model"]
    r2 = rows[2]
    assert list(r2)[-1] == "length_capped" and r2["length_capped"] is True
    assert "slo_class" not in r2 and "handled_by" not in r2 and "model" not in r2
    assert r2["scheduling_delay_ms"] == 0.007 and r2["e2e_ms"] == 0.0
    assert rows[3]["handled_by"] == "instance_0" and rows[3]["arrived_at"] == 0.009
    out = metrics_output(m, include_requests=True)
    assert list(out)[-1] == "requests" and out["requests"] == rows


def test_replay_results_filters_and_sorts():
    m = instance(requests=[req("request_10", 0, 5, 6), req("request_2", 0, 3, 4),
                           req("request_7", 0), req("other_1", 0)],
                 ttft={"request_10": 11, "request_2": 22, "request_7": 7, "other_1": 1,
                       "request_9": 9},
                 e2e={"request_10": 110, "request_2": 220, "other_1": 10, "request_9": 90})
    assert replay_results(m) == [
        {"request_id": 2, "ttft_us": 22, "e2e_us": 220, "input_tokens": 3, "output_tokens": 4},
        {"request_id": 9, "ttft_us": 9, "e2e_us": 90, "input_tokens": 0, "output_tokens": 0},
        {"request_id": 10, "ttft_us": 11, "e2e_us": 110, "input_tokens": 5, "output_tokens": 6},
    ]
    assert replay_results(instance()) == []


# ---------------------------------------------------------------------- raw metrics
def test_priority_inversions_hand_example():
    reqs = [req("a", 0, slo_class="critical"), req("b", 10, slo_class="critical"),
            req("c", 20, slo_class="critical"), req("d", 5), req("e", 6, slo_class="default"),
            req("f", 1)]
    m = instance(requests=reqs,
                 # critical by arrival: a=100, b=40, c=60 -> (a,b) 100 > 80 counts; (a,c) no
                 # default (d, e; f has no E2E): d=500, e=200 -> 500 > 400 counts
                 e2e={"a": 100, "b": 40, "c": 60, "d": 500, "e": 200})
    assert priority_inversions([m], "slo-based") == 2
    assert priority_inversions([m, m], "priority-fcfs") == 4
    assert priority_inversions([m], "constant") == 0
    assert priority_inversions([m], "") == 0
    # exactly 2x is not an inversion
    m2 = instance(requests=[req("x", 0), req("y", 1)], e2e={"x": 80, "y": 40})
    assert priority_inversions([m2], "slo-based") == 0


@given(st.lists(st.integers(0, 50), max_size=40))
def test_pair_count_matches_quadratic(values):
    n = len(values)
    brute = sum(1 for i in range(n) for j in range(i + 1, n) if values[i] > 2 * values[j])
    assert _count_pairs_over_double(values) == brute


def test_hol_blocking():
    def inst(waitq_sum, samples):
        return instance(waitq_len_sum=waitq_sum, step_samples=samples)
    # averages 10, 1, 1, 0 -> mean 3 -> one instance above 6
    assert hol_blocking_events([inst(100, 10), inst(5, 5), inst(2, 2), inst(0, 0)]) == 1
    assert hol_blocking_events([inst(100, 10)]) == 0            # needs >= 2 instances
    assert hol_blocking_events([inst(0, 3), inst(0, 0)]) == 0   # mean 0
    assert hol_blocking_events([inst(4, 1), inst(2, 1)]) == 0   # 4 > 2*3 is false


def test_slo_distributions():
    reqs = [req("a", 0, slo_class="critical"), req("b", 0, slo_class="critical"),
            req("c", 0), req("d", 0, slo_class="batch")]
    m = instance(requests=reqs, ttft={"a": 100, "b": 300, "c": 50, "d": 7},
                 e2e={"a": 1000, "b": 3000, "c": 500})
    per = slo_distributions(m)
    assert list(per) == ["batch", "critical", "default"]
    assert per["critical"].ttft == Distribution.from_values([100, 300])
    assert per["critical"].e2e.mean == 2000.0 and per["critical"].e2e.count == 2
    assert per["batch"].e2e == Distribution() and per["batch"].ttft.count == 1
    assert per["default"].ttft.p99 == 50.0


def test_per_model_metrics():
    reqs = [req("a", 0, n_out=10, model="llama"), req("b", 0, n_out=20, model="llama"),
            req("c", 0, n_out=5, model="qwen"), req("d", 0, n_out=99),
            req("e", 0, model="zeta")]
    m = instance(requests=reqs, ttft={"a": 100, "b": 200, "c": 30, "d": 1},
                 e2e={"a": 1000, "c": 300, "d": 2}, sim_ended_time=2_000_000)
    pm = per_model_metrics(m)
    assert list(pm) == ["llama", "qwen"]                 # zeta has neither TTFT nor E2E
    assert pm["llama"].ttft.count == 2 and pm["llama"].e2e.count == 1
    assert pm["llama"].throughput_rps == 0.5 and pm["llama"].tokens_per_sec == 5.0
    assert pm["llama"].total_requests == 2
    assert pm["qwen"].tokens_per_sec == 2.5
    assert per_model_metrics(instance(requests=[req("x", 0)], e2e={"x": 1})) == {}


def test_preemption_rate_and_throughput():
    assert preemption_rate(instance(completed_requests=4, preemption_count=1)) == 0.25
    assert preemption_rate(instance(preemption_count=3)) == 0.0
    assert raw_throughput(instance(completed_requests=5, total_output_tokens=10,
                                   sim_ended_time=2_000_000)) == (2.5, 5.0)
    assert raw_throughput(instance(completed_requests=5, total_output_tokens=10)) == (0.0, 0.0)


def test_fitness():
    m = instance(requests=[req("a", 0), req("b", 0)], ttft={"a": 1000, "b": 3000},
                 e2e={"a": 9000, "b": 9000}, completed_requests=2, total_output_tokens=10000,
                 sim_ended_time=100_000)                  # 20 req/s, 100000 tok/s
    f = compute_fitness(m, {"throughput": 2.0, "mean_ttft": 1.0, "p50_e2e": 0.5})
    assert list(f.components) == ["mean_ttft", "p50_e2e", "throughput"]
    assert f.components["throughput"] == 20 / 120
    assert f.components["mean_ttft"] == 1 / 3           # 1 / (1 + 2000/1000)
    assert f.components["p50_e2e"] == 0.1
    assert f.score == pytest.approx(2 * 20 / 120 + 1 / 3 + 0.05)
    with pytest.raises(ValueError, match="valid keys"):
        compute_fitness(m, {"latency": 1.0})
    with pytest.raises(ValueError):
        compute_fitness(m, {"throughput": -1.0})
    with pytest.raises(ValueError):
        compute_fitness(m, {"throughput": math.inf})
    assert set(FITNESS_KEYS) >= {"tokens_per_sec", "p99_ttft", "p99_e2e", "mean_e2e"}


# ------------------------------------------------- against what BLIS printed (files)
CASES_LIST = ["A01_golden1", "A02_golden2", "A03_golden3", "A06_preemption",
              "A07_chunked_prefill", "A08_prefix_cache", "A09_max_model_len",
              "B13_roofline_qwen3_14b_h100_tp1", "B19_tiered_kv_offload", "C19_cluster_rr",
              "C23_token_bucket", "C25_policy_config_slo", "C25b_sjf_slo"]
CASES_ROWS = ["D26_pd_always", "D27_pd_prefix_threshold", "E31_workload_spec_servegen",
              "E34_preset_chatbot"]
# need the ITL histogram / scheduling delays, which the results files do not carry
NOT_RECONSTRUCTIBLE = {"itl_mean_ms", "itl_p90_ms", "itl_p95_ms", "itl_p99_ms",
                       "scheduling_delay_p99_ms"}


@pytest.mark.parametrize("name", CASES_LIST)
def test_metrics_output_matches_blis_replay_cases(name):
    """Rebuild the cluster maps from the results file; every reconstructible field of the
    printed cluster block must be equal to the last bit."""
    exp, block, m = from_replay_case(name)
    assert len(exp["results"]) == block["completed_requests"]
    out = metrics_output(m, include_requests=False)
    assert list(out) == list(block)
    for k, v in block.items():
        if k not in NOT_RECONSTRUCTIBLE:
            assert out[k] == v and type(out[k]) is type(v), k


@pytest.mark.parametrize("name", CASES_ROWS)
def test_metrics_output_and_rows_match_blis_run_cases(name):
    exp, block, m = from_rows_case(name)
    out = metrics_output(m, include_requests=True)
    expected = exp["results"]
    assert list(out) == list(expected)
    for k, v in expected.items():
        if k not in NOT_RECONSTRUCTIBLE and k != "requests":
            assert out[k] == v, k
    assert len(out["requests"]) == len(expected["requests"])
    for got, want in zip(out["requests"], expected["requests"], strict=True):
        assert list(got) == list(want)
        for k, v in want.items():
            if k == "itl_ms":
                assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-15)
            else:
                assert got[k] == v, (want["requestID"], k)
