"""Sim vs real for an aggregate run (an inference-perf folder): what ``calibrate`` prints and
``fit`` minimises for it.

Per stage and for the whole run (a simulated request belongs to the stage that sent it):

* success and failure counts, real and simulated;
* TTFT, ITL, TPOT and E2E over the successes at mean, p50, p90 and p99, real (the results
  files) and simulated, with the signed error ``100·(sim − real)/real`` %. inference-perf's
  definitions are followed: TTFT and E2E from the send, TPOT = (last − first chunk)/(chunks −
  1) per request, ITL every gap between two chunks pooled over the requests (the twin: every
  per-token gap); percentiles are numpy's default rule (rank p/100·(n−1), linear
  interpolation), the one :mod:`blis_simpy.metrics.percentile` uses;
* the three-number score of the published simulator comparison on such data: mean E2E, mean
  TTFT and ITL = (mean E2E − mean TTFT)/(mean output length − 1), each error |sim − real|/real,
  and their average ``avg3`` (%). The real output length is the one the server decoded — the
  rebuilt requests' (with ``ignore_eos`` exactly the tokens asked for), not inference-perf's
  count of the streamed text, which can be short (docs/accuracy.md).

Units: ms unless named otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from blis_simpy.calibrate.aggregate_twin import AggregateSim, simulate_aggregate
from blis_simpy.calibrate.compare import Score, err_pct, score, stats
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.resolve import Deployment
from blis_simpy.measured.run import AGG_METRICS, AGG_STATS, AggregateRun, AggregateStats
from blis_simpy.metrics.percentile import SortedHistogram


@dataclass
class StatRow:
    """One metric: real and simulated ``{mean, p50, p90, p99}`` (None when that side has no
    value) and the signed errors (%; NaN where either side is missing or real is 0)."""

    metric: str
    real: dict[str, float] | None
    sim: dict[str, float] | None

    @property
    def err_pct(self) -> dict[str, float]:
        return {s: err_pct(self.sim[s], self.real[s]) if self.real and self.sim else math.nan for s in AGG_STATS}

    def to_dict(self) -> dict:
        return {"real_ms": self.real, "sim_ms": self.sim, "error_pct": self.err_pct}


@dataclass
class ScopeComparison:
    """One stage (``stage`` its index) or the whole run (``stage`` None)."""

    stage: int | None
    real_ok: int
    real_failed: int
    sim_ok: int
    sim_failed: int
    rows: list[StatRow] = field(default_factory=list)
    score: Score | None = None

    def row(self, metric: str) -> StatRow | None:
        return next((r for r in self.rows if r.metric == metric), None)

    def to_dict(self) -> dict:
        return {"stage": self.stage, "real": {"successes": self.real_ok, "failures": self.real_failed},
                "sim": {"successes": self.sim_ok, "failures": self.sim_failed},
                "metrics": {r.metric: r.to_dict() for r in self.rows},
                "score": self.score.to_dict() if self.score else None}


@dataclass
class AggregateComparison:
    """Everything calibrate reports about one aggregate run."""

    run: str
    stages: list[ScopeComparison]
    total: ScopeComparison
    sim: AggregateSim

    def to_dict(self) -> dict:
        stages = []
        for c, w, d in zip(self.stages, self.sim.stages, self.sim.drained_us, strict=True):
            stages.append({**c.to_dict(), "rate_rps": w.rate_rps, "requests": w.count,
                           "sim_start_us": w.start_us, "sim_drained_us": d})
        return {"run": self.run, "kind": "inference-perf", "stages": stages, "total": self.total.to_dict(),
                "sim_cache_hit_rate": self.sim.cache_hit_rate, "sim_preemptions": self.sim.preemptions,
                "simulations": self.sim.simulations}


def _sim_rows(reqs, hist) -> dict[str, dict[str, float]]:
    ok = [q for q in reqs if q.ok]
    out = {}
    for metric, vals in (("ttft", [q.ttft_ms for q in ok]), ("tpot", [q.tpot_ms for q in ok if q.tpot_ms is not None]),
                         ("e2e", [q.e2e_ms for q in ok])):
        if vals:
            out[metric] = stats(vals)
    h = SortedHistogram(hist)
    if h.n:
        out["itl"] = {"mean": h.mean_ms(), **{f"p{p}": h.percentile_ms(p) for p in (50, 90, 99)}}
    return out


def _pooled_means(parts: list[AggregateStats]) -> dict[str, dict[str, float]]:
    """The whole run's mean of each metric from the stages' means (success-weighted; exact for
    TTFT, TPOT and E2E, whose means are per request)."""
    out = {}
    for m in ("ttft", "tpot", "e2e"):
        pairs = [(s.successes, s.latency_ms[m]["mean"]) for s in parts if m in s.latency_ms]
        n = sum(c for c, _ in pairs)
        if n:
            out[m] = {"mean": sum(c * v for c, v in pairs) / n}
    return out


def _scope(stage, real: AggregateStats | None, real_lat: dict, reqs, records, hist) -> ScopeComparison:
    sim_lat = _sim_rows(reqs, hist)
    ok = [q for q in reqs if q.ok]
    c = ScopeComparison(stage, real.successes if real else 0, real.failures if real else 0, len(ok),
                        len(reqs) - len(ok))
    for m in AGG_METRICS:
        r = real_lat.get(m)
        s = sim_lat.get(m)
        if r is not None and "p50" not in r:
            r = {k: r.get(k, math.nan) for k in AGG_STATS}
        if r is not None or s is not None:
            c.rows.append(StatRow(m, r, s))
    len_real = sum(x.output_tokens for x in records) / len(records) if records else 0.0
    len_sim = sum(q.output_tokens for q in ok) / len(ok) if ok else 0.0
    if all(m in d for d in (real_lat, sim_lat) for m in ("e2e", "ttft")):
        c.score = score(real_lat["e2e"]["mean"], real_lat["ttft"]["mean"], len_real,
                        sim_lat["e2e"]["mean"], sim_lat["ttft"]["mean"], len_sim)
    return c


def compare_aggregate(run: AggregateRun, sim: AggregateSim) -> AggregateComparison:
    stages = []
    for k, st in enumerate(sim.stages):
        sl = slice(st.first, st.first + st.count)
        real = run.real_stages[k]
        stages.append(_scope(k, real, real.latency_ms, sim.requests[sl], run.records[sl], sim.itl_hist_us[k]))
    total_hist = sum(sim.itl_hist_us, start=type(sim.itl_hist_us[0])()) if sim.itl_hist_us else {}
    real = run.real_total
    real_lat = real.latency_ms if real is not None else _pooled_means(run.real_stages)
    if real is None:
        real = AggregateStats(sum(s.successes for s in run.real_stages), sum(s.failures for s in run.real_stages),
                              real_lat, None, None, 0.0)
    total = _scope(None, real, real_lat, sim.requests, run.records, total_hist)
    return AggregateComparison(run.name, stages, total, sim)


def calibrate_aggregate(scenario: Scenario, run: AggregateRun, *, deployment: Deployment | None = None,
                        progress=None) -> AggregateComparison:
    """Simulate ``run`` under ``scenario`` (or ``deployment``) and compare: the one call fit
    and calibrate make for an aggregate run."""
    return compare_aggregate(run, simulate_aggregate(scenario, run, deployment=deployment, progress=progress))
