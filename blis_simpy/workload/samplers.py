"""Token-length and inter-arrival-time samplers (spec/07 §4).

Every sampler draws from a :class:`numpy.random.Generator` passed to it (one per client,
spec/07 §5), never from a global RNG. Length samplers return token counts (int ≥ 1);
arrival samplers return inter-arrival times in integer µs (truncated, floored at 1) for a
client rate ``λ`` given in requests per µs.

Go → NumPy draw mapping: ``NormFloat64`` = ``standard_normal()``, ``ExpFloat64`` =
``standard_exponential()``, ``Float64`` = ``random()``. A sampler that needs no randomness
(constant, ``min == max`` Gaussian, single-key empirical) draws nothing, which matters for
the draw order of the generator.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from blis_simpy.errors import ConfigError
from blis_simpy.units import MAX_INT64, round_half_away, to_int64

log = logging.getLogger(__name__)

SMALLEST_POSITIVE = 5e-324  # Go's math.SmallestNonzeroFloat64
MIN_RATE_PER_US = 1e-15
LENGTH_TYPES = ("gaussian", "exponential", "pareto_lognormal", "constant", "empirical")
ARRIVAL_PROCESSES = ("poisson", "gamma", "weibull", "constant")
WEIBULL_CV_RANGE = (0.01, 10.4)


def _to_count(x: float) -> int:
    """round_half_away, floor 1; NaN/±inf ⇒ 1; values beyond int64 saturate."""
    if x != x or math.isinf(x):
        return 1
    if x >= 9.2e18:
        return MAX_INT64
    return max(1, round_half_away(x))


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan


# ------------------------------------------------------------------------------ lengths

class LengthSampler(Protocol):
    def sample(self, rng: np.random.Generator) -> int:
        """One token count (≥ 1)."""
        ...


@dataclass(frozen=True, slots=True)
class GaussianSampler:
    """``round_half_away(clamp(N(mean, std_dev), min, max))``, floor 1; ``min`` if min == max."""

    mean: float
    std_dev: float
    min: int
    max: int

    def sample(self, rng: np.random.Generator) -> int:
        if self.min == self.max:
            return max(1, self.min)
        v = rng.standard_normal() * self.std_dev + self.mean
        return max(1, round_half_away(min(max(v, float(self.min)), float(self.max))))


@dataclass(frozen=True, slots=True)
class ExponentialSampler:
    """``round_half_away(Exp(1) · mean)``, floor 1."""

    mean: float

    def sample(self, rng: np.random.Generator) -> int:
        return _to_count(rng.standard_exponential() * self.mean)


@dataclass(frozen=True, slots=True)
class ParetoLogNormalSampler:
    """Mixture: Pareto(xm, alpha) with probability ``mix_weight``, else LogNormal(mu, sigma)."""

    alpha: float
    xm: float
    mu: float
    sigma: float
    mix_weight: float

    def sample(self, rng: np.random.Generator) -> int:
        if rng.random() < self.mix_weight:
            u = rng.random() or SMALLEST_POSITIVE
            inv_alpha = 1.0 / self.alpha if self.alpha != 0 else math.copysign(math.inf, self.alpha)
            den = _pow(u, inv_alpha)
            val = self.xm / den if den != 0 else (math.copysign(math.inf, self.xm) if self.xm else math.nan)
        else:
            try:
                val = math.exp(self.mu + self.sigma * rng.standard_normal())
            except OverflowError:
                val = math.inf
        return _to_count(val)


@dataclass(frozen=True, slots=True)
class ConstantSampler:
    """Always ``int(value)`` (truncated), floor 1. Draws nothing."""

    value: int

    def sample(self, rng: np.random.Generator) -> int:
        return self.value


@dataclass(frozen=True, slots=True)
class EmpiricalSampler:
    """Inverse-CDF sampling of an empirical PMF over ascending token counts."""

    keys: tuple[int, ...]
    cdf: tuple[float, ...]

    def sample(self, rng: np.random.Generator) -> int:
        if not self.keys:
            return 1
        if len(self.keys) == 1:
            return max(1, self.keys[0])
        i = bisect.bisect_left(self.cdf, rng.random())
        return max(1, self.keys[min(i, len(self.keys) - 1)])


_LEADING_INT = re.compile(r"\s*([+-]?[0-9]+)")


def empirical_sampler(pmf: Mapping[object, float], field: str = "params") -> EmpiricalSampler:
    """Build an :class:`EmpiricalSampler` from ``{"token_count": probability}``.

    Keys are parsed as their leading integer (``"128"``, ``"128.0"`` → 128; equal keys add
    up); entries with p ≤ 0 are dropped; the CDF is normalised with its last entry forced
    to 1.0.
    """
    acc: dict[int, float] = {}
    for k, p in pmf.items():
        m = _LEADING_INT.match(str(k))
        if m is None:
            raise ConfigError(f"empirical key {str(k)!r} is not a token count", field=field)
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not math.isfinite(p):
            raise ConfigError(f"probability of {str(k)!r} must be a finite number, got {p!r}",
                              field=f"{field}.{k}")
        if p > 0:
            key = int(m.group(1))
            acc[key] = acc.get(key, 0.0) + float(p)
    keys = tuple(sorted(acc))
    total = sum(acc[k] for k in keys)
    cdf, run = [], 0.0
    for k in keys:
        run += acc[k]
        cdf.append(run / total)
    if cdf:
        cdf[-1] = 1.0
    return EmpiricalSampler(keys, tuple(cdf))


_REQUIRED = {
    "gaussian": ("mean", "std_dev", "min", "max"),
    "exponential": ("mean",),
    "pareto_lognormal": ("alpha", "xm", "mu", "sigma", "mix_weight"),
    "constant": ("value",),
}


def make_length_sampler(dist_type: str, params: Mapping[object, float],
                        field: str = "distribution") -> LengthSampler:
    """A length sampler for a DistSpec ``(type, params)``; errors name ``field``."""
    if dist_type == "empirical":
        return empirical_sampler(params, f"{field}.params")
    if dist_type not in _REQUIRED:
        raise ConfigError(f"unknown distribution type {dist_type!r} "
                          f"(valid: {', '.join(LENGTH_TYPES)})", field=f"{field}.type")
    vals: dict[str, float] = {}
    for k in _REQUIRED[dist_type]:
        if k not in params:
            raise ConfigError(f'distribution requires parameter "{k}"', field=f"{field}.params")
        v = params[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"must be a finite number, got {v!r}", field=f"{field}.params.{k}")
        vals[k] = float(v)
    if dist_type == "gaussian":
        return GaussianSampler(vals["mean"], vals["std_dev"], to_int64(vals["min"]),
                               to_int64(vals["max"]))
    if dist_type == "exponential":
        return ExponentialSampler(vals["mean"])
    if dist_type == "pareto_lognormal":
        return ParetoLogNormalSampler(vals["alpha"], vals["xm"], vals["mu"], vals["sigma"],
                                      vals["mix_weight"])
    return ConstantSampler(max(1, to_int64(vals["value"])))


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
        return g * _pow(rng.random(), 1.0 / shape)
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
        return _to_iat(self.scale * _pow(-math.log(u), 1.0 / self.shape))


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


# ------------------------------------------------------------------------------ requests

VOCAB_SIZE = 128_000   # token IDs are uniform in [0, VOCAB_SIZE)


def _dist_sampler(d, field: str) -> LengthSampler | None:
    """The length sampler of a DistSpec-like object (``.type``, ``.params``), or None."""
    return None if d is None else make_length_sampler(d.type, d.params, field)


class MultimodalSampler:
    """Per-modality token counts (spec/07 §6): text, then (count, per-item sizes) for image,
    audio and video; a modality needs both its size and its count distribution."""

    def __init__(self, mm, field: str):
        self.text = _dist_sampler(mm.text_distribution, f"{field}.text_distribution")
        self.media: list[tuple[LengthSampler, LengthSampler] | None] = []
        for m in ("image", "audio", "video"):
            size, count = getattr(mm, f"{m}_distribution"), getattr(mm, f"{m}_count_distribution")
            self.media.append((_dist_sampler(count, f"{field}.{m}_count_distribution"),
                               _dist_sampler(size, f"{field}.{m}_distribution"))
                              if size is not None and count is not None else None)

    def sample(self, rng: np.random.Generator) -> tuple[int, int, int, int]:
        """``(text, image, audio, video)`` token counts."""
        text = self.text.sample(rng) if self.text is not None else 0
        sums = []
        for pair in self.media:
            if pair is None:
                sums.append(0)
                continue
            count, size = pair
            sums.append(sum(size.sample(rng) for _ in range(count.sample(rng))))
        return text, sums[0], sums[1], sums[2]


class RequestSampler:
    """The lengths and token IDs of one request (or session round) of a client.

    Draw order (spec/07 §5 step 6): input length, output length, input IDs, output IDs;
    multimodal clients (§6): the modality counts, input IDs, output length, output IDs.
    The reason ratio (§7) is a separate draw, :meth:`reason_ratio`. The client is any object
    with ``input_distribution``, ``output_distribution``, ``multimodal`` and ``reasoning``.
    """

    __slots__ = ("inp", "out", "mm", "ratio")

    def __init__(self, client, field: str = "client"):
        self.out = _dist_sampler(client.output_distribution, f"{field}.output_distribution")
        mm = client.multimodal
        self.mm = MultimodalSampler(mm, f"{field}.multimodal") if mm is not None else None
        self.inp = (None if self.mm is not None else
                    _dist_sampler(client.input_distribution, f"{field}.input_distribution"))
        r = client.reasoning
        self.ratio = (_dist_sampler(r.reason_ratio_distribution,
                                    f"{field}.reasoning.reason_ratio_distribution")
                      if r is not None else None)

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int, int]]:
        """``(input IDs, output IDs, (text, image, audio, video) counts)``; int32 arrays."""
        if self.mm is None:
            n_in = self.inp.sample(rng)
            n_out = self.out.sample(rng)
            ids = rng.integers(0, VOCAB_SIZE, size=n_in + n_out, dtype=np.int32)
            return ids[:n_in], ids[n_in:], (0, 0, 0, 0)
        mod = self.mm.sample(rng)
        inp = rng.integers(0, VOCAB_SIZE, size=sum(mod) or 1, dtype=np.int32)
        n_out = self.out.sample(rng)
        return inp, rng.integers(0, VOCAB_SIZE, size=n_out, dtype=np.int32), mod

    def reason_ratio(self, rng: np.random.Generator) -> float:
        """``clamp(sample / 100, 0, 1)`` (the sample is a percentage); 0 without a distribution."""
        if self.ratio is None:
            return 0.0
        return min(max(self.ratio.sample(rng) / 100.0, 0.0), 1.0)
