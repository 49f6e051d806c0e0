"""Token-length samplers (docs/workloads.md, "The workload-spec v2", length distributions).

Every sampler draws from a :class:`numpy.random.Generator` passed to it (one per client),
never from a global RNG, and returns token counts (int ≥ 1, at most :data:`MAX_TOKENS`: every
token-count parameter is refused above it, and the unbounded samplers — exponential,
pareto_lognormal — clip their samples there; BLIS has no cap). Go → NumPy draw mapping:
``NormFloat64`` = ``standard_normal()``, ``ExpFloat64`` = ``standard_exponential()``,
``Float64`` = ``random()``. A sampler that needs no randomness (constant, ``min == max``
Gaussian, single-key empirical) draws nothing, which matters for the generator's draw order.
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

from blis_simpy.bounds import MAX_TOKENS
from blis_simpy.errors import ConfigError
from blis_simpy.units import round_half_away, to_int64

log = logging.getLogger(__name__)

SMALLEST_POSITIVE = 5e-324  # Go's math.SmallestNonzeroFloat64
LENGTH_TYPES = ("gaussian", "exponential", "pareto_lognormal", "constant", "empirical")
#: the parameters of each type that are token counts, each at most MAX_TOKENS (pareto's
#: ``mu`` is the log of its lognormal median: at most ln MAX_TOKENS); the empirical keys too
TOKEN_PARAMS = {"gaussian": ("mean", "std_dev", "min", "max"), "exponential": ("mean",),
                "pareto_lognormal": ("xm",), "constant": ("value",)}
MAX_LOG_TOKENS = math.log(MAX_TOKENS)


def _to_count(x: float) -> int:
    """round_half_away, floor 1, clipped at MAX_TOKENS; NaN/±inf ⇒ 1 (as BLIS)."""
    if x != x or math.isinf(x):
        return 1
    if x >= MAX_TOKENS:
        return MAX_TOKENS
    return max(1, round_half_away(x))


def go_pow(a: float, b: float) -> float:
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
            den = go_pow(u, inv_alpha)
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
    up) and may not exceed :data:`MAX_TOKENS`; entries with p ≤ 0 are dropped; the CDF is normalised with its last entry forced
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
        key = int(m.group(1))
        if key > MAX_TOKENS:
            raise ConfigError(f"token count {str(k)!r} is more than {MAX_TOKENS} tokens (2^24)",
                              field=f"{field}.{k}")
        if p > 0:
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
    for k in params:      # BLIS ignores unknown parameters; a misspelt one is refused here
        if k not in _REQUIRED[dist_type]:
            raise ConfigError(f"unknown key ({dist_type} takes {', '.join(_REQUIRED[dist_type])})",
                              field=f"{field}.params.{k}")
    vals: dict[str, float] = {}
    for k in _REQUIRED[dist_type]:
        if k not in params:
            raise ConfigError(f'distribution requires parameter "{k}"', field=f"{field}.params")
        v = params[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"must be a finite number, got {v!r}", field=f"{field}.params.{k}")
        if k in TOKEN_PARAMS[dist_type] and v > MAX_TOKENS:
            shown = int(v) if float(v).is_integer() else v
            raise ConfigError(f"must be at most {MAX_TOKENS} tokens (2^24), got {shown}",
                              field=f"{field}.params.{k}")
        vals[k] = float(v)
    if dist_type == "pareto_lognormal" and vals["mu"] > MAX_LOG_TOKENS:
        raise ConfigError(f"must be at most ln {MAX_TOKENS} = {MAX_LOG_TOKENS:.4f} (the lognormal's "
                          f"median e^mu is a token count), got {vals['mu']}",
                          field=f"{field}.params.mu")
    if dist_type == "gaussian":
        return GaussianSampler(vals["mean"], vals["std_dev"], to_int64(vals["min"]),
                               to_int64(vals["max"]))
    if dist_type == "exponential":
        return ExponentialSampler(vals["mean"])
    if dist_type == "pareto_lognormal":
        return ParetoLogNormalSampler(vals["alpha"], vals["xm"], vals["mu"], vals["sigma"],
                                      vals["mix_weight"])
    return ConstantSampler(max(1, to_int64(vals["value"])))
