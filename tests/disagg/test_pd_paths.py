"""Hand-checked prefill/decode disaggregation paths (docs/disaggregation.md, divergences.md), closed-loop
sessions through the pools (divergences.md P9), a decider plugin loaded through the CLI, and the PD
regressions for the PD bugs the property tests found (a stale step stranding work, a
decode-pool KV deadlock, a zero-output parent's E2E, trace export of parents).

Unless stated otherwise: blackbox latency with alpha = (1000, 0, 0) — a 1000 µs queueing
delay, no output-token overhead — and beta = (5000, 10, 100), so a step takes
``5000 + 10 × prefill tokens + 100 × decode tokens`` µs; block size 16; the KV transfer at
25 GB/s (25,000 B/µs) + 0.05 ms with 512 B per token; no admission or routing latency.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from blis_simpy.config.scenario import Scenario
from blis_simpy.latency.base import BatchView
from blis_simpy.metrics.blis_text import render_blis
from blis_simpy.metrics.report import Report
from blis_simpy.request import COMPLETED, DROPPED, QUEUED, TIMED_OUT, Request
from blis_simpy.run.simulation import Simulation
from blis_simpy.workload import WorkloadSpecV2, generate_workload
from blis_simpy.workload.sessions import COMPLETED_SESSION, END_STATES
from tests.cli.support import trace_row, write_trace_files

REPO = Path(__file__).resolve().parents[2]
IMPLS = ["fast", "reference"]


def pd_scenario(*, n=2, P=1, D=1, decider="always", dparams=None, compat="fixed", impl="fast",
                alpha=(1000.0, 0.0, 0.0), beta=(5000.0, 10.0, 100.0), kv=1000, max_running=64,
                decode_pool=None, prefill_pool=None, transfer=None, preemption_model="vllm",
                **extra) -> Scenario:
    t = {"bandwidth_gbps": 25.0, "base_latency_ms": 0.05, "kv_bytes_per_token": 512, "contention": "none"}
    t.update(transfer or {})
    data = {
        "seed": 7, "model": "m",
        "latency": {"model": "blackbox", "alpha_coeffs": list(alpha), "beta_coeffs": list(beta)},
        "engine": {"total_kv_blocks": kv, "block_size": 16, "max_num_running_reqs": max_running,
                   "implementation": impl, "preemption_model": preemption_model},
        "cluster": {"num_instances": n},
        "disaggregation": {"prefill_instances": P, "decode_instances": D,
                           "decider": {"policy": decider, "params": dparams or {}},
                           "transfer": t, "compat": compat,
                           "decode_pool": decode_pool or {}, "prefill_pool": prefill_pool or {}},
    }
    data.update(extra)
    return Scenario.model_validate(data)


def req(rid, arrival, n_in, n_out, *, base=0, deadline=0) -> Request:
    """A request with distinct prompt tokens ``base … base + n_in − 1``."""
    return Request(rid, arrival, np.arange(base, base + n_in), np.arange(n_out) + 7, deadline_us=deadline)


def run(sc, reqs, horizon=None, setup=None):
    sim = Simulation(sc, reqs, horizon_us=horizon)
    if setup is not None:
        setup(sim)
    return sim, sim.run()


def no_sub_keys(agg) -> bool:
    return not any(k.endswith(("_prefill", "_decode"))
                   for name in ("ttft", "itl", "scheduling_delay", "e2e", "completion_time", "registry")
                   for k in getattr(agg, name))


# ---------------------------------------------------------------------------- 1P1D by hand
# One request, 100 prompt tokens, 5 output tokens, arriving at 0 on an idle 1P1D cluster:
#   prefill sub: queued at 1000; one step of 5000 + 10·100 = 6000 → ends at 7000; its TTFT
#                (7000 − 0) is taken at the step end
#   KV: ceil(100/16) = 7 blocks × 16 × 512 B = 57,344 B → 57,344 / 25,000 + 50 = 52.29 → 53 µs
#   decode sub:  PI starts at 100; it completes at PI ≥ 100 + 5 − 1, i.e. after 4 decode steps
#                of 5000 + 100·1 = 5100 µs each (ITL 5100 + OTPT)
TRANSFER = math.ceil(7 * 16 * 512 / 25_000 + 50)
assert TRANSFER == 53


@pytest.mark.parametrize("impl", IMPLS)
def test_1p1d_fixed_timing_by_hand(impl):
    """fixed: the transfer starts when the prefill step ends (7000) and ends at 7053; the
    decode runs 7053 → 27,453. TTFT = decode scheduling delay + first decode ITL; E2E =
    decode scheduling delay + decode ITLs (+ post-decode overhead)."""
    sim, res = run(pd_scenario(impl=impl), [req("r", 0, 100, 5)])
    p = sim.cluster.parents["r"]
    assert p.phase_times() == (0, 0, 7000, 7000, 7000 + TRANSFER, 7053, 7053 + 4 * 5100)
    assert (p.prefill_instance, p.decode_instance) == ("instance_0", "instance_1")
    (tr,) = sim.cluster.fabric.transfers
    assert (tr.nbytes, tr.start_us, tr.complete_us) == (57_344.0, 7000, 7053)
    agg = res.cluster
    sd = 7053                                 # decode scheduling delay: first decode step − arrival
    assert agg.ttft == {"r": sd + 5100}
    assert agg.e2e == {"r": sd + 4 * 5100}
    assert agg.completion_time == {"r": 27_453}
    assert agg.itl == {"r": 5100.0}
    assert agg.scheduling_delay == {"r": 1000}   # the prefill sub-request's (disaggregation.md)
    assert list(agg.registry) == ["r"] and agg.registry["r"].assigned_instance == "instance_1"
    assert (agg.completed_requests, agg.still_queued, agg.still_running, agg.dropped_unservable,
            agg.timed_out_requests) == (1, 0, 0, 0, 0)
    assert res.instances[0].ttft == {"r_prefill": 7000}      # raw per-instance rows keep sub IDs
    pd = res.pd
    assert (pd.disaggregated_count, pd.dropped_at_decode_kv) == (1, 0)
    assert (pd.parent_ttft.count, pd.parent_ttft.mean) == (1, 12_153.0)
    assert (pd.transfer_duration.count, pd.transfer_duration.mean) == (1, 53.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_1p1d_fixed_timing_with_output_overhead_and_post_decode(impl):
    """OTPT = 200 µs (alpha2) lengthens every decode ITL to 5300 and the prefill TTFT to 7200
    but not the prefill step, so the transfer still starts at 7000. A post-decode overhead of
    700 µs on the decode instance is added once to the E2E."""
    def post(sim):
        sim.instances[1].post_decode_us = 700

    sim, res = run(pd_scenario(impl=impl, alpha=(1000.0, 0.0, 200.0)), [req("r", 0, 100, 5)], setup=post)
    p = sim.cluster.parents["r"]
    assert (p.prefill_complete_us, p.transfer_complete_us, p.decode_enqueue_us) == (7000, 7053, 7053)
    assert res.instances[0].ttft == {"r_prefill": 7200}
    agg = res.cluster
    assert agg.ttft == {"r": 7053 + 5300}
    assert agg.e2e == {"r": 7053 + 4 * 5300 + 700}
    assert agg.completion_time == {"r": agg.e2e["r"]}
    assert agg.itl == {"r": 5300.0}


@pytest.mark.parametrize("impl", IMPLS)
def test_1p1d_checkout_timing_by_hand(impl):
    """checkout (BLIS parity): the prefill is detected at the start of its step (1000), so
    the transfer runs 1000 → 1053 and the decode 1053 → 21,453; the parent's TTFT is the
    prefill's own (7000) and its E2E the decode completion's detection time (the start of
    the last decode step, 16,353) − arrival: shorter than the parent's real life (divergences.md P3)."""
    sim, res = run(pd_scenario(impl=impl, compat="checkout"), [req("r", 0, 100, 5)])
    p = sim.cluster.parents["r"]
    assert p.phase_times() == (0, 0, 1000, 1000, 1053, 1053, 1053 + 3 * 5100)
    agg = res.cluster
    assert agg.ttft == {"r": 7000}
    assert agg.e2e == {"r": 16_353}
    assert agg.completion_time == {"r": 16_353}
    assert agg.itl == {"r": 5100.0}
    assert agg.scheduling_delay == {"r": 1000}
    assert res.instances[1].completion_time  # the decode sub finished
    assert res.pd.parent_ttft.mean == 7000.0


