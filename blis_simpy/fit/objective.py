"""The quantity ``blis-simpy fit`` minimises: sim-vs-real error over measured runs.

For each run (a :class:`Case`: the measured run and the scenario it is replayed under), the
twin is simulated with the candidate coefficient set and compared request by request. The
residual vector stacks, per run and per metric m in (TTFT, TPOT, E2E):

* per request ``(sim − real) / mean(real_m) / sqrt(n_m)`` — the per-request fit, each
  metric normalised by its own scale so none dominates;
* ``MEAN_WEIGHT · (mean(sim_m)/mean(real_m) − 1)`` — the mean error, the figure users quote
  (weighted so that a few outliers cannot buy a biased mean).

A request the twin did not complete counts as 10× its real value (never with a complete
replay, which calibrate and fit always run).

An aggregate run (an inference-perf folder: an :class:`AggregateCase`) has no per-request
values; its residuals are, per stage, ``MEAN_WEIGHT · (sim/real − 1)`` of the mean and p90
of TTFT and E2E and of the mean ITL as the three-number score defines it ((mean E2E − mean
TTFT)/(decoded output length − 1), :mod:`blis_simpy.calibrate.aggregate`). inference-perf's
own ITL and TPOT are per streamed chunk, which need not be per token (docs/accuracy.md), so
they are not fitted. A stage the twin completed no request of counts as 10× its real values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from blis_simpy.calibrate.aggregate import AggregateComparison, calibrate_aggregate
from blis_simpy.calibrate.compare import Comparison, compare, real_values, sim_values
from blis_simpy.calibrate.twin import simulate
from blis_simpy.config.scenario import Scenario
from blis_simpy.fit.space import Space
from blis_simpy.measured.run import AggregateRun, MeasuredRun

FIT_METRICS = ("ttft", "tpot", "e2e")
MEAN_WEIGHT = 10.0
MISSING_FACTOR = 10.0


class BudgetExceeded(Exception):
    """The time budget ran out inside an evaluation."""


class EvaluationsExhausted(Exception):
    """The search has run its ``max_evaluations`` simulations (scipy's finite-difference
    Jacobian evaluations are not counted by its own ``max_nfev``; these are)."""


@dataclass
class Case:
    run: MeasuredRun
    scenario: Scenario

    def __post_init__(self):
        self.real = {m: real_values(self.run, m) for m in FIT_METRICS}
        self.keys = {m: list(v) for m, v in self.real.items()}
        self.vals = {m: np.array([v[k] for k in self.keys[m]]) for m, v in self.real.items()}
        self.scale = {m: float(a.mean()) if len(a) and a.mean() > 0 else 1.0 for m, a in self.vals.items()}


#: an aggregate run's fitted figures: (metric, statistic) per stage ("itl" is the score's)
AGGREGATE_TERMS = (("ttft", "mean"), ("ttft", "p90"), ("e2e", "mean"), ("e2e", "p90"), ("itl", "mean"))


@dataclass
class AggregateCase:
    """An aggregate run and the scenario it is replayed under (module docstring)."""

    run: AggregateRun
    scenario: Scenario

    def residuals(self, c: AggregateComparison) -> np.ndarray:
        out = []
        for sc in c.stages:
            for metric, stat in AGGREGATE_TERMS:
                if metric == "itl":
                    real = sc.score.real["itl"] if sc.score else None
                    sim = sc.score.sim["itl"] if sc.score else None
                else:
                    row = sc.row(metric)
                    real = row.real[stat] if row is not None and row.real else None
                    sim = row.sim[stat] if row is not None and row.sim else None
                if real is None or not real > 0:
                    continue
                if sim is None:
                    out.append(MEAN_WEIGHT * (MISSING_FACTOR - 1.0))
                else:
                    out.append(MEAN_WEIGHT * (sim / real - 1.0))
        return np.array(out, dtype=float)


@dataclass
class Objective:
    """Residuals of a parameter vector over ``cases``; remembers the best point seen and
    stops (:class:`BudgetExceeded`) once ``deadline`` (``time.monotonic()``) has passed, or
    (:class:`EvaluationsExhausted`) after ``max_evaluations`` evaluations (0 = no cap)."""

    space: Space
    cases: list[Case]
    deadline: float = float("inf")
    evaluations: int = 0
    best_x: list[float] | None = None
    best_cost: float = float("inf")
    on_eval: object = None               # callable(evaluations, best_cost) for a progress bar
    max_evaluations: int = 0
    history: list[float] = field(default_factory=list)

    def simulate(self, case: Case | AggregateCase, x):
        """The twin of ``case`` with the set ``x``: a SimRun, or for an aggregate run its
        :class:`AggregateComparison`."""
        dep = self.space.deployment(case.scenario, self.space.to_set(x))
        if isinstance(case, AggregateCase):
            return calibrate_aggregate(case.scenario, case.run, deployment=dep)
        return simulate(case.scenario, case.run, deployment=dep, sample_period_us=0)

    def residuals(self, x) -> np.ndarray:
        if time.monotonic() > self.deadline and self.best_x is not None:
            raise BudgetExceeded
        if 0 < self.max_evaluations <= self.evaluations and self.best_x is not None:
            raise EvaluationsExhausted
        parts = []
        for case in self.cases:
            sim = self.simulate(case, x)
            if isinstance(case, AggregateCase):
                parts.append(case.residuals(sim))
                continue
            for m in FIT_METRICS:
                keys, real = case.keys[m], case.vals[m]
                if not keys:
                    continue
                got = sim_values(sim, m)
                s = np.array([got.get(k, MISSING_FACTOR * r) for k, r in zip(keys, real, strict=True)])
                parts.append((s - real) / case.scale[m] / np.sqrt(len(keys)))
                parts.append(np.array([MEAN_WEIGHT * (s.mean() / real.mean() - 1.0)]))
        r = np.concatenate(parts)
        cost = 0.5 * float(r @ r)
        self.evaluations += 1
        self.history.append(cost)
        if cost < self.best_cost:
            self.best_cost, self.best_x = cost, [float(v) for v in x]
        if self.on_eval is not None:
            self.on_eval(self.evaluations, self.best_cost)
        return r

    def comparison(self, case: Case | AggregateCase, x) -> Comparison | AggregateComparison:
        got = self.simulate(case, x)
        return got if isinstance(case, AggregateCase) else compare(case.run, got)


def case_for(run: MeasuredRun | AggregateRun, scenario: Scenario) -> Case | AggregateCase:
    """The fit case of a measured run of either kind."""
    return AggregateCase(run, scenario) if isinstance(run, AggregateRun) else Case(run, scenario)
