"""``blis-simpy plan``: branch and bound vs brute force, max-rate bisection vs a fine sweep,
pruning on random monotone problems, bad plan files.

Real runs use the blackbox backend on A100-80 (trained rows for Llama-3.1-8B at TP 1 and 2,
vLLM v0.8.4) with 300 requests, so each run takes ~0.1 s.
"""

from __future__ import annotations

import json
import math
import random
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from blis_simpy.errors import ConfigError
from blis_simpy.planner.candidates import (
    Family,
    deployment_count,
    families,
    fixed_deployment,
    judge_row,
    point,
)
from blis_simpy.planner.pareto import front
from blis_simpy.planner.plan_file import FixedDeployment, PlanSpec, load_plan
from blis_simpy.planner.plan_runner import run_plan
from blis_simpy.planner.search import brute_force, max_rate_search, search_cheapest
from blis_simpy.run.point import run_point

BASE = """\
model: meta-llama/llama-3.1-8b-instruct
vllm_version: vllm/vllm-openai:v0.8.4
latency: {model: blackbox}
workload:
  kind: distribution
  num_requests: 300
  prompt_tokens: {mean: 512, stdev: 256, min: 2, max: 2048}
  output_tokens: {mean: 128, stdev: 64, min: 2, max: 512}
"""

PLAN = """\
model: meta-llama/llama-3.1-8b-instruct
gpus: [A100-80]
workload: {{scenario: base.yaml, rate: {rate}}}
slo: {{itl_p99_ms: 42, ttft_p99_ms: 300}}
search: {{instances: {{min: 1, max: 4}}, tp: [1, 2], runner_ups: 1}}
cost: {{gpu_hour_usd: {{A100-80: 1.5}}}}
"""


def serial(points):
    return [run_point(p) for p in points]


def write_plan(tmp_path: Path, rate: float, text: str = PLAN) -> Path:
    (tmp_path / "base.yaml").write_text(BASE)
    p = tmp_path / f"plan_{rate:g}.yaml"
    p.write_text(text.format(rate=rate))
    return p


def labels(section: dict) -> list[str]:
    return [section["winner"]["deployment"]["label"]] + [r["deployment"]["label"] for r in section["runner_ups"]]


# ---------------------------------------------------------------------------- known answer
@pytest.mark.parametrize("rate, winner", [
    # rate 10: ITL p99 at TP1 is 70.5/62.6/58.8/55.8 ms for 1-4 instances, at TP2 44.8/40.8/...:
    # TP1 never meets 42 ms; TP2 needs 2 instances (4 GPUs)
    (10, "2 inst x A100-80 TP2"),
    # rate 20: TP2 needs all 4 instances (40.5 ms; 3 give 42.1)
    (20, "4 inst x A100-80 TP2"),
])
def test_plan_equals_brute_force_with_fewer_runs(tmp_path, rate, winner):
    plan = load_plan(str(write_plan(tmp_path, rate)))
    bf = run_plan(plan, serial, brute=True)["cheapest"]
    bb = run_plan(plan, serial)["cheapest"]
    assert bf["cross_product_runs"] == 8 and bf["runs"] == 8
    assert bf["non_monotone_families"] == []       # the monotonicity the search assumes holds here
    assert labels(bb) == labels(bf) == [winner]    # TP1 never meets: no runner-up
    assert bb["winner"]["cost"] == bf["winner"]["cost"] == bb["winner"]["gpus"] * 1.5
    assert bb["winner"]["metrics"] == bf["winner"]["metrics"]
    assert bb["runs"] < bf["runs"]


