"""BLIS's percentile and mean arithmetic (docs/metrics.md, "Percentiles and means"), over
sorted lists and histograms.

Two flavours exist in BLIS and both are reproduced bit for bit:

* the JSON summary (``*_ms`` fields): :func:`percentile_ms` and :func:`mean_ms`. Values are
  µs; the result is ms. The interpolation is evaluated as Go's ``CalculatePercentile`` does it,
  ``v[lo]/1000 + (v[hi]-v[lo])·frac/1000`` (the form that reproduces every ``*_p9x_ms`` of the
  conformance cases exactly; dividing after interpolating, or converting both ends to ms
  first, is off by an ulp in a few percent of cases). The mean is ``Σv / n / 1000``.
* :class:`Distribution` (raw metrics, per-SLO, per-model, PD): the same rank rule on raw µs
  values, ``v[lo] + (v[hi]-v[lo])·frac``, with mean, p50, p95, p99, min, max, count.

The rank rule: ``rank = p/100·(n−1)``; integer rank ⇒ ``v[rank]``; otherwise linear
interpolation between ``v[floor(rank)]`` and ``v[ceil(rank)]``. Empty input ⇒ 0.

Histograms (``{value: count}``, e.g. ``InstanceMetrics.all_itls``) give exactly the value the
expanded sorted list would give: the two order statistics are located by a binary search over
cumulative counts, and the sum is the exact integer ``Σ value·count`` (Go's float64 running
sum of integer samples is exact below 2^53, so both agree).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Distribution",
    "SortedHistogram",
    "hist_mean_ms",
    "hist_percentile",
    "hist_percentile_ms",
    "mean",
    "mean_ms",
    "percentile",
    "percentile_ms",
    "rank_bounds",
]


def rank_bounds(n: int, p: float) -> tuple[int, int, float]:
    """``(lo, hi, frac)`` of BLIS's rank rule for ``n >= 1`` values and percentile ``p``.

    ``lo == hi`` (and ``frac == 0``) when the rank is an integer.
    """
    rank = p / 100.0 * float(n - 1)
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return lo, hi, rank - lo


def _interp_ms(a, b, frac: float) -> float:
    # Go: float64(lower)/1000 + float64(upper-lower)*(rank-float64(lowerIdx))/1000
    return float(a) / 1000 + float(b - a) * frac / 1000


def _interp(a, b, frac: float) -> float:
    a = float(a)
    return a + (float(b) - a) * frac


# ------------------------------------------------------------------------- sorted lists
def percentile_ms(sorted_values: Sequence, p: float) -> float:
    """Percentile ``p`` of ascending µs values, in ms (JSON summary rule). Empty ⇒ 0."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    lo, hi, frac = rank_bounds(n, p)
    if lo == hi:
        return float(sorted_values[lo]) / 1000
    return _interp_ms(sorted_values[lo], sorted_values[hi], frac)


def percentile(sorted_values: Sequence, p: float) -> float:
    """Percentile ``p`` of ascending values in their own unit (Distribution rule). Empty ⇒ 0."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    lo, hi, frac = rank_bounds(n, p)
    if lo == hi:
        return float(sorted_values[lo])
    return _interp(sorted_values[lo], sorted_values[hi], frac)


def _go_sum(values: Iterable) -> float:
    """Go's ``sum += float64(v)``, left to right."""
    s = 0.0
    for v in values:
        s += float(v)
    return s


def mean_ms(values: Sequence) -> float:
    """``Σv / n / 1000`` as Go evaluates it (sum left to right in float64). Empty ⇒ 0."""
    n = len(values)
    if n == 0:
        return 0.0
    if all(type(v) is int for v in values):
        # exact integer sum; identical to Go's float64 running sum while it stays < 2^53
        return float(sum(values)) / float(n) / 1000
    return _go_sum(values) / float(n) / 1000


