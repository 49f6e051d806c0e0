"""Sim vs real: the numbers ``blis-simpy calibrate`` prints and ``fit`` minimises.

Per metric (TTFT, TPOT, E2E, and scheduling delay where the log has it) over the requests
both the run and the twin completed: real and sim mean/p50/p90/p99 with the signed error
``100·(sim − real)/real`` %, and the per-request MAPE ``100·mean(|sim − real| / real)`` %
over the requests whose real value is at least :data:`MAPE_FLOOR_MS` (1 ms; in practice
this only matters for scheduling delays, which a server can keep to microseconds).
Throughput is output tokens over the span from the first arrival to the last completion.
Means and percentiles follow the reports' rules (:mod:`blis_simpy.metrics.percentile`).

The three-number :class:`Score` of the published simulator comparison (docs/accuracy.md):
mean E2E, mean TTFT and ITL = (mean E2E − mean TTFT)/(mean output length − 1) over the
requests both completed, each error |sim − real|/real, and ``avg3`` their mean (%).
Units: ms unless named otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from blis_simpy.calibrate.twin import SimRun
from blis_simpy.measured.run import MeasuredRun
from blis_simpy.metrics.percentile import mean, percentile

METRICS = ("ttft", "tpot", "e2e", "sched")
LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E", "sched": "sched delay", "itl": "ITL"}
STATS = ("mean", "p50", "p90", "p99")
#: the per-request MAPE leaves out requests whose real value is below this (ms): a request
#: the server scheduled 20 µs after arrival would turn any simulated delay into +10,000%
MAPE_FLOOR_MS = 1.0


def real_values(run: MeasuredRun, metric: str) -> dict[str, float]:
    """Request id → the run's measured value of ``metric`` (ms); TPOT only for > 1 output
    token; scheduling delay only where the log records the scheduling time."""
    out = {}
    for r in run.requests:
        v = {"ttft": r.ttft_ms, "e2e": r.e2e_ms, "tpot": r.tpot_ms,
             "sched": getattr(r, "sched_ms", None)}[metric]
        if v is not None:
            out[r.id] = v
    return out


def sim_values(sim: SimRun, metric: str) -> dict[str, float]:
    return {"ttft": sim.ttft_ms, "e2e": sim.e2e_ms, "tpot": sim.tpot_ms, "sched": sim.sched_ms}[metric]


def err_pct(sim: float, real: float) -> float:
    """Signed error in % (``nan`` when real is 0)."""
    return 100.0 * (sim - real) / real if real else float("nan")


#: the three numbers of the score
SCORE_METRICS = ("e2e", "ttft", "itl")


@dataclass
class Score:
    """The three numbers, real and simulated (ms), their errors |sim − real|/real (%) and
    ``avg3_pct`` their mean; the output lengths the ITLs divide by (tokens)."""

    real: dict[str, float]
    sim: dict[str, float]
    output_len_real: float
    output_len_sim: float

    @property
    def err_pct(self) -> dict[str, float]:
        return {m: abs(err_pct(self.sim[m], self.real[m])) for m in SCORE_METRICS}

    @property
    def avg3_pct(self) -> float:
        return sum(self.err_pct.values()) / len(SCORE_METRICS)

    def to_dict(self) -> dict:
        return {"real_ms": self.real, "sim_ms": self.sim, "abs_error_pct": self.err_pct,
                "avg3_pct": self.avg3_pct, "output_len_real": self.output_len_real,
                "output_len_sim": self.output_len_sim}


def score(real_e2e_ms: float, real_ttft_ms: float, len_real: float, sim_e2e_ms: float, sim_ttft_ms: float,
          len_sim: float) -> Score | None:
    """The :class:`Score` of two (mean E2E, mean TTFT, mean output length) triples; None when
    an output length is not over 1 token or a value is not finite."""
    vals = (real_e2e_ms, real_ttft_ms, sim_e2e_ms, sim_ttft_ms)
    if len_real <= 1 or len_sim <= 1 or not all(math.isfinite(v) for v in vals):
        return None
    return Score({"e2e": real_e2e_ms, "ttft": real_ttft_ms, "itl": (real_e2e_ms - real_ttft_ms) / (len_real - 1)},
                 {"e2e": sim_e2e_ms, "ttft": sim_ttft_ms, "itl": (sim_e2e_ms - sim_ttft_ms) / (len_sim - 1)},
                 len_real, len_sim)


@dataclass
class MetricRow:
    metric: str
    n: int
    real: dict[str, float]
    sim: dict[str, float]
    err_pct: dict[str, float]
    mape_pct: float
    mape_n: int = 0            # requests in the MAPE (real value >= MAPE_FLOOR_MS)

    def to_dict(self) -> dict:
        return {"n": self.n, "real_ms": self.real, "sim_ms": self.sim, "error_pct": self.err_pct,
                "mape_pct": self.mape_pct, "mape_n": self.mape_n}


@dataclass
class Comparison:
    """Everything calibrate reports about one run."""

    run: str
    rows: list[MetricRow] = field(default_factory=list)
    completed_real: int = 0
    completed_sim: int = 0
    offered: int = 0
    throughput_real_tps: float = 0.0
    throughput_sim_tps: float = 0.0
    cache_hit_rate_sim: float = 0.0
    preemptions_sim: int = 0
    #: trace rows the run did not measure (failed, or no output token): not replayed
    not_replayed: int = 0
    score: Score | None = None

    def row(self, metric: str) -> MetricRow | None:
        return next((r for r in self.rows if r.metric == metric), None)

    def to_dict(self) -> dict:
        return {"run": self.run, "offered": self.offered, "completed_real": self.completed_real,
                "completed_sim": self.completed_sim, "not_replayed": self.not_replayed,
                "score": self.score.to_dict() if self.score else None,
                "metrics": {r.metric: r.to_dict() for r in self.rows},
                "throughput_tps": {"real": self.throughput_real_tps, "sim": self.throughput_sim_tps,
                                   "error_pct": err_pct(self.throughput_sim_tps, self.throughput_real_tps)},
                "sim_cache_hit_rate": self.cache_hit_rate_sim,
                "sim_preemptions": self.preemptions_sim}


def stats(values) -> dict[str, float]:
    """Mean and percentiles with the report's own rules (:mod:`blis_simpy.metrics.percentile`)."""
    v = sorted(float(x) for x in values)
    return {"mean": mean(v), "p50": percentile(v, 50), "p90": percentile(v, 90), "p99": percentile(v, 99)}


