"""Inter-arrival-time samplers (docs/workloads.md, "The workload-spec v2", `arrival`).

Each returns inter-arrival times in integer µs (truncated, floored at 1) for a client rate
``λ`` given in requests per µs, drawing from the client's :class:`numpy.random.Generator`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from blis_simpy.errors import ConfigError
from blis_simpy.units import to_int64
from blis_simpy.workload.lengths import SMALLEST_POSITIVE, go_pow

log = logging.getLogger(__name__)

MIN_RATE_PER_US = 1e-15
ARRIVAL_PROCESSES = ("poisson", "gamma", "weibull", "constant")
WEIBULL_CV_RANGE = (0.01, 10.4)




# ------------------------------------------------------------------------------ arrivals

class ArrivalSampler(Protocol):
    def iat(self, rng: np.random.Generator) -> int:
        """The next inter-arrival time, integer µs ≥ 1."""
        ...


def _to_iat(x: float) -> int:
    return max(1, to_int64(x))


@dataclass(frozen=True, slots=True)
class ConstantArrival:
    """Fixed gap ``int(1/λ)``; the first arrival is at t = IAT, not 0. Draws nothing."""

    gap_us: int

    def iat(self, rng: np.random.Generator) -> int:
        return self.gap_us


@dataclass(frozen=True, slots=True)
class PoissonArrival:
    """Exponential gaps ``Exp(1)/λ``."""

    rate_per_us: float

    def iat(self, rng: np.random.Generator) -> int:
        return _to_iat(rng.standard_exponential() / self.rate_per_us)


def gamma_variate(rng: np.random.Generator, shape: float) -> float:
    """Gamma(shape, 1): Marsaglia–Tsang for shape ≥ 1, ``Gamma(shape+1)·U^(1/shape)`` below."""
    if shape < 1.0:
        g = gamma_variate(rng, shape + 1.0)
        return g * go_pow(rng.random(), 1.0 / shape)
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = rng.standard_normal()
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = rng.random()
        if u < 1.0 - 0.0331 * x ** 4:
            return d * v
        if u == 0.0 or math.log(u) < 0.5 * x * x + d * (1.0 - v + math.log(v)):
            return d * v


@dataclass(frozen=True, slots=True)
class GammaArrival:
    """Gamma gaps with ``shape = 1/cv²`` and ``scale = cv²/λ`` (mean 1/λ)."""

    shape: float
    scale: float

    def iat(self, rng: np.random.Generator) -> int:
        return _to_iat(gamma_variate(rng, self.shape) * self.scale)


def weibull_cv(k: float) -> float:
    """Coefficient of variation of a Weibull distribution of shape ``k``."""
    g1 = math.gamma(1.0 + 1.0 / k)
    return math.sqrt(math.gamma(1.0 + 2.0 / k) / (g1 * g1) - 1.0)


def weibull_shape_from_cv(cv: float) -> tuple[float, bool]:
    """Solve ``cv(k) = cv`` by bisection on [0.1, 100] (cv decreases with k).

    Stops when ``|cv(k) − cv| < 0.001`` (≤ 100 iterations); returns ``(k, converged)``,
    with the final midpoint when it did not converge.
    """
    lo, hi = 0.1, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        c = weibull_cv(mid)
        if abs(c - cv) < 0.001:
            return mid, True
        if c > cv:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0, False


@dataclass(frozen=True, slots=True)
class WeibullArrival:
    """Weibull gaps ``scale·(−ln U)^(1/k)`` with ``scale = (1/λ)/Γ(1+1/k)``."""

    shape: float
    scale: float

    def iat(self, rng: np.random.Generator) -> int:
        u = rng.random() or SMALLEST_POSITIVE
        return _to_iat(self.scale * go_pow(-math.log(u), 1.0 / self.shape))


def make_arrival_sampler(process: str, rate_per_us: float, cv: float | None = None,
                         field: str = "arrival") -> ArrivalSampler:
    """An arrival sampler for a client of rate ``rate_per_us`` (requests per µs, floored at
    1e-15). ``cv`` defaults to 1.0; errors name ``field``."""
    lam = max(float(rate_per_us), MIN_RATE_PER_US)
    if cv is None:
        cv = 1.0
    if process not in ARRIVAL_PROCESSES:
        raise ConfigError(f"unknown arrival process {process!r} "
                          f"(valid: {', '.join(ARRIVAL_PROCESSES)})", field=f"{field}.process")
    if not (math.isfinite(cv) and cv > 0):
        raise ConfigError(f"cv must be a finite number > 0, got {cv}", field=f"{field}.cv")
    if process == "constant":
        return ConstantArrival(_to_iat(1.0 / lam))
    if process == "poisson":
        return PoissonArrival(lam)
    if process == "gamma":
        shape = 1.0 / (cv * cv)
        if shape < 0.01:
            log.warning("%s: gamma cv=%g gives shape %g < 0.01; using poisson", field, cv, shape)
            return PoissonArrival(lam)
        return GammaArrival(shape, cv * cv / lam)
    lo, hi = WEIBULL_CV_RANGE
    if not lo <= cv <= hi:
        raise ConfigError(f"weibull cv must be in [{lo}, {hi}], got {cv}", field=f"{field}.cv")
    k, ok = weibull_shape_from_cv(cv)
    if not ok:
        log.warning("%s: weibull shape for cv=%g did not converge; using k=%g", field, cv, k)
    return WeibullArrival(k, (1.0 / lam) / math.gamma(1.0 + 1.0 / k))
