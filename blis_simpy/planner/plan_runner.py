"""Run a plan: judge deployments by simulating them, and gather the plan's result document.

:class:`PlanRunner` turns a candidate (deployment, rate) into one point per seed, runs them
through an injected ``run_points(points) -> rows`` (the executor's map of the CLI's
``run_point``, or a plain loop), caches verdicts and records every run. :func:`run_plan`
answers the plan's questions and returns the JSON document described in docs/planning.md
("Plan output").
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blis_simpy.planner.candidates import (
    KEPT_METRICS,
    Candidate,
    Family,
    families,
    fixed_deployment,
    goodput_rps,
    judge_row,
    offered_requests,
    point,
    price_of,
)
from blis_simpy.planner.pareto import front
from blis_simpy.planner.search import (
    Found,
    SearchResult,
    brute_force,
    cross_product_size,
    max_rate_search,
    search_cheapest,
)

RunPoints = Callable[[list[dict]], list[dict]]
#: the plan output's format version
FORMAT_VERSION = 1
#: per-request targets of the scenario ``slo:`` keys, from the plan's percentile thresholds
_STAT_ORDER = ("p99", "p95", "p90", "mean")



def quiet_simulator_logs(level: int = logging.CRITICAL + 1) -> int:
    """Silence the simulator's per-run log lines (dropped requests, KV allocation failures):
    a plan judges every run by its SLOs and records why it fails. Returns the old level."""
    log = logging.getLogger("blis_simpy")
    old = log.level
    log.setLevel(level)
    return old


@dataclass
class Verdict:
    """A deployment at a rate, judged over every seed: ``meets`` when every seed's run meets
    the SLOs; ``metrics`` are the worst over the seeds (highest latency, lowest throughput)."""

    deployment: Candidate
    rate: float | None
    meets: bool
    why: str
    cost: float
    metrics: dict
    goodput_rps: float | None
    runs: list[int]            # indexes into PlanRunner.records
    run_rate: float | None = None   # the arrival rate the runs used (req/s; None: a trace)

    @property
    def score(self) -> float:
        v = self.metrics.get("ttft_p99_ms")
        return float(v) if isinstance(v, (int, float)) else math.inf

    def as_dict(self) -> dict:
        return {"deployment": self.deployment.as_dict(), "rate": self.run_rate, "meets": self.meets,
                "why_not": self.why, "cost": self.cost, "gpus": self.deployment.gpus,
                "metrics": self.metrics, "goodput_rps": self.goodput_rps, "runs": self.runs}


def scenario_slo(thresholds_ms: dict[str, float]) -> dict:
    """The scenario's per-request ``slo:`` targets (goodput) from the plan's thresholds: per
    metric, the threshold of its highest percentile named (p99, else p95, p90, mean)."""
    out = {}
    for metric in ("ttft", "itl", "e2e"):
        for stat in _STAT_ORDER:
            v = thresholds_ms.get(f"{metric}_{stat}_ms")
            if v is not None:
                out[f"{metric}_ms"] = v
                break
    return out


class PlanRunner:
    """Judges candidates by running them (one point per seed); caches and records every run."""

    def __init__(self, plan, run_points: RunPoints, *, on_batch: Callable[[int], None] | None = None,
                 drop_saturated: bool | None = None):
        self.plan = plan
        self.spec = plan.spec
        self.run_points = run_points
        self.on_batch = on_batch
        self.records: list[dict] = []
        self.cache: dict[tuple, Verdict] = {}
        self.seeds = self.spec.search.seeds if self.spec.search is not None else [42]
        self.slo_targets = scenario_slo(self.spec.slo.thresholds_ms)
        #: drop saturated deployments early (docs/planning.md, "Saturated deployments")
        self.drop_saturated = self.spec.slo.drop_saturated if drop_saturated is None else drop_saturated
        self.seed_runs_skipped = 0       # runs of other seeds not made: the first was saturated

    def _point(self, dep: Candidate, seed: int, rate: float | None) -> dict:
        pt = point(self.plan, dep, seed, rate)
        if self.slo_targets:
            pt["scenario"]["slo"] = dict(self.slo_targets)
        if self.drop_saturated:
            pt["stop_when_saturated"] = True
        return pt

    def _run(self, todo: list[tuple], seeds: Sequence[int]) -> list[tuple[tuple, int, dict, dict]]:
        """Run every seed of ``seeds`` for every key of ``todo``, as one batch:
        ``(key, seed, point, row)``."""
        pts, owners = [], []
        for key in todo:
            for seed in seeds:
                pts.append(self._point(key[0], seed, key[1]))
                owners.append((key, seed))
        rows = self.run_points(pts) if pts else []
        if self.on_batch is not None and pts:
            self.on_batch(len(pts))
        return [(key, seed, pt, row) for (key, seed), pt, row in zip(owners, pts, rows, strict=True)]

    def judge(self, items: Sequence[tuple[Candidate, float | None]], phase: str) -> list[Verdict]:
        todo = list(dict.fromkeys(k for k in items if k not in self.cache))
        if self.drop_saturated and len(self.seeds) > 1:
            # the first seed of each, then the other seeds of those not saturated
            done = self._run(todo, self.seeds[:1])
            dropped = {key for key, _, _, row in done if row.get("saturated")}
            self.seed_runs_skipped += len(dropped) * (len(self.seeds) - 1)
            done += self._run([k for k in todo if k not in dropped], self.seeds[1:])
            order = {(k, s): i for i, (k, s) in
                     enumerate((k, s) for k in todo for s in self.seeds)}
            done.sort(key=lambda r: order[(r[0], r[1])])
        else:
            done = self._run(todo, self.seeds)
        by_key: dict[tuple, list[tuple[int, dict, dict]]] = {}
        slo = self.spec.slo
        for key, seed, pt, row in done:
            meets, why = judge_row(row, slo.thresholds_ms, slo.min_completed_fraction,
                                   offered_requests(pt))
            dep, rate = key
            rec = {"id": len(self.records), "phase": phase, "deployment": dep.as_dict(),
                   "rate": _rate_of(pt), "seed": seed, "status": row.get("status"),
                   "error": row.get("error") or "", "meets": meets, "why_not": why,
                   "cost": dep.gpus * price_of(self.spec, dep.gpu), "gpus": dep.gpus,
                   "wall_s": row.get("wall_s"), "config_hash": row.get("config_hash"),
                   "metrics": {k: row.get(f"m.{k}") for k in KEPT_METRICS},
                   "goodput_rps": goodput_rps(row)}
            if self.drop_saturated:
                rec["saturated"] = bool(row.get("saturated"))
                rec["stopped_early_s"] = row.get("stopped_early_s")
            self.records.append(rec)
            by_key.setdefault(key, []).append((rec["id"], rec, row))
        for key, runs in by_key.items():
            self.cache[key] = self._verdict(key, runs)
        return [self.cache[k] for k in items]

    def _verdict(self, key, runs) -> Verdict:
        dep, rate = key
        recs = [r for _, r, _ in runs]
        meets = all(r["meets"] for r in recs)
        why = next((r["why_not"] for r in recs if not r["meets"]), "")
        metrics = {}
        for k in KEPT_METRICS:
            vals = [r["metrics"][k] for r in recs if isinstance(r["metrics"].get(k), (int, float))]
            if vals:
                higher_is_better = k in ("responses_per_sec", "completed_requests")
                metrics[k] = min(vals) if higher_is_better else max(vals)
        goods = [r["goodput_rps"] for r in recs if r["goodput_rps"] is not None]
        return Verdict(dep, rate, meets, why, dep.gpus * price_of(self.spec, dep.gpu), metrics,
                       min(goods) if len(goods) == len(recs) and goods else None,
                       [i for i, _, _ in runs], recs[0]["rate"])

    # judges in the shapes the search functions want
    def family_judge(self, phase: str = "search"):
        def judge(items: list[tuple[Family, int]]) -> list[Verdict]:
            return self.judge([(f.deployment(c), None) for f, c in items], phase)
        return judge

    def rate_judge(self, dep: Candidate):
        def judge(rate: float) -> Verdict:
            return self.judge([(dep, rate)], "max_rate")[0]
        return judge


def _rate_of(pt: dict) -> float | None:
    wl = pt["scenario"].get("workload") or {}
    r = wl.get("rate")
    return float(r) if isinstance(r, (int, float)) and wl.get("kind", "distribution") == "distribution" else None


def _found(f: Found) -> dict:
    return f.verdict.as_dict()


def run_plan(plan, run_points: RunPoints, *, parallel: int = 1, brute: bool = False,
             on_batch: Callable[[int], None] | None = None, drop_saturated: bool | None = None) -> dict:
    """Answer the plan: (a) the cheapest deployment (``brute``: by running the whole cross
    product instead of the pruned search), (b) the highest sustained rate. Returns the plan
    output document (docs/planning.md, "Plan output"). ``drop_saturated``: overrides the
    plan's ``slo.drop_saturated``."""
    spec = plan.spec
    runner = PlanRunner(plan, run_points, on_batch=on_batch, drop_saturated=drop_saturated)
    t0 = time.perf_counter()
    doc: dict = {"format": "blis-simpy-plan", "version": FORMAT_VERSION, "plan": _plan_summary(plan),
                 "cheapest": None, "max_rate": None}
    winner: Candidate | None = None
    if spec.search is not None:
        fams = families(spec)
        keep = 1 + spec.search.runner_ups
        judge = runner.family_judge("brute_force" if brute else "search")
        res: SearchResult = (brute_force(fams, judge, keep=keep) if brute else
                             search_cheapest(fams, judge, keep=keep, parallel=parallel))
        winner = res.winner.deployment if res.winner else None
        n = cross_product_size(fams)
        runs = sum(1 for r in runner.records if r["phase"] in ("search", "brute_force"))
        doc["cheapest"] = {
            "method": "brute_force" if brute else "branch_and_bound",
            "winner": _found(res.winner) if res.winner else None,
            "runner_ups": [_found(f) for f in res.best[1:]],
            "runs": runs, "deployments_judged": len(res.runs),
            "cross_product_deployments": n, "cross_product_runs": n * len(runner.seeds),
            "families": len(fams), "families_searched": len(res.searched),
            "families_skipped": len(res.skipped),
            "non_monotone_families": [f.label for f in res.non_monotone],
            "wall_s": time.perf_counter() - t0,
        }
    m = spec.max_rate
    if m is not None:
        t1 = time.perf_counter()
        dep = winner if m.deployment == "winner" else fixed_deployment(m.deployment)
        if dep is None:
            doc["max_rate"] = {"deployment": None, "why_not": "no deployment meets the SLOs"}
        else:
            r = max_rate_search(runner.rate_judge(dep), m.min_rate, m.max_rate, m.tolerance)
            doc["max_rate"] = {
                "deployment": dep.as_dict(), "sustained_rate": r.sustained, "failing_rate": r.failing,
                "min_rate": m.min_rate, "max_rate": m.max_rate, "tolerance": m.tolerance,
                "probes": [{"rate": rate, "meets": v.meets, "why_not": v.why, "runs": v.runs}
                           for rate, v in r.probes],
                "runs": sum(1 for rec in runner.records if rec["phase"] == "max_rate"),
                "wall_s": time.perf_counter() - t1,
            }
    doc["saturation"] = saturation_summary(runner)
    doc["pareto"] = pareto_fronts(runner)
    doc["deployments"] = deployments(runner)
    doc["runs"] = len(runner.records)
    doc["wall_s"] = time.perf_counter() - t0
    doc["points"] = runner.records
    return doc