def mean(values: Sequence) -> float:
    """Arithmetic mean, summed left to right in float64. Empty ⇒ 0."""
    n = len(values)
    if n == 0:
        return 0.0
    return _go_sum(values) / float(n)


# --------------------------------------------------------------------------- histograms
class SortedHistogram:
    """A ``{value: count}`` histogram prepared for order-statistic queries.

    Keys are sorted once; ``value_at(k)`` is the k-th (0-based) element of the expanded
    ascending list. Entries with a count ≤ 0 are ignored.
    """

    __slots__ = ("keys", "cum", "n", "total")

    def __init__(self, hist: Mapping):
        keys = sorted(k for k, c in hist.items() if c > 0)
        cum = []
        run = 0
        total = 0
        for k in keys:
            c = int(hist[k])
            run += c
            total += k * c
            cum.append(run)
        self.keys = keys
        self.cum = cum
        self.n = run
        self.total = total

    def __len__(self) -> int:
        return self.n

    def value_at(self, k: int):
        if not 0 <= k < self.n:
            raise IndexError(k)
        return self.keys[bisect_right(self.cum, k)]

    def percentile_ms(self, p: float) -> float:
        if self.n == 0:
            return 0.0
        lo, hi, frac = rank_bounds(self.n, p)
        a = self.value_at(lo)
        if lo == hi:
            return float(a) / 1000
        return _interp_ms(a, self.value_at(hi), frac)

    def percentile(self, p: float) -> float:
        if self.n == 0:
            return 0.0
        lo, hi, frac = rank_bounds(self.n, p)
        a = self.value_at(lo)
        if lo == hi:
            return float(a)
        return _interp(a, self.value_at(hi), frac)

    def mean_ms(self) -> float:
        if self.n == 0:
            return 0.0
        return float(self.total) / float(self.n) / 1000


def hist_percentile_ms(hist: Mapping, p: float) -> float:
    """:func:`percentile_ms` of the expanded histogram ``{value_us: count}``."""
    return SortedHistogram(hist).percentile_ms(p)


def hist_percentile(hist: Mapping, p: float) -> float:
    """:func:`percentile` of the expanded histogram ``{value: count}``."""
    return SortedHistogram(hist).percentile(p)


def hist_mean_ms(hist: Mapping) -> float:
    """:func:`mean_ms` of the expanded histogram of integer µs values."""
    return SortedHistogram(hist).mean_ms()


# ------------------------------------------------------------------------- Distribution
@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of raw values (µs): mean, p50, p95, p99, min, max, count. Empty ⇒ all 0."""

    mean: float = 0.0
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    min: float = 0.0
    max: float = 0.0
    count: int = 0

    @classmethod
    def from_values(cls, values: Iterable) -> Distribution:
        """Summarise ``values`` (any order). The mean sums them in the order given."""
        vals = list(values)
        n = len(vals)
        if n == 0:
            return cls()
        s = _go_sum(vals)
        vals.sort()
        return cls(
            mean=s / float(n),
            p50=percentile(vals, 50),
            p95=percentile(vals, 95),
            p99=percentile(vals, 99),
            min=float(vals[0]),
            max=float(vals[-1]),
            count=n,
        )

    @classmethod
    def from_map(cls, values_by_key: Mapping) -> Distribution:
        """Summarise the values of a map, gathered in sorted-key order."""
        return cls.from_values(values_by_key[k] for k in sorted(values_by_key))

    def to_dict_ms(self) -> dict:
        """Our JSON form, in ms: ``{"mean_ms", "p50_ms", "p95_ms", "p99_ms", "min_ms",
        "max_ms", "count"}``; the statistics are ``null`` when there are no values."""
        empty = self.count == 0
        out: dict = {f"{k}_ms": None if empty else float(getattr(self, k)) / 1000
                     for k in ("mean", "p50", "p95", "p99", "min", "max")}
        out["count"] = self.count
        return out
