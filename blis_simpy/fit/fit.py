"""``blis-simpy fit``: least squares with the simulator in the loop (scipy.optimize).

:func:`fit` runs :func:`scipy.optimize.least_squares` (trust-region reflective, so every
coefficient stays inside its physical bounds, :mod:`blis_simpy.fit.space`) on the residuals
of :mod:`blis_simpy.fit.objective`. Gradients are forward differences with a relative step
of :data:`DIFF_STEP`: step times are truncated to integer µs, so a smaller step would see a
flat objective. For physics with a timeseries there are two starts — the base set and the
step-level pre-fit (:mod:`blis_simpy.fit.prefit`) — and the better end point wins: the four
numbers trade off (memory against per-request CPU), so one start can stop in a worse valley.
A search stops at convergence, after ``max_evaluations`` simulations, or at the time budget
(then the best point seen is returned). With several runs, each is also
held out in turn (leave-one-out): fitted on the others, scored on it.

For physics with aggregate runs measured at the client, the front end's fixed latency
(:mod:`blis_simpy.fit.frontend`) is fitted once before the search, at its start point, and
then held: the search fits the engine's costs under it. A held-out fit refits it without
the held-out run.
"""

from __future__ import annotations

import copy
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from blis_simpy.calibrate.aggregate import AggregateComparison
from blis_simpy.calibrate.compare import Comparison
from blis_simpy.fit.aggregate_steps import case_steps
from blis_simpy.fit.frontend import FrontendFit, fit_frontend, with_frontend
from blis_simpy.fit.objective import AggregateCase, BudgetExceeded, Case, EvaluationsExhausted, Objective
from blis_simpy.fit.prefit import PrefitResult, prefit_steps
from blis_simpy.fit.space import Space
from blis_simpy.latency.coefficient_sets import CoefficientSet

DIFF_STEP = 0.02
MAX_EVALUATIONS = 200


@dataclass
class FitResult:
    x: list[float]
    coefficient_set: CoefficientSet
    cost: float
    evaluations: int
    seconds: float
    stopped: str                                   # "converged" | "budget" | "evaluations"
    in_sample: list[Comparison | AggregateComparison] = field(default_factory=list)
    held_out: list[Comparison | AggregateComparison] = field(default_factory=list)   # leave-one-out
    prefit: PrefitResult | None = None             # the step-level pre-fit (physics with ticks)
    #: some search (a start of the main fit or a held-out fit) ended at the time budget: the
    #: result then depends on how fast this machine ran, not only on the inputs
    budget_hit: bool = False
    frontend: FrontendFit | None = None            # the fitted front end (physics, client runs)


def with_fitted_frontend(space: Space, cases, start) -> tuple[Space, FrontendFit | None]:
    """``space`` whose sets carry the front end fitted to ``cases`` at ``start`` (the space
    itself when it is not physics or no case is measured at the client)."""
    if space.backend != "physics":
        return space, None
    fe = fit_frontend(space, cases, space.to_set(start if start is not None else space.x0()))
    if fe is None:
        return space, None
    out = copy.copy(space)
    out.base = with_frontend(space.base, fe)
    return out, fe


@contextmanager
def _quiet_engine():
    """The engine's per-run warnings (e.g. a failed final-token KV allocation under KV
    pressure) would repeat once per simulation of the search: silenced there unless
    debugging; the in-sample and held-out comparisons log as usual."""
    eng = logging.getLogger("blis_simpy.engine")
    old = eng.level
    if not eng.isEnabledFor(logging.DEBUG):
        eng.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        eng.setLevel(old)


def _search(space: Space, cases: list[Case | AggregateCase], deadline: float, max_evaluations: int,
            on_eval=None, start: list[float] | None = None) -> tuple[Objective, str, float]:
    obj = Objective(space, cases, deadline=deadline, on_eval=on_eval, max_evaluations=max_evaluations)
    lo = np.array([p.lo for p in space.params])
    hi = np.array([p.hi for p in space.params])
    scale = np.array([p.scale for p in space.params])
    x0 = np.clip(np.array(start if start is not None else space.x0()), lo, hi)
    with _quiet_engine():
        try:
            res = least_squares(obj.residuals, x0, bounds=(lo, hi), x_scale=scale, diff_step=DIFF_STEP,
                                max_nfev=max_evaluations, method="trf")
            stopped = "converged" if res.status > 0 else "evaluations"
        except BudgetExceeded:
            stopped = "budget"
        except EvaluationsExhausted:
            stopped = "evaluations"
    return obj, stopped, obj.best_cost


def fit(space: Space, cases: list[Case | AggregateCase], *, time_budget_s: float = 600.0,
        max_evaluations: int = MAX_EVALUATIONS, cross_validate: bool = True, on_eval=None,
        prefit: bool = True) -> FitResult:
    """Fit ``space`` to every case; then, with ≥ 2 cases and ``cross_validate``, refit
    without each case and score on it. The budget covers everything: the main fit gets
    it all if there is no cross-validation, else half, the held-out fits share the rest.
    ``prefit``: for physics, also start from the step-level pre-fit where the runs have
    ticks (:mod:`blis_simpy.fit.prefit`). Held-out fits start from the base set only (a start
    fitted with the held-out run would leak it)."""
    t0 = time.monotonic()
    pre = prefit_steps(space, case_steps(space, cases)) if prefit and space.backend == "physics" else None
    start = pre.x if pre is not None else None
    base_space = space
    space, fe = with_fitted_frontend(space, cases, start)
    k = len(cases)
    cv = cross_validate and k >= 2
    main_share = 0.5 if cv else 1.0
    starts = [None] + ([start] if start is not None else [])
    best = None
    evaluations = 0
    budget_hit = False
    for j, st in enumerate(starts):
        left = t0 + time_budget_s * main_share - time.monotonic()
        found = _search(space, cases, time.monotonic() + left / (len(starts) - j), max_evaluations, on_eval, st)
        evaluations += found[0].evaluations
        budget_hit |= found[1] == "budget"
        if best is None or found[2] < best[2]:
            best = found
    obj, stopped, cost = best
    x = obj.best_x
    result = FitResult(x, space.to_set(x), cost, evaluations, 0.0, stopped,
                       in_sample=[obj.comparison(c, x) for c in cases], prefit=pre,
                       budget_hit=budget_hit, frontend=fe)
    if cv:
        per = (t0 + time_budget_s - time.monotonic()) / k
        for i, held in enumerate(cases):
            rest = cases[:i] + cases[i + 1:]
            fold, _ = with_fitted_frontend(base_space, rest, None)
            o, why, _ = _search(fold, rest, time.monotonic() + max(per, 1.0), max_evaluations, on_eval)
            result.budget_hit |= why == "budget"
            result.held_out.append(o.comparison(held, o.best_x))
    result.seconds = time.monotonic() - t0
    return result