# ---------------------------------------------------------------------------- failure paths
def test_progress_counts_each_parent_once():
    # the progress bar's count: a disaggregated request ends once, on its decode instance,
    # although its prefill sub-request also completed (it counted twice: 6 of 3)
    reqs = [req(f"r{i}", 20_000 * i, 100, 5, base=1000 * i) for i in range(3)]
    sim = Simulation(pd_scenario(), reqs)
    seen = []
    sim.run(progress=lambda done, offered: seen.append((done, offered)))
    assert seen[-1] == (3, 3)


def test_dropped_at_decode_kv_is_counted_in_pd_metrics_and_anomalies():
    """The decode pool has 4 KV blocks (64 tokens): a 100-token prompt cannot be
    pre-allocated there and is dropped at decode routing; a 30-token one fits."""
    sc = pd_scenario(decode_pool={"total_kv_blocks": 4})
    sim, res = run(sc, [req("big", 0, 100, 5), req("small", 50_000, 30, 5, base=500)])
    big, small = sim.cluster.parents["big"], sim.cluster.parents["small"]
    assert big.dropped_at_decode and not big.decode_instance and big.completion_us == big.transfer_complete_us
    assert big.original.state == DROPPED
    assert small.completed
    assert sim.instances[1].kv.total_blocks == 4 and sim.instances[0].kv.total_blocks == 1000
    agg = res.cluster
    assert (agg.completed_requests, agg.dropped_unservable) == (1, 1)
    assert set(agg.e2e) == set(agg.registry) == {"small"} and no_sub_keys(agg)
    pd = res.pd
    assert (pd.disaggregated_count, pd.dropped_at_decode_kv) == (2, 1)
    assert sim.cluster.dropped_at_decode_kv == 1
    c = res.counters
    report = Report(res.instances, cluster=res.cluster, pd=res.pd, num_instances=2,
                    rejected_by_admission=c.rejected_by_admission, rejected_at_routing=c.rejected_at_routing)
    assert report.anomalies.dropped_kv_allocations == 1 and report.anomalies.dropped_unservable == 1
    text = render_blis(report)
    assert "=== Anomaly Counters ===" in text
    assert "Dropped KV Allocations: 1\n" in text
    assert "Dropped Unservable: 1\n" in text
    assert "=== PD Metrics ===\nDisaggregated Requests: 2\nDropped at Decode KV: 1\n" in text


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_deadline_passed_during_transfer_times_out_at_injection(impl):
    """A 1 ms base latency makes the transfer 7000 → 8003; the deadline (7500) passes while
    the KV is in flight. The prefill completed in time; the decode sub-request is timed out
    when it is injected (divergences.md P10): no step runs for it and its KV is freed."""
    sc = pd_scenario(impl=impl, transfer={"base_latency_ms": 1.0})
    sim, res = run(sc, [req("r", 0, 100, 5, deadline=7500)])
    p = sim.cluster.parents["r"]
    assert (p.prefill_complete_us, p.transfer_complete_us, p.decode_enqueue_us) == (7000, 8003, 8003)
    assert p.prefill_sub.state == COMPLETED
    sub = p.decode_sub
    assert sub.state == TIMED_OUT and sub.enqueue_us == -1 and p.decode_instance == "instance_1"
    assert not p.completed and p.original.state == TIMED_OUT
    dec = sim.instances[1]
    assert dec.step_count == 0 and dec.kv.used == 0 and not dec.waitq
    assert (res.instances[1].timed_out_requests, res.instances[1].completed_requests) == (1, 0)
    agg = res.cluster
    assert (agg.completed_requests, agg.timed_out_requests, agg.still_queued, agg.still_running) == (0, 1, 0, 0)
    assert agg.e2e == {} and no_sub_keys(agg) and "r" not in agg.registry
    assert res.pd.dropped_at_decode_kv == 0 and res.pd.disaggregated_count == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_preempted_decode_subrequest_is_recomputed_and_completes(impl):
    """Two 48-token prompts with 40 output tokens decode side by side on a decode instance of
    8 KV blocks (128 tokens): they outgrow it, the later one is preempted, loses its
    transferred KV and is recomputed as a prefill on the decode instance, then completes.

    Under vLLM's model (default), by hand (decode step 5000 + 10/prefill token + 100/decode
    token, no OTPT): both sub-requests are admitted at 7011 with 3 prompt blocks each; 16
    two-token steps (5200 µs) fill a 4th block each, to 90211. At pi 64 "a" needs a 5th
    block: "b" (the tail) is preempted after 16 decode tokens, and "a" takes its last two
    blocks, decoding alone to pi 87 in 23 steps (5100 µs): done at 207511. "b" then
    recomputes 64 + 1 tokens: 2 prompt blocks are still cached, 33 tokens are prefilled
    (5330 µs) and the step that ends at 212841 emits its next token, ITL 212841 − 90211 =
    122630; 22 decode steps end at 325041. No TTFT is recorded on the decode instance, each
    sub-request has L − 1 = 39 ITL samples, and each parent's E2E is its completion time."""
    sc = pd_scenario(impl=impl, decode_pool={"total_kv_blocks": 8}, max_running=4)
    reqs = [req("a", 0, 48, 40), req("b", 0, 48, 40, base=1000)]
    sim, res = run(sc, reqs, setup=lambda s: _spy_prefill_on(s, 1))
    dec = res.instances[1]
    assert dec.preemption_count == 1 and sim.prefill_batches_on_decode == 1
    pa, pb = sim.cluster.parents["a"], sim.cluster.parents["b"]
    assert pa.completed and pb.completed and dec.ttft == {}
    assert dict(dec.all_itls) == {5200: 32, 5100: 23 + 22, 122630: 1}
    assert dec.total_output_tokens == 2 * 39
    agg = res.cluster
    assert agg.completed_requests == 2 and no_sub_keys(agg)
    assert agg.ttft == {"a": 7011 + 5200, "b": 7011 + 5200}
    assert agg.e2e == {"a": 207511, "b": 325041}
    assert (pa.phase_times()[-1], pb.phase_times()[-1]) == (207511, 325041)


