"""``plan`` drops saturated deployments early (docs/planning.md, "Saturated deployments"): a
saturated run fails with its reason, ends at its last arrival, and its other seeds are not
run; the answer is the one the plan gives without the drop."""

from __future__ import annotations

from blis_simpy.planner.plan_file import load_plan
from blis_simpy.planner.plan_runner import run_plan
from tests.planner.test_plan import serial, write_plan

PLAN = """\
model: meta-llama/llama-3.1-8b-instruct
gpus: [A100-80]
workload: {{scenario: base.yaml, rate: {rate}}}
slo: {{ttft_p99_ms: 2000}}
search: {{instances: {{min: 1, max: 6}}, tp: [1], seeds: [1, 2], runner_ups: 0}}
"""


def _plan(tmp_path, rate=60):
    return load_plan(str(write_plan(tmp_path, rate, PLAN)))


def test_saturated_deployments_are_dropped_early_with_the_same_answer(tmp_path):
    plan = _plan(tmp_path)
    kept = run_plan(plan, serial, drop_saturated=False)
    dropped = run_plan(plan, serial)
    assert dropped["cheapest"]["winner"]["deployment"] == kept["cheapest"]["winner"]["deployment"]

    sat = dropped["saturation"]
    assert sat["drop_saturated"] is True and sat["deployments_dropped"] >= 1
    assert sat["seed_runs_skipped"] == sat["deployments_dropped"]          # 2 seeds: 1 skipped each
    assert dropped["runs"] == kept["runs"] - sat["seed_runs_skipped"]
    assert kept["saturation"] == {"drop_saturated": False, "deployments_dropped": 0,
                                  "runs_stopped_early": 0, "seed_runs_skipped": 0}

    last_us = 300 * (1_000_000 // 60)   # 300 arrivals 16,666 µs apart (60 req/s), the first at 16,666
    checks = [int(last_us * f) / 1e6 for f in (0.25, 0.5, 0.75, 1.0)]  # run.execute.SATURATION_CHECKS
    bad = [p for p in dropped["points"] if p["saturated"]]
    assert len(bad) == sat["deployments_dropped"]
    for p in bad:
        assert p["seed"] == 1 and not p["meets"] and p["why_not"].startswith("saturated: backlog +")
        assert p["stopped_early_s"] in checks
        assert p["metrics"]["completed_requests"] < 300
    assert sat["runs_stopped_early"] == len(bad)
    for d in dropped["deployments"]:
        assert d["saturated"] == (not d["meets_slo"] and any(
            p["deployment"]["label"] == d["label"] and p["saturated"] for p in bad))
    # a run the drop ended early is on no Pareto front
    ids = {p["id"] for p in bad}
    for front in dropped["pareto"].values():
        assert not any(set(f["runs"]) & ids for f in front)


def test_no_saturation_changes_nothing(tmp_path):
    plan = _plan(tmp_path, rate=2)
    a = run_plan(plan, serial, drop_saturated=False)
    b = run_plan(plan, serial)
    assert b["saturation"]["deployments_dropped"] == 0
    for x, y in zip(a["points"], b["points"], strict=True):
        assert x["metrics"] == y["metrics"] and x["meets"] == y["meets"]
