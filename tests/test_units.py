"""BLIS integer arithmetic helpers (docs/determinism.md, "Time and numbers"): Go truncation, Go
``math.Round`` (half away from zero, never banker's rounding) and exact ceiling division."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal, localcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blis_simpy.units import MAX_INT64, ceil_div, round_half_away, to_int64

TWO_63 = 2**63
# The largest double strictly below 2^63 (2^63 - 1024): still converts normally.
BELOW_2_63 = 9223372036854774784.0


# ---------------------------------------------------------------------------- to_int64
def test_max_int64_constant():
    assert MAX_INT64 == 9223372036854775807


@pytest.mark.parametrize(("x", "expected"), [
    (0.0, 0),
    (-0.0, 0),
    (2.7, 2),            # truncation, not rounding (round would give 3)
    (2.9999999, 2),
    (-2.7, -2),          # toward zero, not floor (floor would give -3)
    (-0.5, 0),
    (-0.9999, 0),
    (1000.9, 1000),
    (1e15 + 0.5, 1_000_000_000_000_000),
    (BELOW_2_63, 9223372036854774784),
    (-BELOW_2_63, -9223372036854774784),
])
def test_to_int64_truncates_toward_zero(x, expected):
    got = to_int64(x)
    assert got == expected
    assert type(got) is int


@pytest.mark.parametrize("x", [math.nan, -math.nan, float(TWO_63), 1e19, 1e300, math.inf])
def test_to_int64_saturates_nan_and_values_at_or_above_2_63(x):
    # NaN and x >= 2^63 (including +inf) give 2^63-1
    assert to_int64(x) == MAX_INT64


@pytest.mark.parametrize("x", [-float(TWO_63), -1e19, -math.inf])
def test_to_int64_large_negatives_clamp_to_min_int64(x):
    # int(-inf) would raise OverflowError; the helper clamps at the int64 minimum instead
    assert to_int64(x) == -TWO_63


def test_to_int64_accepts_plain_ints():
    assert to_int64(5) == 5
    assert to_int64(-7) == -7


@given(st.floats(min_value=-9.2e18, max_value=9.2e18, allow_nan=False))
def test_to_int64_matches_math_trunc_in_range(x):
    assert to_int64(x) == math.trunc(x)


# ---------------------------------------------------------------------------- round_half_away
@pytest.mark.parametrize(("x", "expected"), [
    (0.0, 0),
    (0.5, 1),            # banker's round() would give 0
    (-0.5, -1),          # banker's round() would give 0 (well, -0)
    (1.5, 2),
    (2.5, 3),            # banker's round() would give 2
    (-2.5, -3),
    (3.5, 4),
    (2.4999999999999996, 2),
    (2.5000000000000004, 3),
    (-1.4, -1),
    (-1.6, -2),
    # floor(x + 0.5) gets these wrong: 0.49999999999999994 + 0.5 rounds up to 1.0
    (0.49999999999999994, 0),
    (-0.49999999999999994, 0),
    # ... and 2^52+1: x + 0.5 is not representable and rounds (to even) to 2^52+2
    (4503599627370497.0, 4503599627370497),
    (-4503599627370497.0, -4503599627370497),
    (4503599627370495.5, 4503599627370496),   # a genuine .5 at the 2^52 boundary
    (1e20, 100000000000000000000),
    (-1e20, -100000000000000000000),
    (9007199254740993.0, 9007199254740992),   # literal is not representable: 2^53 exactly
])
def test_round_half_away(x, expected):
    got = round_half_away(x)
    assert got == expected
    assert type(got) is int


@pytest.mark.parametrize("x", [math.nan, math.inf, -math.inf])
def test_round_half_away_rejects_non_finite(x):
    with pytest.raises(ValueError):
        round_half_away(x)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_round_half_away_matches_exact_decimal_rounding(x):
    # Decimal(x) is the exact binary value; ROUND_HALF_UP in decimal means "half away from zero"
    with localcontext() as ctx:
        ctx.prec = 400          # enough digits for any finite double
        expected = int(Decimal(x).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    assert round_half_away(x) == expected


@given(st.integers(-(2**40), 2**40))
def test_round_half_away_on_exact_halves(k):
    # k + 0.5 is exact for |k| <= 2^40; it must go away from zero
    x = k + 0.5
    assert round_half_away(x) == (k + 1 if x > 0 else k)


# ---------------------------------------------------------------------------- ceil_div
@pytest.mark.parametrize(("a", "b", "expected"), [
    (0, 16, 0),
    (1, 16, 1),
    (15, 16, 1),
    (16, 16, 1),
    (17, 16, 2),
    (32, 16, 2),
    (33, 16, 3),
    (7, 1, 7),
    (10**30 + 1, 10**15, 10**15 + 1),    # exact on big ints (float division would be off)
    (2**63 - 1, 16, 2**59),
])
def test_ceil_div(a, b, expected):
    assert ceil_div(a, b) == expected


@given(st.integers(0, 2**80), st.integers(1, 2**40))
def test_ceil_div_is_the_least_q_with_qb_at_least_a(a, b):
    q = ceil_div(a, b)
    assert q * b >= a
    assert (q - 1) * b < a or q == 0


def test_seconds_to_us_rounds_halves_away_and_is_exact_on_float_noise():
    from blis_simpy.units import seconds_to_us
    assert seconds_to_us(2.01) == 2_010_000         # 2.01 x 1e6 = 2009999.9999999998
    assert seconds_to_us(15.0) == 15_000_000
    assert seconds_to_us(2.5e-6) == 3                 # a half goes away from zero (round(): 2)
    assert seconds_to_us(0.0) == 0