@pytest.mark.parametrize("impl", IMPLS)
def test_preempted_decode_subrequest_restarts_under_blis(impl):
    """BLIS's model: the preempted sub-request restarts from PI = 0 as a prefill on the
    decode instance (so it records a TTFT there) and regenerates its outputs."""
    sc = pd_scenario(impl=impl, decode_pool={"total_kv_blocks": 8}, max_running=4,
                     preemption_model="blis")
    reqs = [req("a", 0, 48, 40), req("b", 0, 48, 40, base=1000)]
    sim, res = run(sc, reqs, setup=lambda s: _spy_prefill_on(s, 1))
    dec = res.instances[1]
    assert dec.preemption_count >= 1
    pa, pb = sim.cluster.parents["a"], sim.cluster.parents["b"]
    assert pa.completed and pb.completed
    recomputed = [p for p in (pa, pb) if p.decode_sub_id in dec.ttft]
    assert recomputed, "no decode sub-request was recomputed as a prefill"
    assert sim.prefill_batches_on_decode > 0
    assert dec.total_output_tokens > 2 * 39             # regenerated tokens count again
    for p in (pa, pb):
        assert p.decode_sub.pi >= p.original.input_len + p.original.output_len - 1
    agg = res.cluster
    assert agg.completed_requests == 2 and set(agg.e2e) == {"a", "b"} and no_sub_keys(agg)
    assert agg.e2e["a"] >= agg.ttft["a"] > 0 and agg.e2e["b"] >= agg.ttft["b"] > 0


