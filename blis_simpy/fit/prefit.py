"""The cheap step-level pre-fit: physics' memory and CPU costs from a run's timeseries.

A vLLM log's 1 s ticks give, for a tick with no prompt tokens, the engine's pure-decode step
time: ``step ≈ running / generation tokens per second`` (every running request emits one
token per step). The batch is the mean of the running gauge at the tick's two ends; the
context is the mean, over the requests decoding at the tick's midpoint, of prompt + tokens
generated so far (from their first-token time and TPOT). Ticks whose running count changes
by more than :data:`MAX_RUNNING_CHANGE` of its mean are left out (the estimate assumes a
steady batch).

Fitting the physics model's pure-decode step to those observations (scipy least squares on
relative errors, no simulation: milliseconds) gives ``memory``, ``step_cpu_us`` and
``request_cpu_us`` — the costs a decode step is made of; ``compute`` stays at its start
value (a decode step rarely reaches the compute roof). The result is the simulator-in-the-
loop fit's starting point, and its step-level error is reported beside the fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from blis_simpy.latency.base import BatchView
from blis_simpy.latency.physics import PhysicsModel
from blis_simpy.observed.run import ObservedRun

MIN_TICKS = 5
MAX_RUNNING_CHANGE = 0.25
PREFIT_PARAMS = ("memory", "step_cpu_us", "request_cpu_us")


@dataclass(frozen=True)
class StepObs:
    """One tick's pure-decode step: ``batch`` requests at ``context`` tokens took
    ``step_us`` µs per step (all means over the tick)."""

    t_s: float
    batch: float
    context: float
    step_us: float


def decode_steps(run: ObservedRun) -> list[StepObs]:
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
    x: list[float]                    # the full physics vector (compute, memory, step, request)
    observations: int
    mape_before_pct: float            # step-level MAPE at the start point
    mape_after_pct: float

    def to_dict(self) -> dict:
        return {"ticks": self.observations, "step_mape_before_pct": round(self.mape_before_pct, 3),
                "step_mape_after_pct": round(self.mape_after_pct, 3),
                "start": dict(zip(("compute",) + PREFIT_PARAMS, (round(v, 6) for v in self.x), strict=True))}


def model_steps(space, obs: list[StepObs], x) -> np.ndarray:
    """The physics model's pure-decode step (µs, before truncation to whole µs, so the
    pre-fit sees a smooth function) at each observation, with the set ``x``."""
    lat = space.dep.new_latency_model()
    m = PhysicsModel(lat.model, lat.gpu, lat.tp, dp=lat.dp, coefficients=space.to_set(x))
    out = []
    for o in obs:
        b = max(1, round(o.batch))
        out.append(m.combine(m.terms(BatchView(decode_count=b, decode_tokens=b,
                                               decode_pi_sum=round(b * o.context), size=b))))
    return np.array(out, dtype=float)


def step_mape_pct(space, runs: list[ObservedRun], x) -> float | None:
    """Step-level MAPE (%) of the set ``x`` on the runs' decode ticks (None without ticks)."""
    obs = [o for run in runs for o in decode_steps(run)]
    if not obs:
        return None
    real = np.array([o.step_us for o in obs])
    return float(np.mean(np.abs(model_steps(space, obs, x) / real - 1.0))) * 100


def prefit_physics(space, runs: list[ObservedRun]) -> PrefitResult | None:
    """Pre-fit ``space`` (a PhysicsSpace) to the runs' decode ticks; None if fewer than
    :data:`MIN_TICKS` usable ticks."""
    return prefit_steps(space, [o for run in runs for o in decode_steps(run)])


def prefit_steps(space, obs: list[StepObs]) -> PrefitResult | None:
    """Fit memory, step and request CPU costs to pure-decode step observations."""
    if len(obs) < MIN_TICKS:
        return None
    x0 = np.array(space.x0())
    idx = [1, 2, 3]                               # memory, step_cpu_us, request_cpu_us
    real = np.array([o.step_us for o in obs])

    def resid(z) -> np.ndarray:
        x = x0.copy()
        x[idx] = z
        return model_steps(space, obs, x) / real - 1.0

    lo = np.array([space.params[i].lo for i in idx])
    hi = np.array([space.params[i].hi for i in idx])
    scale = np.array([space.params[i].scale for i in idx])
    before = float(np.mean(np.abs(resid(x0[idx])))) * 100
    res = least_squares(resid, x0[idx], bounds=(lo, hi), x_scale=scale, diff_step=1e-3, max_nfev=200)
    x = x0.copy()
    x[idx] = res.x
    after = float(np.mean(np.abs(res.fun))) * 100
    return PrefitResult([float(v) for v in x], len(obs), before, after)