def saturation_summary(runner: PlanRunner) -> dict:
    """How many deployments were dropped as saturated (docs/planning.md, "Saturated
    deployments"): ``drop_saturated`` (on or off), ``deployments_dropped`` (verdicts whose
    runs were saturated), ``runs_stopped_early`` (runs ended at their last arrival) and
    ``seed_runs_skipped`` (runs of other seeds not made)."""
    recs = runner.records
    return {"drop_saturated": runner.drop_saturated,
            "deployments_dropped": sum(1 for v in runner.cache.values()
                                       if any(recs[i].get("saturated") for i in v.runs)),
            "runs_stopped_early": sum(1 for r in recs if r.get("stopped_early_s") is not None),
            "seed_runs_skipped": runner.seed_runs_skipped}


def pareto_fronts(runner: PlanRunner) -> dict:
    """Fronts over the deployments judged at the plan's rate (the search's), by verdict id."""
    verdicts = [v for (dep, rate), v in runner.cache.items() if rate is None]
    # runs that failed, or were ended at their last arrival (saturated: their latencies
    # cover only the requests done by then), have no place on a front
    verdicts = [v for v in verdicts if all(runner.records[i]["status"] == "ok"
                                           and runner.records[i].get("stopped_early_s") is None
                                           for i in v.runs)]
    cost = lambda v: v.cost  # noqa: E731
    summary = lambda v: {"deployment": v.deployment.as_dict(), "cost": v.cost, "meets": v.meets,  # noqa: E731
                         "ttft_p99_ms": v.metrics.get("ttft_p99_ms"), "goodput_rps": v.goodput_rps,
                         "runs": v.runs}
    return {
        "cost_vs_ttft_p99": [summary(v) for v in front(verdicts, cost, lambda v: v.metrics.get("ttft_p99_ms"))],
        "cost_vs_goodput": [summary(v) for v in front(verdicts, cost, lambda v: v.goodput_rps, maximize=True)],
    }