def _spy_prefill_on(sim, k):
    """Count steps of instance ``k`` whose batch holds a prefill-phase request."""
    sim.prefill_batches_on_decode = 0
    lat = sim.instances[k].latency
    inner = lat.step_time_us

    def step_time_us(batch: BatchView):
        if batch.prefill:
            sim.prefill_batches_on_decode += 1
        return inner(batch)

    lat.step_time_us = step_time_us


@pytest.mark.parametrize("compat", ["fixed", "checkout"])
@pytest.mark.parametrize("impl", IMPLS)
def test_zero_output_disaggregated_request_completes(impl, compat):
    """divergences.md P10: the decode sub-request of a 0-output request produces no token
    and completes in its first decode step. 40-token prompt: prefill step 5000 + 400 → ends
    6400; 3 blocks × 16 × 512 B → ceil(0.98 + 50) = 51 µs of transfer."""
    sim, res = run(pd_scenario(impl=impl, compat=compat), [req("z", 0, 40, 0)])
    p = sim.cluster.parents["z"]
    assert p.completed and p.decode_sub.state == COMPLETED
    assert not p.decode_sub.itl
    agg = res.cluster
    assert agg.completed_requests == 1 and list(agg.e2e) == ["z"] and no_sub_keys(agg)
    assert agg.itl["z"] == 0.0
    assert res.instances[1].completed_requests == 1 and res.instances[1].total_output_tokens == 0
    if compat == "fixed":
        assert p.phase_times() == (0, 0, 6400, 6400, 6451, 6451, 11_451)
        assert agg.ttft["z"] == agg.e2e["z"] == 11_451   # the end of its (tokenless) decode step
    else:
        assert p.phase_times() == (0, 0, 1000, 1000, 1051, 1051, 1051)
        assert (agg.ttft["z"], agg.e2e["z"]) == (6400, 1051)


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_output_parent_e2e_is_not_double_counted(impl):
    """Same request as above (fixed): the decode step runs 6451 → 11,451 (5000 µs, no token).
    Its E2E is the end of that step, never beyond it (it once was 6451 + 11,451)."""
    sim, res = run(pd_scenario(impl=impl), [req("z", 0, 40, 0)])
    agg = res.cluster
    assert agg.sim_ended_time == 11_451
    assert agg.e2e["z"] == 11_451
    assert agg.ttft["z"] <= agg.e2e["z"] == agg.completion_time["z"] <= agg.sim_ended_time