def metric_row(metric: str, real: dict[str, float], sim: dict[str, float]) -> MetricRow | None:
    keys = [k for k in real if k in sim]
    if not keys:
        return None
    rv = np.array([real[k] for k in keys])
    sv = np.array([sim[k] for k in keys])
    rs, ss = stats(rv), stats(sv)
    nz = rv >= MAPE_FLOOR_MS
    mape = float(100.0 * np.mean(np.abs(sv[nz] - rv[nz]) / rv[nz])) if nz.any() else float("nan")
    return MetricRow(metric, len(keys), rs, ss, {s: err_pct(ss[s], rs[s]) for s in STATS}, mape,
                     int(nz.sum()))


def paired_score(run: MeasuredRun, sim: SimRun) -> Score | None:
    """The :class:`Score` over the requests both the run and the twin completed."""
    both = [r for r in run.requests if r.id in sim.e2e_ms]
    if not both:
        return None
    n = len(both)
    length = sum(r.output_toks for r in both) / n
    return score(sum(r.e2e_ms for r in both) / n, sum(r.ttft_ms for r in both) / n, length,
                 sum(sim.e2e_ms[r.id] for r in both) / n, sum(sim.ttft_ms[r.id] for r in both) / n, length)


def compare(run: MeasuredRun, sim: SimRun) -> Comparison:
    c = Comparison(run.name, offered=len(run.requests), completed_real=len(run.requests),
                   completed_sim=sim.completed, cache_hit_rate_sim=sim.cache_hit_rate,
                   preemptions_sim=sim.preemptions, not_replayed=len(run.records) - sim.offered,
                   score=paired_score(run, sim))
    for m in METRICS:
        row = metric_row(m, real_values(run, m), sim_values(sim, m))
        if row is not None:
            c.rows.append(row)
    if run.requests:
        start = min(r.arrival_us for r in run.requests) / 1e6
        end = max(r.last_token_s - run.q0_s for r in run.requests)
        toks = sum(r.output_toks for r in run.requests)
        c.throughput_real_tps = toks / (end - start) if end > start else 0.0
    if sim.end_us > 0:
        c.throughput_sim_tps = sim.output_tokens / (sim.end_us / 1e6)
    return c
