"""Plan benchmark (issue 12 target): ``plan`` for Qwen3-14B on up to 8 H100s at 30 req/s
(scenarios/plans/qwen3_14b_h100.yaml: physics backend, p99 TTFT <= 150 ms, p99 ITL <= 25 ms)
must use at most a quarter of the runs of the full cross product and return the same answer.

Runs the plan's search (branch and bound + bisection) and then the brute force (every
deployment of the cross product) on the same executor (a Dask LocalCluster), and prints
runs, wall times and both answers (winner and runner-ups); exits 1 if the answers differ or
the search used more than a quarter of the runs.

Usage: ``python bench/plan_target.py [--plan FILE] [--workers 2] [--parallel K] [--serial]``.
Wall times depend on the machine and its load (this repository's figures come from a shared
2-core machine): the run counts are the target, not the seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from blis_simpy.planner import DEFAULT_PARALLEL
from blis_simpy.planner.plan_file import load_plan
from blis_simpy.planner.plan_runner import quiet_simulator_logs, run_plan
from blis_simpy.run.point import run_point

ROOT = Path(__file__).resolve().parents[1]


def answer(doc: dict) -> list[str]:
    c = doc["cheapest"]
    best = ([c["winner"]] if c["winner"] else []) + c["runner_ups"]
    return [f"{b['deployment']['label']} ({b['gpus']} GPUs, cost {b['cost']:g})" for b in best]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", default=str(ROOT / "scenarios" / "plans" / "qwen3_14b_h100.yaml"))
    ap.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    ap.add_argument("--parallel", type=int, default=None, help="families in flight (default: the CLI's, planner.DEFAULT_PARALLEL)")
    ap.add_argument("--serial", action="store_true", help="run points in this process, no Dask")
    args = ap.parse_args()
    plan = load_plan(args.plan)
    plan.spec.max_rate = None          # (a) only: the cross product has no rate axis

    def both(run_points, parallel: int) -> tuple[dict, float, dict, float]:
        t0 = time.perf_counter()
        search = run_plan(plan, run_points, parallel=parallel)
        t1 = time.perf_counter()
        brute = run_plan(plan, run_points, brute=True)
        return search, t1 - t0, brute, time.perf_counter() - t1

    quiet_simulator_logs()
    if args.serial:
        search, ts, brute, tb = both(lambda pts: [run_point(p) for p in pts], args.parallel or DEFAULT_PARALLEL)
        where = "serial (this process)"
    else:
        from blis_simpy.planner.executor import Executor
        with Executor(n_workers=args.workers) as ex:
            ex.client.run(quiet_simulator_logs)
            search, ts, brute, tb = both(lambda pts: ex.map(run_point, pts, progress=False),
                                         args.parallel or DEFAULT_PARALLEL)
        where = f"Dask LocalCluster, {args.workers} workers"
    s, b = search["cheapest"], brute["cheapest"]
    print(f"plan {args.plan} on {where}")
    print(f"  search:      {s['runs']:3d} runs  {ts:6.1f} s  "
          f"({s['families_searched']} of {s['families']} families searched, {s['families_skipped']} skipped)")
    print(f"  brute force: {b['runs']:3d} runs  {tb:6.1f} s  (the full cross product)")
    print(f"  runs ratio:  {s['runs'] / b['runs']:.3f} (target <= 0.25)")
    print(f"  search answer:      {'; '.join(answer(search))}")
    print(f"  brute-force answer: {'; '.join(answer(brute))}")
    if b["non_monotone_families"]:
        print(f"  not monotone in the instance count: {', '.join(b['non_monotone_families'])}")
    same = answer(search) == answer(brute)
    ok = same and s["runs"] * 4 <= b["runs"]
    print(f"  same answer: {'yes' if same else 'NO'}; target {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