# ---------------------------------------------------------------------------- the observer
def test_prefix_threshold_observer_effect_across_requests():
    """threshold 150; A and B share a 192-token (12-block) prefix, then 60 own tokens each.
    A arrives first: nothing cached, 252 > 150 → disaggregated; its prefill placement is
    observed. B, later: 12 cached blocks, 252 − 192 = 60 → local (decode pool). D = B's
    prompt + 100 tokens: only B's *local* placement taught the decider B's 15 blocks, so
    352 − 240 = 112 → local (with A's 12 blocks alone it would be 160 → disaggregated).
    C, unrelated, 252 tokens → disaggregated. A2 = a copy of A arriving at the same instant
    as A: both are decided before A's prefill routing observes anything → both split."""
    prefix = np.arange(90_000, 90_192)

    def mk(rid, t, tail, extra=None):
        toks = np.concatenate([prefix, tail] + ([extra] if extra is not None else []))
        return Request(rid, t, toks, np.arange(5))

    tail_b = np.arange(1000, 1060)
    reqs = [mk("a", 0, np.arange(500, 560)), mk("a2", 0, np.arange(500, 560)),
            mk("b", 100_000, tail_b), Request("c", 150_000, np.arange(7000, 7252), np.arange(5)),
            mk("d", 200_000, tail_b, np.arange(3000, 3100))]
    sc = pd_scenario(n=3, P=1, D=1, decider="prefix-threshold", dparams={"threshold": 150},
                     trace={"level": "decisions"})
    sim, res = run(sc, reqs)
    assert sorted(sim.cluster.parents) == ["a", "a2", "c"]
    decisions = {r.request_id: r.disaggregate for r in res.trace.disaggregations}
    assert decisions == {"a": True, "a2": True, "b": False, "c": True, "d": False}
    by_id = {r.id: r for r in reqs}
    assert by_id["b"].assigned_instance == by_id["d"].assigned_instance == "instance_1"  # decode pool
    assert res.cluster.completed_requests == 5
    # the same workload without B: D has only A's prefix cached → disaggregated
    reqs = [mk("a", 0, np.arange(500, 560)), mk("d", 200_000, tail_b, np.arange(3000, 3100))]
    sim, _ = run(pd_scenario(decider="prefix-threshold", dparams={"threshold": 150}), reqs)
    assert sorted(sim.cluster.parents) == ["a", "d"]


# ---------------------------------------------------------------------------- pool overrides
def _roofline(compat, decode_pool):
    return Scenario.model_validate({
        "model": "qwen/qwen3-14b", "hardware": "H100", "tp": 1, "latency": {"model": "roofline"},
        "engine": {"total_kv_blocks": 2000}, "cluster": {"num_instances": 2},
        "disaggregation": {"prefill_instances": 1, "decode_instances": 1, "decider": {"policy": "always"},
                           "compat": compat, "decode_pool": decode_pool}})


@pytest.mark.parametrize("compat", ["fixed", "checkout"])
def test_decode_pool_gpu_override_changes_step_time_only_when_fixed(compat):
    """A decode pool on A100-80 while the global GPU is H100 (roofline). Both modes relabel
    the pool and auto-size its KV for the A100; only ``fixed`` times its steps with the A100
    calibration (divergences.md P5) — ``checkout`` keeps the global H100 one."""
    def reqs():
        return [Request("r", 0, np.arange(200), np.arange(20))]

    base_sc = _roofline(compat, {})
    before = base_sc.model_dump()
    base_sim, base = run(base_sc, reqs())
    sc = _roofline(compat, {"hardware": "A100-80"})
    dumped = sc.model_dump()
    sim, res = run(sc, reqs())
    assert sc.model_dump() == dumped and base_sc.model_dump() == before          # INV-P2-1
    plan = sim.pools
    dec = plan.deployments["decode"]
    assert dec.hardware == "A100-80" and plan.deployments["prefill"] is plan.global_deployment
    assert plan.global_deployment.hardware == "H100" and plan.global_deployment.total_kv_blocks == 2000
    assert sim.instances[1].kv.total_blocks == dec.total_kv_blocks != 2000      # auto-sized for A100
    assert sim.instances[0].kv.total_blocks == 2000
    # the same batch timed by each instance's model
    r = Request("x", 0, np.arange(64), np.arange(3))
    r.pi, r.num_new_tokens = 64, 1
    batch = BatchView.of([r])
    t_pre, t_dec = (inst.latency.step_time_us(batch) for inst in sim.instances)
    t_base = base_sim.instances[1].latency.step_time_us(batch)
    assert t_pre == t_base
    itl, itl_base = res.cluster.itl["r"], base.cluster.itl["r"]
    if compat == "fixed":
        assert dec.gpu.name == "A100-80"
        assert t_dec != t_base and itl != itl_base
        assert t_dec > t_base                                   # the A100 is slower per decode step
    else:
        assert dec.gpu.name == "H100"
        assert t_dec == t_base and itl == itl_base


