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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from blis_simpy.calibrate.compare import Comparison, compare, real_values, sim_values
from blis_simpy.calibrate.twin import simulate
from blis_simpy.config.scenario import Scenario
from blis_simpy.fit.space import Space
from blis_simpy.observed.run import ObservedRun

FIT_METRICS = ("ttft", "tpot", "e2e")
MEAN_WEIGHT = 10.0
MISSING_FACTOR = 10.0


class BudgetExceeded(Exception):
    """The time budget ran out inside an evaluation."""


@dataclass
class Case:
    run: ObservedRun
    scenario: Scenario

    def __post_init__(self):
        self.real = {m: real_values(self.run, m) for m in FIT_METRICS}
        self.keys = {m: list(v) for m, v in self.real.items()}
        self.vals = {m: np.array([v[k] for k in self.keys[m]]) for m, v in self.real.items()}
        self.scale = {m: float(a.mean()) if len(a) and a.mean() > 0 else 1.0 for m, a in self.vals.items()}


@dataclass
class Objective:
    """Residuals of a parameter vector over ``cases``; remembers the best point seen and
    stops (:class:`BudgetExceeded`) once ``deadline`` (``time.monotonic()``) has passed."""

    space: Space
    cases: list[Case]
    deadline: float = float("inf")
    evaluations: int = 0
    best_x: list[float] | None = None
    best_cost: float = float("inf")
    on_eval: object = None               # callable(evaluations, best_cost) for a progress bar
    history: list[float] = field(default_factory=list)

    def simulate(self, case: Case, x):
        cs = self.space.to_set(x)
        dep = self.space.deployment(case.scenario, cs)
        return simulate(case.scenario, case.run, deployment=dep, sample_period_us=0)

    def residuals(self, x) -> np.ndarray:
        if time.monotonic() > self.deadline and self.best_x is not None:
            raise BudgetExceeded
        parts = []
        for case in self.cases:
            sim = self.simulate(case, x)
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

    def comparison(self, case: Case, x) -> Comparison:
        return compare(case.run, self.simulate(case, x))
