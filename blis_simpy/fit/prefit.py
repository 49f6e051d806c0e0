"""The cheap step-level pre-fit: physics' memory and CPU costs from a run's timeseries.

A vLLM log's 1 s ticks give, for a tick with no prompt tokens, the engine's pure-decode step
time: ``step ≈ running / generation tokens per second`` (every running request emits one
token per step). The batch is the mean of the running gauge at the tick's two ends; the
context is the mean, over the requests decoding at the tick's midpoint, of prompt + tokens
generated so far (from their first-token time and TPOT). Ticks whose running count changes
by more than :data:`MAX_RUNNING_CHANGE` of its mean are left out (the estimate assumes a
steady batch).

Fitting the physics model's pure-decode step to those observations (scipy least squares on
relative errors, no simulation: about a second) gives ``memory``, ``kv_memory``,
``step_cpu_us``, ``request_cpu_us`` and ``collectives`` — the costs a decode step is made of;
``compute`` stays at its start value (a decode step rarely reaches the compute roof). An
observation whose batch came from its load (an aggregate stage below the running cap) is
compared at the batch that load would build under the candidate set
(:func:`fixed_point_steps`), the others at their measured batch. The result is the
simulator-in-the-loop fit's starting point, and its step-level error is reported beside the
fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from blis_simpy.latency.base import BatchView
from blis_simpy.latency.physics import PhysicsModel
from blis_simpy.measured.run import MeasuredRun

MIN_TICKS = 5
#: weight of the pull towards the start values: one parameter ``scale`` away from its start
#: costs as much as a 1 % step error on every observation
PRIOR_WEIGHT = 0.01
MAX_RUNNING_CHANGE = 0.25
PREFIT_PARAMS = ("memory", "kv_memory", "step_cpu_us", "request_cpu_us", "collectives")


@dataclass(frozen=True)
class StepObs:
    """One pure-decode step observation: ``batch`` requests at ``context`` tokens took
    ``step_us`` µs per step (means over a tick, or over a stage of an aggregate run:
    :mod:`blis_simpy.fit.aggregate_steps`). ``deployment``: the resolved deployment it was
    measured on when it is not the fit's own (runs of several models, TPs or GPUs);
    ``label`` names it in reports."""

    t_s: float
    batch: float
    context: float
    step_us: float
    deployment: object = None
    label: str = ""
    #: the engine's running cap when the batch came from the load (an aggregate stage below
    #: the cap: :mod:`blis_simpy.fit.aggregate_steps`): the pre-fit then judges a set by the
    #: step at the batch that load would build under it (:func:`fixed_point_steps`); 0 = the
    #: batch was measured (a log tick) or sat at the cap
    max_batch: float = 0.0


def decode_steps(run: MeasuredRun) -> list[StepObs]:
    """The pure-decode step observations of a run (empty without a timeseries)."""
    out = []
    ticks = run.ticks
    reqs = run.requests
    for prev, tk in zip(ticks, ticks[1:], strict=False):
        if tk.prompt_tps != 0 or tk.gen_tps <= 0 or tk.running <= 0 or prev.running <= 0:
            continue
        batch = (prev.running + tk.running) / 2.0
        if abs(tk.running - prev.running) > MAX_RUNNING_CHANGE * batch:
            continue
        mid = tk.t_s - 0.5                                  # seconds after the first arrival
        ctx = []
        for r in reqs:
            first, last = r.first_token_s - run.q0_s, r.last_token_s - run.q0_s
            if first <= mid <= last and r.tpot_ms:
                ctx.append(r.input_toks + (mid - first) * 1000.0 / r.tpot_ms)
        if not ctx:
            continue
        out.append(StepObs(tk.t_s, batch, float(np.mean(ctx)), 1e6 * batch / tk.gen_tps))
    return out


@dataclass
class PrefitResult:
    x: list[float]                    # the full physics vector (compute, memory, kv_memory, step, request, collectives)
    observations: int
    mape_before_pct: float            # step-level MAPE at the start point
    mape_after_pct: float

    def to_dict(self) -> dict:
        return {"ticks": self.observations, "step_mape_before_pct": round(self.mape_before_pct, 3),
                "step_mape_after_pct": round(self.mape_after_pct, 3),
                "start": dict(zip(("compute",) + PREFIT_PARAMS, (round(v, 6) for v in self.x), strict=True))}


def model_steps(space, obs: list[StepObs], x) -> np.ndarray:
    """The physics model's pure-decode step (µs, before truncation to whole µs, so the
    pre-fit sees a smooth function) at each observation's measured batch, with the set ``x``."""
    return np.array([_decode_us(m, max(1, round(o.batch)), o.context)
                     for o, m in zip(obs, _models(space, obs, x), strict=True)], dtype=float)


#: bisection steps of :func:`fixed_point_steps` (the batch to within 2^-40 of the cap)
FIXED_POINT_ITERATIONS = 40