def test_empty_pool_overrides_are_a_no_op():
    """INV-P2-1: no override ⇒ the pools use the global deployment itself."""
    sim, _ = run(pd_scenario(n=3), [req("r", 0, 20, 2)])
    plan = sim.pools
    assert plan.deployments["prefill"] is plan.deployments["decode"] is plan.global_deployment
    assert [i.kv.total_blocks for i in sim.instances] == [1000, 1000, 1000]


def test_local_routing_decode_pool_when_fixed_anywhere_under_checkout():
    """INV-P2-4: with ``never``, every request is local. fixed → decode pool only
    (instance_1), the prefill pool and the unassigned instance stay idle; checkout →
    round-robin over all three instances."""
    def reqs():
        return [req(f"r{i}", 10_000 * i, 20, 2, base=100 * i) for i in range(6)]

    fixed = reqs()
    _, res = run(pd_scenario(n=3, decider="never"), fixed)
    assert {r.assigned_instance for r in fixed} == {"instance_1"}
    assert [m.completed_requests for m in res.instances] == [0, 6, 0] and res.pd is None
    checkout = reqs()
    run(pd_scenario(n=3, decider="never", compat="checkout"), checkout)
    assert [r.assigned_instance for r in checkout] == ["instance_0", "instance_1", "instance_2"] * 2


# ---------------------------------------------------------------------------- sessions
def _session_spec(*, rounds=4, think=20_000, num=12, timeout=None, accumulate=True):
    c = {"id": "chat", "tenant_id": "t1", "slo_class": "standard", "rate_fraction": 1.0,
         "arrival": {"process": "poisson"},
         "input_distribution": {"type": "gaussian", "params": {"mean": 60, "std_dev": 10, "min": 30, "max": 90}},
         "output_distribution": {"type": "gaussian", "params": {"mean": 6, "std_dev": 2, "min": 2, "max": 10}},
         "prefix_group": "sys", "prefix_length": 16,
         "reasoning": {"multi_turn": {"max_rounds": rounds, "think_time_us": think,
                                      "context_growth": "accumulate" if accumulate else ""}}}
    if timeout is not None:
        c["timeout"] = timeout
    return c


def _run_sessions(clients, sc, num=12, rate=20.0, horizon=None):
    spec = WorkloadSpecV2.model_validate({"version": "2", "seed": 3, "aggregate_rate": rate,
                                          "num_requests": num, "clients": clients})
    wl = generate_workload(spec, horizon=horizon)
    mgr = wl.session_manager()
    ticks: dict[str, tuple[int, int]] = {}
    orig = mgr.on_request_done

    def spy(r, tick):
        ticks.setdefault(r.id, (tick, r.state))
        return orig(r, tick)

    mgr.on_request_done = spy
    sim = Simulation(sc, wl.requests, horizon_us=wl.horizon_us, sessions=mgr)
    return wl, mgr, sim, sim.run(), ticks


@pytest.mark.parametrize("impl", IMPLS)
def test_closed_loop_sessions_through_pd(impl):
    """divergences.md P9: with decider ``always`` every round is disaggregated, and the
    session callback fires with the parent at parent completion, so follow-up rounds are
    generated. INV-10: arrival(round n+1) = completion tick of round n's parent + think
    time, which (no OTPT, no post-decode overhead) is its projected completion time.
    INV-11: every session ends in exactly one state."""
    sc = pd_scenario(n=3, P=1, D=2, impl=impl, alpha=(500.0, 0.0, 0.0), beta=(3000.0, 5.0, 50.0))
    wl, mgr, sim, res, ticks = _run_sessions([_session_spec()], sc)
    c = res.sessions
    parents = sim.cluster.parents
    assert mgr.followups and c.followups == len(mgr.followups) >= 2 * len(wl.blueprints)
    everything = wl.requests + mgr.followups
    assert set(parents) == {r.id for r in everything}        # every round was disaggregated
    agg = res.cluster
    for f in mgr.followups:
        prev = _previous_round(mgr, wl, f)
        tick, state = ticks[prev]
        assert state == COMPLETED and parents[prev].completed
        assert f.arrival_us == tick + 20_000                                          # INV-10
        assert tick == agg.completion_time[prev] > parents[prev].decode_enqueue_us
        assert f.session_id and f.round_index >= 1
    # INV-11
    assert c.active == 0 and c.ended() == c.sessions == len(wl.blueprints)
    assert c.completed == c.sessions == sum(s.state == COMPLETED_SESSION for s in mgr.sessions.values())
    assert all(s.state in END_STATES for s in mgr.sessions.values())
    assert agg.completed_requests == len(everything) and no_sub_keys(agg)


