"""Data parallelism in the cluster: the front door behind the router, instance layout,
invariants on random lockstep runs, PD refusal, and the CLI (``--dp``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from blis_simpy.cli.app import _deployment_text, app
from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.metrics.summary import metrics_output
from blis_simpy.request import COMPLETED
from blis_simpy.run.simulation import Simulation
from tests.engine.helpers import MOE, build_dp, make_requests

MOE_CLI = ("--model", "qwen/qwen3-30b-a3b", "--hardware", "H100", "--tp", "1",
           "--latency-model", "roofline", "--num-requests", "24", "--rate", "20", "--seed", "3")


def _blackbox(dp: int, n: int = 1, **extra) -> Scenario:
    """Every step 1000 µs, no queueing delay: ranks are dense (no model config)."""
    return Scenario.model_validate({
        "model": "m", "dp": dp, "seed": 1,
        "latency": {"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1000, 0, 0]},
        "engine": {"total_kv_blocks": 500, "block_size": 16},
        "cluster": {"num_instances": n, "routing": {"policy": "round-robin"}},
        "trace": {"level": "decisions"}, **extra})


def test_front_door_overrides_the_router_and_the_records_follow_the_rank_used():
    """One engine, dp 2, round-robin router; every step 1000 µs.

    R0 (t=0, 16 in, 10 out): router -> instance_0; door: tie -> rank 0 (runs until 10000).
    R1 (t=2000, 16 in, 2 out): router -> instance_1; door: rank 0 scores 1 -> rank 1
        (steps 2000, 3000: done at 4000).
    R2 (t=5000): router -> instance_0; door: rank 0 scores 1, rank 1 0 -> rank 1.
    R3 (t=5000, routed right after R2, which is still in its queueing delay): router ->
        instance_1; door: rank 0 scores 1, rank 1 scores 4 -> rank 0.
    The trace, the in-flight counts and the instances all see the ranks actually used.
    """
    reqs = make_requests([(0, 16, 10), (2000, 16, 2), (5000, 16, 2), (5000, 16, 2)])
    sim = Simulation(_blackbox(2), reqs)
    res = sim.run()
    recs = res.trace.routings
    assert [r.reason for r in recs] == ["round-robin[0]", "round-robin[1]", "round-robin[0]",
                                        "round-robin[1]"]
    assert [r.chosen_instance for r in recs] == ["instance_0", "instance_1", "instance_1",
                                                 "instance_0"]
    assert [r.assigned_instance for r in reqs] == ["instance_0", "instance_1", "instance_1",
                                                   "instance_0"]
    assert [sorted(m.e2e) for m in res.instances] == [["request_0", "request_3"],
                                                     ["request_1", "request_2"]]
    assert sim.cluster.inflight == [0, 0]
    assert res.counters.routed == 4
    assert [m.injected_requests for m in res.instances] == [2, 2]


def test_layout_engine_major_with_per_rank_records():
    """Engine e rank r is instance e*dp + r; the JSON record says which."""
    sim = Simulation(_blackbox(3, n=2), make_requests([(0, 16, 2)]))
    assert [i.id for i in sim.instances] == [f"instance_{k}" for k in range(6)]
    assert [(i.dp_engine.index, i.dp_rank) for i in sim.instances] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(e.lockstep is None for e in sim.engines)          # dense: independent ranks
    assert sim.gpus == 6
    res = sim.run()
    out = [metrics_output(m, include_requests=False) for m in res.instances]
    assert [(o["instance_id"], o["engine"], o["dp_rank"]) for o in out][4] == ("instance_4", 1, 1)
    assert list(out[0])[:3] == ["instance_id", "engine", "dp_rank"]


def test_dp1_builds_no_engine_and_keeps_the_records_unchanged():
    """dp 1 is the plain cluster: no DPEngine, no lockstep, no engine/dp_rank keys."""
    sim = Simulation(_blackbox(1, n=2), make_requests([(0, 16, 2), (10, 16, 2)]))
    assert sim.engines == [] and all(i.dp_engine is None and i.lockstep is None
                                     for i in sim.instances)
    res = sim.run()
    assert all("engine" not in metrics_output(m, include_requests=True) for m in res.instances)
    assert "engine" not in metrics_output(res.instances[0], include_requests=False)
    assert res.gpus == 2 and res.tp == 1


def test_pd_pools_with_dp_are_refused():
    sc = _blackbox(2, n=2, disaggregation={"prefill_instances": 1, "decode_instances": 1})
    with pytest.raises(ConfigError) as e:
        Simulation(sc, [])
    assert e.value.field == "dp"
    assert "not supported with prefill/decode pools" in e.value.problem


def test_deployment_text():
    assert _deployment_text(2, 2, 2, 8) == "2 instances x TP 2 x DP 2 = 8 GPUs"
    assert _deployment_text(1, 1, 1, 1) == "1 instance x TP 1 = 1 GPU"
    assert _deployment_text(2, 0, 1, 3) == "2 instances = 3 GPUs"    # pools with TP 1 and 2


# ------------------------------------------------------------------ random lockstep runs
@st.composite
def dp_runs(draw):
    n = draw(st.integers(1, 30))
    specs = []
    t = 0
    for _ in range(n):
        t += draw(st.integers(0, 6000))
        deadline = draw(st.sampled_from([0, 0, 0, t + draw(st.integers(1, 40_000))]))
        specs.append((t, draw(st.integers(0, 200)), draw(st.integers(0, 40)), deadline))
    engine = {"block_size": draw(st.sampled_from([1, 4, 16])),
              "kv_blocks": draw(st.integers(40, 300)),
              "max_num_running_reqs": draw(st.integers(1, 8)),
              "max_num_scheduled_tokens": draw(st.integers(8, 400)),
              "scheduler": draw(st.sampled_from(["fcfs", "sjf"]))}
    horizon = draw(st.sampled_from([None, None, t // 2 + 1]))
    return specs, engine, draw(st.integers(2, 3)), draw(st.integers(1, 2)), horizon


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dp_runs())
def test_random_moe_lockstep_runs_keep_the_invariants(run):
    """Random MoE runs with dp 2/3: the end-of-run invariants hold (Simulation.run raises
    otherwise), every first token and completion falls on its engine's lockstep step ends,
    lockstep steps never overlap, and the reference and fast engines agree exactly."""
    specs, engine, dp, n, horizon = run
    results = {}
    for impl in ("reference", "fast"):
        sim = build_dp(MOE, dp=dp, n=n, impl=impl, requests=make_requests(specs, seed=7),
                       horizon_us=horizon, **engine)
        ends = [set() for _ in sim.engines]
        for e, eng in enumerate(sim.engines):
            _record_step_ends(eng.lockstep, ends[e])
        done: dict[str, int] = {}
        _record_completions(sim.cluster, done)
        res = sim.run()
        for inst, m in zip(sim.instances, res.instances, strict=True):
            grid = ends[inst.dp_engine.index]
            assert {done[r] for r in m.e2e} <= grid
            assert {m.registry[r].arrival_us + v for r, v in m.ttft.items()} <= grid
            assert inst.step_count <= inst.lockstep.steps
        assert sum(m.injected_requests for m in res.instances) == res.counters.routed
        results[impl] = [(m.ttft, m.e2e, m.itl, dict(m.all_itls), m.timed_out_requests,
                          m.preemption_count, m.still_queued, m.still_running)
                         for m in res.instances]
    assert results["fast"] == results["reference"]


def _record_completions(cluster, done: dict) -> None:
    """Record the time each request completes at (the tick the instance reports; E2E
    itself is TTFT + ITL samples, which a recompute preemption can move off the grid)."""
    orig = cluster.on_request_done

    def on_done(inst, req, tick_us):
        if req.state == COMPLETED:
            done[req.id] = tick_us
        orig(inst, req, tick_us)

    cluster.on_request_done = on_done


def _record_step_ends(group, ends: set) -> None:
    """Wrap ``group`` so every lockstep step's end time lands in ``ends`` and check that
    no step begins before the previous one ended."""
    step, step_time_us = group.step, group.step_time_us
    last = {"end": 0, "step_us": 0}

    def timed(views):
        step_us = step_time_us(views)
        last["step_us"] = max(step_us, 1)
        return step_us

    def stepped(now_us):
        before = group.steps
        nxt = step(now_us)
        if group.steps > before:           # a real step ran (not an idle wake-up)
            assert now_us >= last["end"], "a lockstep step began before the previous one ended"
            last["end"] = now_us + last["step_us"]
            ends.add(last["end"])
        return nxt

    group.step_time_us = timed
    group.step = stepped


# ------------------------------------------------------------------------------- CLI
def test_cli_run_with_dp_shows_per_rank_instances():
    res = CliRunner().invoke(app, ["run", *MOE_CLI, "--dp", "2", "--num-instances", "2",
                                   "--format", "json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["num_instances"] == 2
    got = [(i["instance_id"], i["engine"], i["dp_rank"]) for i in doc["instances"]]
    assert got == [("instance_0", 0, 0), ("instance_1", 0, 1), ("instance_2", 1, 0),
                   ("instance_3", 1, 1)]
    assert sum(i["injected_requests"] for i in doc["instances"]) == 24
    assert doc["cluster"]["completed_requests"] == 24
    assert "engine" not in doc["cluster"]


def test_cli_header_counts_gpus():
    res = CliRunner().invoke(app, ["run", *MOE_CLI, "--dp", "2", "--num-instances", "2",
                                   "--tp", "2"])
    assert res.exit_code == 0, res.stderr
    assert "2 instances x TP 2 x DP 2 = 8 GPUs" in res.stdout


def test_cli_refuses_dp_with_pd_pools():
    res = CliRunner().invoke(app, ["run", *MOE_CLI, "--dp", "2", "--num-instances", "2",
                                   "--prefill-instances", "1", "--decode-instances", "1"])
    assert res.exit_code == 2
    assert res.stderr.startswith("error: --dp: data parallelism (dp > 1) is not supported")
