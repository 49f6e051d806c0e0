"""BLIS's percentile / mean arithmetic (docs/metrics.md) on lists, histograms and Distribution."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blis_simpy.metrics.percentile import (
    Distribution,
    SortedHistogram,
    hist_mean_ms,
    hist_percentile,
    hist_percentile_ms,
    mean,
    mean_ms,
    percentile,
    percentile_ms,
    rank_bounds,
)


def test_rank_bounds():
    assert rank_bounds(5, 50) == (2, 2, 0.0)          # 0.5 * 4 = 2
    lo, hi, frac = rank_bounds(5, 90)                  # 0.9 * 4 = 3.6
    assert (lo, hi) == (3, 4) and frac == pytest.approx(0.6)
    assert rank_bounds(1, 99) == (0, 0, 0.0)
    assert rank_bounds(101, 99) == (99, 99, 0.0)      # 0.99 * 100 = 99 exactly


def test_percentile_hand_computed():
    v = [10, 20, 30, 40, 50]
    assert percentile(v, 50) == 30.0
    assert percentile(v, 0) == 10.0
    assert percentile(v, 100) == 50.0
    assert percentile(v, 90) == pytest.approx(46.0)    # 40 + 10 * 0.6
    assert percentile(v, 95) == pytest.approx(48.0)    # 40 + 10 * 0.8
    assert percentile(v, 25) == 20.0                   # rank 1 exactly
    assert percentile([7], 99) == 7.0
    assert percentile([], 50) == 0.0
    assert percentile([1, 3], 50) == 2.0


def test_percentile_ms_hand_computed():
    v = [1000, 2000, 4000]
    assert percentile_ms(v, 50) == 2.0                 # rank 1
    assert percentile_ms(v, 90) == pytest.approx(3.6)  # 2 + 2000 * 0.8 / 1000
    assert percentile_ms(v, 99) == pytest.approx(3.96)
    assert percentile_ms([], 99) == 0.0
    assert percentile_ms([17208], 90) == 17.208


def test_percentile_ms_matches_go_rounding_order():
    """From A09's stdout: e2e_p95_ms = 3628.3574999999996 with n = 355, v[336] = 3628296 and
    v[337] = 3628501. Interpolating in µs and dividing afterwards gives 3628.3575 (1 ulp off);
    Go computes ``lo/1000 + (hi-lo)*frac/1000``."""
    v = [0] * 336 + [3628296, 3628501] + [4_000_000] * 17
    assert len(v) == 355
    assert percentile_ms(v, 95) == 3628.3574999999996
    # and from C25b: n = 800, v[719] = 30149217, v[720] = 30211278 -> 30155.423100000004
    v = [0] * 719 + [30149217, 30211278] + [40_000_000] * 79
    assert percentile_ms(v, 90) == 30155.423100000004


def test_means():
    assert mean_ms([1, 2, 4]) == 7 / 3 / 1000
    assert mean_ms([]) == 0.0
    assert mean([]) == 0.0
    assert mean([1.5, 2.5]) == 2.0
    # sum / n / 1000 (as BLIS: reproduces every conformance *_mean_ms), not sum / 1000 / n
    assert mean_ms([3992384, 9942865, 9130652]) == 7688.633666666667


def test_histogram_hand_computed():
    h = Counter({30: 1, 10: 2, 20: 2})                 # 10 10 20 20 30
    assert hist_percentile(h, 50) == 20.0
    assert hist_percentile(h, 90) == pytest.approx(26.0)   # rank 3.6: v[3] + (v[4]-v[3]) * 0.6
    assert hist_percentile_ms(h, 100) == 0.03
    assert hist_mean_ms(h) == 90 / 5 / 1000
    sh = SortedHistogram(h)
    assert [sh.value_at(k) for k in range(5)] == [10, 10, 20, 20, 30]
    with pytest.raises(IndexError):
        sh.value_at(5)
    assert hist_percentile_ms(Counter(), 99) == 0.0
    assert hist_mean_ms({5: 0, 7: -1}) == 0.0           # non-positive counts ignored


PCTS = st.one_of(st.sampled_from([0, 50, 90, 95, 99, 100]),
                 st.floats(min_value=0, max_value=100, allow_nan=False))


@given(st.dictionaries(st.integers(0, 10**9), st.integers(1, 40), min_size=1, max_size=30), PCTS)
def test_histogram_equals_expanded_list(hist, p):
    expanded = sorted(v for v, c in hist.items() for _ in range(c))
    assert hist_percentile_ms(hist, p) == percentile_ms(expanded, p)
    assert hist_percentile(hist, p) == percentile(expanded, p)
    assert hist_mean_ms(hist) == mean_ms(expanded)


def test_distribution_empty_and_single():
    assert Distribution.from_values([]) == Distribution(0, 0, 0, 0, 0, 0, 0)
    d = Distribution.from_values([42])
    assert (d.mean, d.p50, d.p95, d.p99, d.min, d.max, d.count) == (42, 42, 42, 42, 42, 42, 1)


def test_distribution_hand_computed():
    d = Distribution.from_values([3, 1, 2, 10])         # sorted 1 2 3 10
    assert d.count == 4 and d.min == 1.0 and d.max == 10.0
    assert d.mean == 4.0
    assert d.p50 == pytest.approx(2.5)                   # rank 1.5
    assert d.p95 == pytest.approx(3 + 7 * 0.85)          # rank 2.85
    assert d.p99 == pytest.approx(3 + 7 * 0.97)
    assert d.to_dict_ms() == {"mean_ms": 0.004, "p50_ms": d.p50 / 1000, "p95_ms": d.p95 / 1000,
                              "p99_ms": d.p99 / 1000, "min_ms": 0.001, "max_ms": 0.01, "count": 4}
    assert Distribution().to_dict_ms() == {"mean_ms": None, "p50_ms": None, "p95_ms": None,
                                           "p99_ms": None, "min_ms": None, "max_ms": None,
                                           "count": 0}


def test_distribution_from_map_sums_in_sorted_key_order():
    # key order a, b, c: 1e16 - 1e16 + 1 = 1; value order (-1e16, 1, 1e16) would give 0
    d = Distribution.from_map({"c": 1.0, "b": -1e16, "a": 1e16})
    assert d.mean == 1.0 / 3
    assert d.min == -1e16 and d.max == 1e16 and d.p50 == 1.0