def test_closed_loop_sessions_through_pd_cancelled_by_decode_drop_and_timeout():
    """Sessions that end badly on the PD path: ``accumulate`` grows the context each round
    until the decode pool (40 KV blocks = 640 tokens) can no longer pre-allocate it (dropped
    at decode KV ⇒ cancelled, dropped); an impatient client's rounds time out (⇒ cancelled,
    timeout). INV-11 holds."""
    long = _session_spec(rounds=8, think=5_000)
    impatient = dict(_session_spec(rounds=3, accumulate=False), id="impatient", tenant_id="t2",
                     prefix_group="", timeout=4_000)
    sc = pd_scenario(n=3, P=1, D=2, decode_pool={"total_kv_blocks": 40}, alpha=(500.0, 0.0, 0.0),
                     beta=(3000.0, 5.0, 50.0))
    wl, mgr, sim, res, ticks = _run_sessions([long, impatient], sc, num=16)
    c = res.sessions
    assert c.cancelled_dropped > 0 and c.cancelled_timeout > 0
    assert sim.cluster.dropped_at_decode_kv == c.cancelled_dropped
    assert c.active == 0 and c.ended() == c.sessions == len(wl.blueprints)
    states = [s.state for s in mgr.sessions.values()]
    assert states.count("cancelled") == c.cancelled and states.count("completed") == c.completed
    for s in mgr.sessions.values():
        if s.reason == "dropped":
            assert s.client_id == "chat" and ticks[s.current_id][1] == DROPPED
        if s.reason == "timeout":
            assert s.client_id == "impatient" and ticks[s.current_id][1] == TIMED_OUT
    for f in mgr.followups:                                                          # INV-10
        assert f.arrival_us == ticks[_previous_round(mgr, wl, f)][0] + mgr.sessions[f.session_id].think_time_us


def _previous_round(mgr, wl, f) -> str:
    sid = f.session_id
    chain = [r for r in wl.requests + mgr.followups if r.session_id == sid]
    return next(r.id for r in chain if r.round_index == f.round_index - 1)


# ---------------------------------------------------------------------------- decider plugin
# prompt lengths; band [100, 300] → disaggregate 1, 2 and 5
PLUGIN_ROWS = [(40, 4), (120, 4), (300, 4), (90, 4), (500, 4), (200, 4)]
IN_BAND = {"request_1", "request_2", "request_5"}


def _plugin_scenario(folder: Path, params: str = "{min_tokens: 100, max_tokens: 300}") -> Path:
    rows = [trace_row(i, 200_000 * i, n_in, n_out) for i, (n_in, n_out) in enumerate(PLUGIN_ROWS)]
    header, data = write_trace_files(folder, rows)
    sc = folder / "scenario.yaml"
    sc.write_text(f"""\
model: m
plugins: [tests.plugins.band_decider]
latency:
  model: blackbox
  alpha_coeffs: [1000.0, 0.0, 0.0]
  beta_coeffs: [5000.0, 10.0, 100.0]
engine:
  total_kv_blocks: 2000
cluster:
  num_instances: 2
disaggregation:
  prefill_instances: 1
  decode_instances: 1
  decider:
    policy: prompt-band
    params: {params}
  transfer:
    base_latency_ms: 100
    kv_bytes_per_token: 512
workload:
  kind: trace
  header: {header.name}
  data: {data.name}
""")
    return sc


def test_decider_plugin_from_scenario_through_the_cli(tmp_path):
    """``python -m blis_simpy run --scenario``: the plugin module named in ``plugins:`` is
    imported and its decider splits exactly the in-band prompts. The transfer's 100 ms base
    latency marks them: only a disaggregated request's E2E exceeds 100 ms."""
    sc = _plugin_scenario(tmp_path)
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "blis_simpy", "run", "--allow-plugins", "--scenario", str(sc),
                           "--results-path", str(out), "--format", "blis", "--trace-level", "decisions",
                           "--summarize-trace"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Disaggregated Requests: 3\nDropped at Decode KV: 0\n" in proc.stdout
    assert "Disaggregation Decisions: 6\n  Disaggregated: 3\nKV Transfers: 3\n" in proc.stdout
    rows = json.loads(out.read_text())["requests"]
    assert len(rows) == 6 and all(r["handled_by"] == "instance_1" for r in rows)
    slow = {r["requestID"] for r in rows if r["e2e_ms"] > 100}
    assert slow == IN_BAND