def test_plan_cli_json_and_out_file(tmp_path):
    """The CLI on the real executor is covered below; here: --serial, --format json, --out."""
    path = write_plan(tmp_path, 10)
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(app, ["plan", str(path), "--serial", "--format", "json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert json.loads(out.read_text()) == doc
    assert doc["format"] == "blis-simpy-plan" and doc["version"] == 1
    assert doc["cheapest"]["winner"]["deployment"]["label"] == "2 inst x A100-80 TP2"
    assert doc["runs"] == len(doc["points"]) == doc["cheapest"]["runs"]
    for p in doc["points"]:
        assert p["status"] == "ok" and p["rate"] == 10 and p["seed"] == 42
        assert p["meets"] == (p["deployment"]["tp"] == 2 and p["deployment"]["instances"] >= 2)
    # cost vs TTFT front: sorted by cost, TTFT strictly falling
    f = doc["pareto"]["cost_vs_ttft_p99"]
    assert [x["cost"] for x in f] == sorted(x["cost"] for x in f)
    assert all(a["ttft_p99_ms"] > b["ttft_p99_ms"] for a, b in zip(f, f[1:], strict=False))
    # the flat list `blis-simpy report` reads: every deployment judged, cheapest first
    deps = doc["deployments"]
    assert len(deps) == doc["runs"] and [d["cost_per_hour_usd"] for d in deps] == sorted(1.5 * d["gpus"] for d in deps)
    assert {d["label"] for d in deps if d["meets_slo"]} == {p["deployment"]["label"] for p in doc["points"] if p["meets"]}
    table = CliRunner().invoke(app, ["plan", str(path), "--serial"])
    assert table.exit_code == 0 and "winner" in table.stdout and "of 8 in the full cross product" in table.stdout


@pytest.fixture(scope="module")
def executor():
    from blis_simpy.planner.executor import Executor
    with Executor(n_workers=2) as ex:
        yield ex


def test_plan_on_a_local_dask_cluster(tmp_path, executor):
    """Two workers, two families bisected side by side: the same answer as the serial brute force."""
    plan = load_plan(str(write_plan(tmp_path, 20)))
    doc = run_plan(plan, lambda pts: executor.map(run_point, pts, progress=False), parallel=2)
    assert labels(doc["cheapest"]) == ["4 inst x A100-80 TP2"]
    assert doc["cheapest"]["runs"] < 8
    assert all(p["status"] == "ok" for p in doc["points"])


def _no_wall(obj):
    if isinstance(obj, dict):
        return {k: _no_wall(v) for k, v in obj.items() if k != "wall_s"}
    return [_no_wall(v) for v in obj] if isinstance(obj, list) else obj


def test_plan_document_does_not_depend_on_the_executor(tmp_path):
    """--parallel defaults to a constant, not the executor's workers: the families searched
    side by side decide which points run and in what order (their ids, the Pareto fronts'
    runs), so a default tied to the workers made --serial and --workers 2 write different
    documents for the same plan. Only the wall times may differ."""
    path = write_plan(tmp_path, 20)
    docs = []
    for how in (["--serial"], ["--workers", "2"]):
        res = CliRunner().invoke(app, ["plan", str(path), "--format", "json", *how])
        assert res.exit_code == 0, res.output
        docs.append(_no_wall(json.loads(res.stdout)))
    assert docs[0] == docs[1]


# ---------------------------------------------------------------------------- max rate
def test_max_rate_bisection_matches_a_fine_sweep(tmp_path):
    plan = load_plan(str(write_plan(tmp_path, 10)))
    dep = fixed_deployment(FixedDeployment(gpu="A100-80", tp=2, instances=2))
    slo = plan.spec.slo.thresholds_ms

    def meets(rate):
        row = run_point(point(plan, dep, 42, rate))
        assert row["status"] == "ok", row["error"]
        return all(row[f"m.{k}"] <= v for k, v in slo.items()) and row["m.completed_requests"] == 300

    step = 0.5
    grid = [2 + step * i for i in range(int((20 - 2) / step) + 1)]
    sweep = [meets(r) for r in grid]
    assert sweep[0] and not sweep[-1]
    first_fail = sweep.index(False)
    assert all(not s for s in sweep[first_fail:])          # monotone in the rate on this grid
    fine = grid[first_fail - 1]

    @dataclass
    class V:
        meets: bool

    for tol in (1.0, 0.25):
        r = max_rate_search(lambda rate: V(meets(rate)), 2.0, 20.0, tol)
        assert r.failing - r.sustained <= tol
        assert abs(r.sustained - fine) <= max(tol, step)
        assert len(r.probes) <= 2 + math.ceil(math.log2(18 / tol))


def test_max_rate_from_the_plan_file(tmp_path):
    text = PLAN + "max_rate: {{deployment: winner, min_rate: 2, max_rate: 40, tolerance: 2}}\n"
    doc = run_plan(load_plan(str(write_plan(tmp_path, 10, text))), serial)
    m = doc["max_rate"]
    assert m["deployment"]["label"] == "2 inst x A100-80 TP2"
    assert m["failing_rate"] - m["sustained_rate"] <= 2
    assert 10 <= m["sustained_rate"] < 20        # it meets at 10 req/s, and needs 4 instances at 20
    assert m["runs"] == len(m["probes"]) == sum(p["phase"] == "max_rate" for p in doc["points"])


# ---------------------------------------------------------------------------- pure logic
@dataclass
class Verdict:
    meets: bool
    score: float


def random_problem(rng: random.Random):
    """Random families with a monotone feasibility threshold (or none) and random scores."""
    fams, need = [], {}
    for i in range(rng.randint(1, 7)):
        counts = tuple(sorted(rng.sample(range(1, 13), rng.randint(1, 8))))
        fam = Family(f"g{rng.randint(0, 2)}", rng.choice([1, 2, 4]), 1, False, i % 3, counts,
                     price=rng.choice([1.0, 1.0, 2.5, 3.0]))
        fams.append(fam)
        need[fam.key] = rng.choice([None, *range(1, 13)])
    scores = {}

    def judge(items):
        out = []
        for fam, c in items:
            t = need[fam.key]
            score = scores.setdefault((fam.key, c), rng.choice([10.0, 20.0, 30.0]))
            out.append(Verdict(t is not None and c >= t, score))
        return out
    # families must have distinct keys
    keys = [f.key for f in fams]
    return fams if len(set(keys)) == len(keys) else fams[:1], judge


def test_pruning_never_skips_the_optimum():
    rng = random.Random(12)
    saved = 0
    for _ in range(400):
        fams, judge = random_problem(rng)
        keep = rng.randint(1, 3)
        bf = brute_force(fams, judge, keep=keep)
        for parallel in (1, 3):
            bb = search_cheapest(fams, judge, keep=keep, parallel=parallel)
            assert [(f.family.key, f.count) for f in bb.best] == [(f.family.key, f.count) for f in bf.best]
            assert len(bb.runs) <= len(bf.runs)
            assert len(bb.searched) + len(bb.skipped) == len(fams)
        saved += len(bf.runs) - len(search_cheapest(fams, judge, keep=keep).runs)
    assert saved > 0


def test_search_on_a_hand_checked_case():
    """Two families, 8 counts each; the first meets from 5 on, the second (TP 2, twice the GPUs
    per instance) from 2 on. Cost = GPUs. The first: 1 (no), 8 (yes), then bisection over 2-7:
    5 (yes), 3 (no), 4 (no): 5 GPUs. Bound 5: the second family may only try 1 and 2 (2 and 4
    GPUs): 1 (no), 2 (yes): 4 GPUs."""
    a = Family("H100", 1, 1, False, 0, tuple(range(1, 9)))
    b = Family("H100", 2, 1, False, 0, tuple(range(1, 9)))
    need = {a.key: 5, b.key: 2}
    calls = []

    def judge(items):
        calls.extend((f.tp, c) for f, c in items)
        return [Verdict(c >= need[f.key], 0.0) for f, c in items]

    res = search_cheapest([a, b], judge)
    assert calls == [(1, 1), (1, 8), (1, 5), (1, 3), (1, 4), (2, 1), (2, 2)]
    assert (res.winner.family.tp, res.winner.count, res.winner.cost) == (2, 2, 4)


@pytest.mark.parametrize("done, offered, fraction, meets", [
    # exactly the fraction: "at least" holds. 0.55 * 100 and 0.07 * 100 are 55.00000000000001
    # and 7.000000000000001 in floats: judged as fewer than 55 / 7 of 100 before
    (55, 100, 0.55, True), (7, 100, 0.07, True), (28, 100, 0.28, True), (21, 300, 0.07, True),
    (54, 100, 0.55, False), (6, 100, 0.07, False), (198, 200, 0.99, True), (197, 200, 0.99, False),
])
def test_the_completed_fraction_is_at_least_exactly(done, offered, fraction, meets):
    row = {"status": "ok", "m.completed_requests": done, "m.ttft_p99_ms": 10.0}
    got = judge_row(row, {"ttft_p99_ms": 10.0}, fraction, offered)
    assert got == ((True, "") if meets else (False, f"completed {done}/{offered} < {fraction:g}"))


def test_pareto_front():
    pts = [(1, 50.0), (2, 40.0), (2, 30.0), (3, 35.0), (4, 10.0), (5, None)]
    assert front(pts, lambda p: p[0], lambda p: p[1]) == [(1, 50.0), (2, 30.0), (4, 10.0)]
    assert front(pts, lambda p: p[0], lambda p: p[1], maximize=True) == [(1, 50.0)]


# ---------------------------------------------------------------------------- bad plans
@pytest.mark.parametrize("text, expected", [
    ("model: m\n", "plan.yaml: gpus: required key is missing"),
    (PLAN.format(rate=5) + "bogus: 1\n", "plan.yaml:7: bogus: unknown key"),
    (PLAN.format(rate=5).replace("runner_ups: 1", "runner_ups: 1, extra: 2"),
     "plan.yaml:5: search.extra: unknown key"),
    (PLAN.format(rate=5).replace("itl_p99_ms: 42", "itl_p42_ms: 42"), "plan.yaml:4: slo.itl_p42_ms: unknown key"),
    (PLAN.format(rate=5).replace("[A100-80]", "[A100-80, TPU9]"), "plan.yaml:2: gpus[1]: unknown GPU 'TPU9'"),
    (PLAN.format(rate=5).replace("min: 1, max: 4", "min: 5, max: 4"),
     "plan.yaml:5: search.instances: min (5) must be <= max (4)"),
    (PLAN.format(rate=5).replace("A100-80: 1.5", "H100: 1.5"), "plan.yaml:2: gpus[0]: no price for GPU 'A100-80'"),
    (PLAN.format(rate=5).replace("rate: 5", "rate: -5"), "plan.yaml:3: workload.rate: input should be greater than 0"),
    (PLAN.format(rate=5).replace("base.yaml", "missing.yaml"), "plan.yaml:3: workload.scenario: base scenario:"),
    (PLAN.format(rate=5) + "max_rate: {min_rate: 5, max_rate: 2}\n",
     "plan.yaml:7: max_rate: min_rate (5) must be < max_rate (2)"),
    ("model: [unclosed\n", "plan.yaml:2: invalid YAML"),
    # the plan's own workload keys and seeds are located (were "no candidate deployment can
    # be built: 1 inst x A100-80 TP1: workload.prompt_tokens.mean: ...", no line)
    (PLAN.format(rate=5).replace("rate: 5", "rate: 5, prompt_tokens: {mean: 9000, stdev: 1, min: 2, max: 100}"),
     "plan.yaml:3: workload.prompt_tokens.mean: 9000 is above max 100: the mean must lie in"),
    (PLAN.format(rate=5).replace("runner_ups: 1", "runner_ups: 1, seeds: [1, 9223372036854775808]"),
     "plan.yaml:5: search.seeds[1]: input should be less than or equal to 9223372036854775807"),
])
def test_bad_plan_files_exit_2_with_one_line(tmp_path, text, expected):
    (tmp_path / "base.yaml").write_text(BASE)
    p = tmp_path / "plan.yaml"
    p.write_text(text)
    res = CliRunner().invoke(app, ["plan", str(p), "--serial"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path}/{expected}"), lines


@pytest.mark.parametrize("bad, expected", [
    # a plan file's `gpus:` list in a base scenario: AttributeError (exit 1) in gpu_catalog
    ("gpus: [A100-80]\n", "base.yaml:9: gpus: input should be a mapping"),
    ("hardware_config: [1]\n", "base.yaml:9: hardware_config: input should be a valid string"),
    ("cluster: []\n", "base.yaml:9: cluster: input should be a mapping"),
])
def test_a_base_scenario_of_wrong_types_is_one_located_line(tmp_path, bad, expected):
    """The base scenario is validated as `run --scenario` validates it: its file and key."""
    (tmp_path / "base.yaml").write_text(BASE + bad)
    p = tmp_path / "plan.yaml"
    p.write_text(PLAN.format(rate=5))
    res = CliRunner().invoke(app, ["plan", str(p), "--serial"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert lines == [f"error: {p}:3: workload.scenario: base scenario: {tmp_path}/{expected}"], lines


_NO_BASE = PLAN.format(rate=5).replace("scenario: base.yaml, ", "").replace(
    "rate: 5}", "rate: 5, num_requests: 100}")


@pytest.mark.parametrize("text, expected", [
    # a 1,000,000-item instance list took 40 s and 1.7 GB of YAML building before it was
    # refused; now parsing stops at the node cap (these 25,000 items were accepted)
    (_NO_BASE.replace("{min: 1, max: 4}", "[" + ", ".join(["1"] * 25_000) + "]"),
     "plan.yaml:5: more than 20,000 keys and values, the most a plan file may have"),
    (_NO_BASE.replace("{min: 1, max: 4}", str(list(range(1, 5001)))),
     "plan.yaml:5: search.instances: at most 4096 instance counts, got 5000"),
    (_NO_BASE.replace("A100-80: 1.5", ", ".join(f"G{i}: 1" for i in range(65))),
     "plan.yaml:6: cost.gpu_hour_usd: at most 64 prices, got 65"),
])
def test_plan_sizes_are_capped_while_parsing(tmp_path, text, expected):
    p = tmp_path / "plan.yaml"
    p.write_text(text)
    res = CliRunner().invoke(app, ["plan", str(p), "--serial"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines() == [f"error: {tmp_path}/{expected}"]


def test_the_search_space_is_counted_before_it_is_built(tmp_path):
    """4.2 million disaggregated deployments: refused from their count, with no family built
    (building them peaked at 110 MB traced; larger grids ended in a MemoryError)."""
    p = tmp_path / "plan.yaml"
    p.write_text(_NO_BASE.replace("{min: 1, max: 4}, tp: [1, 2]",
                                  "{min: 1, max: 1024}, tp: [1, 2, 3, 4, 5, 6, 7, 8], "
                                  "pd: {disaggregated: true}"))
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"plan.yaml:5: search: the search space has 4198400 "
                                              r"deployments \(at most 100000\)"):
            load_plan(str(p))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, peak


@pytest.mark.parametrize("seed", range(30))
def test_deployment_count_equals_the_families_built(seed):
    rng = random.Random(seed)
    spec = PlanSpec.model_validate({
        "model": "m", "gpus": rng.sample(["A", "B", "C"], rng.randint(1, 3)),
        "max_gpus": rng.choice([None, 1, 3, 8, 20]),
        "workload": {"rate": 1}, "slo": {"ttft_p99_ms": 1},
        "search": {"instances": rng.choice([{"min": rng.randint(1, 3), "max": rng.randint(3, 12)},
                                            rng.sample(range(1, 16), rng.randint(1, 6))]),
                   "tp": rng.sample([1, 2, 4, 8], rng.randint(1, 4)),
                   "dp": rng.sample([1, 2, 3], rng.randint(1, 3)),
                   "ep": rng.sample([False, True], rng.randint(1, 2)),
                   "pd": rng.choice([{"colocated": True, "disaggregated": True},
                                     {"colocated": False, "disaggregated": True},
                                     {"colocated": True}])}})
    assert deployment_count(spec) == sum(len(f.counts) for f in families(spec))


def test_a_plan_no_deployment_can_build_is_an_error(tmp_path):
    """vLLM v0.11.0 has no trained A100-80 rows: every candidate fails validation."""
    (tmp_path / "base.yaml").write_text(BASE.replace("v0.8.4", "v0.11.0"))
    p = tmp_path / "plan.yaml"
    p.write_text(PLAN.format(rate=5))
    res = CliRunner().invoke(app, ["plan", str(p), "--serial"])
    assert res.exit_code == 2
    assert res.stderr.startswith(f"error: {p}: no candidate deployment can be built: 1 inst x A100-80 TP1:")


def test_a_plan_workload_takes_the_run_scenarios_distribution_keys(tmp_path):
    """`arrival: poisson` was an unknown key in a plan's workload though `run --scenario`
    takes it: the plan's keys are the scenario's DistributionWorkload schema, each optional."""
    from blis_simpy.config.scenario import DistributionWorkload
    from blis_simpy.planner.plan_file import DISTRIBUTION_KEYS

    assert set(DISTRIBUTION_KEYS) == set(DistributionWorkload.model_fields) - {"kind"}
    text = PLAN.format(rate=5).replace("rate: 5}", "rate: 5, arrival: gamma, arrival_cv: 2.5}")
    p = tmp_path / "plan.yaml"
    (tmp_path / "base.yaml").write_text(BASE)
    p.write_text(text)
    plan = load_plan(str(p))
    pt = point(plan, fixed_deployment(FixedDeployment(gpu="A100-80", tp=1, instances=1)), 42)
    wl = pt["scenario"]["workload"]
    assert (wl["arrival"], wl["arrival_cv"], wl["rate"], wl["num_requests"]) == ("gamma", 2.5, 5, 300)
    # the scenario's constraints come along: arrival_cv is at most 1000
    p.write_text(text.replace("arrival_cv: 2.5", "arrival_cv: 2000"))
    with pytest.raises(ConfigError) as e:
        load_plan(str(p))
    assert str(e.value).startswith(f"{p}:3: workload.arrival_cv: input should be less than or equal to 1000")


@pytest.mark.parametrize("old, new, expected", [
    ("ttft_p99_ms: 300", "ttft_p99_mss: 300", "plan.yaml:4: slo.ttft_p99_mss: unknown key (did you mean ttft_p99_ms"),
    ("rate: 5}", "rate: 5, arival: poisson}", "plan.yaml:3: workload.arival: unknown key (did you mean arrival"),
    ("tp: [1, 2]", "tpp: [1, 2]", "plan.yaml:5: search.tpp: unknown key (did you mean tp?)"),
    ("runner_ups: 1", "runner_ups: 1, zzz: 1", "plan.yaml:5: search.zzz: unknown key"),
])
def test_an_unknown_plan_key_names_the_closest_known_ones(tmp_path, old, new, expected):
    (tmp_path / "base.yaml").write_text(BASE)
    p = tmp_path / "plan.yaml"
    p.write_text(PLAN.format(rate=5).replace(old, new))
    with pytest.raises(ConfigError) as e:
        load_plan(str(p))
    assert str(e.value).startswith(f"{tmp_path}/{expected}"), str(e.value)
    if "zzz" in new:
        assert "did you mean" not in str(e.value)