def deployments(runner: PlanRunner) -> list[dict]:
    """Every deployment judged at the plan's rate, flat (what ``blis-simpy report`` plots):
    ``label, gpus, cost_per_hour_usd`` (None without prices) ``, ttft_p99_ms, goodput_rps,
    meets_slo, saturated``, cheapest first."""
    priced = runner.spec.priced
    out = [{"label": v.deployment.label, "gpus": v.deployment.gpus,
            "cost_per_hour_usd": v.cost if priced else None,
            "ttft_p99_ms": v.metrics.get("ttft_p99_ms"), "goodput_rps": v.goodput_rps,
            "meets_slo": v.meets,
            "saturated": any(runner.records[i].get("saturated", False) for i in v.runs)}
           for (_, rate), v in runner.cache.items() if rate is None]
    return sorted(out, key=lambda d: (d["gpus"] if d["cost_per_hour_usd"] is None else d["cost_per_hour_usd"],
                                      d["label"]))


def _plan_summary(plan) -> dict:
    spec = plan.spec
    w = spec.workload
    return {"name": spec.name, "file": plan.src.path, "model": spec.model, "gpus": list(spec.gpus),
            "max_gpus": spec.max_gpus, "cost_unit": "usd_per_hour" if spec.priced else "gpus",
            "gpu_hour_usd": dict(spec.cost.gpu_hour_usd),
            "slo": {**spec.slo.thresholds_ms, "min_completed_fraction": spec.slo.min_completed_fraction},
            "workload": {"scenario": plan.base_path, "rate": w.rate, "num_requests": w.num_requests,
                         "trace": w.trace.model_dump() if w.trace is not None else None},
            "seeds": spec.search.seeds if spec.search is not None else [42]}