def test_decider_plugin_params_and_flag_override(tmp_path):
    runner = CliRunner()
    sc = _plugin_scenario(tmp_path, params="{min_tokens: 100, max_tokens: 300, min_budget: 5}")
    res = runner.invoke(app, ["run", "--allow-plugins", "--scenario", str(sc), "--format", "blis"])
    assert res.exit_code == 0, res.stderr
    assert "=== PD Metrics ===" not in res.stdout               # every budget is 4 < 5: none split
    res = runner.invoke(app, ["run", "--allow-plugins", "--scenario", str(sc), "--pd-decider", "always", "--format", "blis"])
    assert res.exit_code == 0, res.stderr
    assert "Disaggregated Requests: 6\n" in res.stdout
    sc = _plugin_scenario(tmp_path, params="{min_tokens: -1}")
    res = runner.invoke(app, ["run", "--allow-plugins", "--scenario", str(sc), "--format", "blis"])
    assert res.exit_code == 2 and "disaggregation.decider.params.min_tokens" in res.stderr
    sc = _plugin_scenario(tmp_path, params="{colour: blue}")
    res = runner.invoke(app, ["run", "--allow-plugins", "--scenario", str(sc), "--format", "blis"])
    assert res.exit_code == 2 and "disaggregation.decider.params.colour" in res.stderr


# ---------------------------------------------------------------------------- known bugs
@pytest.mark.parametrize("impl", IMPLS)
def test_stale_step_after_queued_timeout_strands_later_work(impl):
    """Decode instance (max 1 running): local a completes in its first step (0 → 1100) while
    local b waits; the work-conserving rule pushes a Step at 1100; b times out at 500; the
    Step at 1100 is stale. c's decode sub-request (transfer done at 1652) must still run."""
    sc = pd_scenario(impl=impl, decider="direct-to-decode", dparams={"threshold": 50}, max_running=1,
                     alpha=(0.0, 0.0, 0.0), beta=(1000.0, 10.0, 100.0))
    reqs = [req("a", 0, 10, 1), req("b", 0, 10, 2, base=50, deadline=500), req("c", 0, 60, 2, base=100)]
    sim, res = run(sc, reqs)
    p = sim.cluster.parents["c"]
    assert p.decode_enqueue_us == 1652
    assert p.decode_sub.state != QUEUED
    assert p.completed and res.cluster.completed_requests == 2 and res.cluster.still_queued == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_queued_decode_subrequests_holding_all_kv_deadlock(impl):
    """Two 80-token prompts (4 output tokens) reach a 10-block decode instance at the same
    instant; each would fit alone (6 blocks) but both pre-allocations (5 + 5 blocks) fill it.
    With a 1 s horizon, a correct engine finishes (or drops) both long before it."""
    sc = pd_scenario(impl=impl, n=3, P=2, D=1, alpha=(0.0, 0.0, 0.0), beta=(1000.0, 10.0, 100.0),
                     decode_pool={"total_kv_blocks": 10})
    reqs = [req("r0", 0, 80, 4), req("r1", 0, 80, 4, base=100)]
    sim, res = run(sc, reqs, horizon=1_000_000)
    parents = sim.cluster.parents
    assert parents["r0"].decode_enqueue_us == parents["r1"].decode_enqueue_us   # the setup holds
    assert all(p.decode_sub.state in (COMPLETED, DROPPED) for p in parents.values())
    assert res.cluster.still_queued == 0 and sim.instances[2].step_count < 100


def test_trace_export_of_disaggregated_requests_has_chunk_times(tmp_path):
    sc = _plugin_scenario(tmp_path)
    runner = CliRunner()
    res = runner.invoke(app, ["run", "--allow-plugins", "--scenario", str(sc), "--format", "blis",
                              "--trace-output", str(tmp_path / "exported")])
    assert res.exit_code == 0, res.stderr
    lines = (tmp_path / "exported.csv").read_text().splitlines()
    cols = lines[0].split(",")
    rows = [dict(zip(cols, line.split(","), strict=False)) for line in lines[1:]]
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert int(r["first_chunk_time_us"]) > int(r["arrival_time_us"]), r["request_id"]
        assert int(r["last_chunk_time_us"]) >= int(r["first_chunk_time_us"]), r["request_id"]


# ---------------------------------------------------------------------------- prompt hashes
def test_a_parents_prompt_is_hashed_once_and_not_kept(monkeypatch):
    """Both sub-requests use the parent's prompt hashes, computed once per parent; once the
    decode sub-request has them (or the parent failed) the kept parent does not hold them."""
    import blis_simpy.request as request_mod

    calls = []
    real = request_mod.hash_chain

    def counting(tokens, block_size, prev=b""):
        calls.append(len(tokens))
        return real(tokens, block_size, prev)

    monkeypatch.setattr(request_mod, "hash_chain", counting)
    reqs = [req(f"r{i}", 1000 * i, 100, 5, base=1000 * i) for i in range(3)]
    sim, res = run(pd_scenario(), reqs)
    assert res.cluster.completed_requests == 3
    assert calls == [96, 96, 96]          # 6 full blocks of 16 per prompt, one chain each
    for parent in sim.cluster.parents.values():
        assert parent.original._prompt_hashes is None
        assert parent.decode_sub._prompt_hashes is None       # forgotten at completion