def _models(space, obs: list[StepObs], x) -> list[PhysicsModel]:
    """One physics model per observation (shared per deployment) with the set ``x``."""
    cs = space.to_set(x)
    by_dep: dict[int, PhysicsModel] = {}
    out = []
    for o in obs:
        dep = o.deployment if o.deployment is not None else space.dep
        m = by_dep.get(id(dep))
        if m is None:
            lat = dep.new_latency_model()
            m = by_dep[id(dep)] = PhysicsModel(lat.model, lat.gpu, lat.tp, dp=lat.dp,
                                               expert_parallel=lat.shape.expert_parallel, coefficients=cs)
        out.append(m)
    return out


def _decode_us(m: PhysicsModel, batch: float, context: float) -> float:
    """``m``'s pure-decode step (µs, unrounded) at a fractional ``batch``: linear between the
    whole batches around it, so that it is continuous in the batch."""
    lo = max(1, int(batch))
    frac = batch - lo if batch > lo else 0.0

    def at(b: int) -> float:
        return m.combine(m.terms(BatchView(decode_count=b, decode_tokens=b,
                                           decode_pi_sum=round(b * context), size=b)))
    return at(lo) if frac == 0.0 else (1.0 - frac) * at(lo) + frac * at(lo + 1)


def fixed_point_steps(space, obs: list[StepObs], x) -> np.ndarray:
    """The decode step (µs) each observation's load implies under the set ``x``.

    A stage's requests start decoding at a steady rate and each decodes for ``n − 1`` steps,
    so by Little's law its batch is that rate times ``(n − 1)·step(batch)`` — the measured
    batch over the measured step, times the model's step: ``b = (b_real / step_real)·step(b)``.
    The batch the set implies is that equation's root below the running cap (bisection; the
    step grows with the batch more slowly than the batch when the engine keeps up); where
    there is none the engine would not keep up and sits at the cap, and its step there is
    returned, scaled by how far the load exceeds what the cap serves. Near saturation a small
    step error moves this batch a lot, which is what a replay of the stage shows and what the
    step at the measured batch hides. Observations without ``max_batch`` give the step at
    their measured batch."""
    out = []
    for o, m in zip(obs, _models(space, obs, x), strict=True):
        if o.max_batch <= 0 or o.batch >= o.max_batch:
            out.append(_decode_us(m, max(1.0, round(o.batch)), o.context))
            continue
        k = o.batch / o.step_us                       # batch per µs of step: the load
        hi = o.max_batch
        top = _decode_us(m, hi, o.context)
        if k * top >= hi:                              # the cap cannot serve the load
            out.append(top * k * top / hi)
            continue
        lo = 1.0
        for _ in range(FIXED_POINT_ITERATIONS):
            mid = 0.5 * (lo + hi)
            if k * _decode_us(m, mid, o.context) > mid:
                lo = mid
            else:
                hi = mid
        out.append(_decode_us(m, hi, o.context))
    return np.array(out, dtype=float)


def step_mape_pct(space, obs: list[StepObs], x) -> float | None:
    """Step-level MAPE (%) of the set ``x`` on step observations (None without any)."""
    if not obs:
        return None
    real = np.array([o.step_us for o in obs])
    return float(np.mean(np.abs(model_steps(space, obs, x) / real - 1.0))) * 100


def prefit_physics(space, runs: list[MeasuredRun]) -> PrefitResult | None:
    """Pre-fit ``space`` (a PhysicsSpace) to the runs' decode ticks; None if fewer than
    :data:`MIN_TICKS` usable ticks."""
    return prefit_steps(space, [o for run in runs for o in decode_steps(run)])


def prefit_steps(space, obs: list[StepObs]) -> PrefitResult | None:
    """Fit memory, step and request CPU costs to pure-decode step observations."""
    if len(obs) < MIN_TICKS:
        return None
    x0 = np.array(space.x0())
    idx = [1, 2, 3, 4, 5]                         # every parameter but compute
    real = np.array([o.step_us for o in obs])

    lo = np.array([space.params[i].lo for i in idx])
    hi = np.array([space.params[i].hi for i in idx])
    scale = np.array([space.params[i].scale for i in idx])
    n = len(obs)
    # every deployment (run) weighs the same, however many observations it gives: a log's
    # hundred ticks must not drown the two stages of an aggregate run
    group = [id(o.deployment) for o in obs]
    count = {g: group.count(g) for g in set(group)}
    weight = np.array([np.sqrt(n / len(count) / count[g]) for g in group])

    def steps(z) -> np.ndarray:
        x = x0.copy()
        x[idx] = z
        return fixed_point_steps(space, obs, x) / real - 1.0

    def resid(z) -> np.ndarray:
        # the step errors, then a weak pull of each parameter towards its start (ridge): with
        # few observations a cost the data barely sees stays physical instead of drifting
        return np.concatenate((weight * steps(z), PRIOR_WEIGHT * np.sqrt(n) * (z - x0[idx]) / scale))

    before = float(np.mean(np.abs(steps(x0[idx])))) * 100
    res = least_squares(resid, x0[idx], bounds=(lo, hi), x_scale=scale, diff_step=1e-3, max_nfev=200)
    x = x0.copy()
    x[idx] = res.x
    after = float(np.mean(np.abs(steps(res.x)))) * 100
    return PrefitResult([float(v) for v in x], len(obs), before, after)
