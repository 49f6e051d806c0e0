"""Integer-time arithmetic with BLIS's rounding rules (docs/determinism.md, "Time and numbers").

The simulation clock is an integer number of microseconds (1 tick = 1 µs). Go's float→int
conversion truncates toward zero; Go's ``math.Round`` rounds half away from zero. Python's
``round`` is banker's rounding, so it must never be used for simulation arithmetic.
"""

from __future__ import annotations

import math

MAX_INT64 = 2**63 - 1
"""The default (unbounded) horizon, in µs."""


def to_int64(x: float) -> int:
    """Go's ``int64(x)`` as BLIS uses it: truncate toward zero; NaN or x >= 2^63 gives 2^63-1."""
    if x != x or x >= 9.223372036854775807e18:
        return MAX_INT64
    if x <= -9.223372036854775808e18:
        return -MAX_INT64 - 1
    return int(x)


def round_half_away(x: float) -> int:
    """Go's ``math.Round`` followed by an int conversion: halves round away from zero."""
    if x != x or math.isinf(x):
        raise ValueError(f"cannot round {x!r} to an integer")
    a = abs(x)
    f = math.floor(a)
    r = f + 1 if a - f >= 0.5 else f  # a - f is exact in binary floating point
    return int(r) if x >= 0 else -int(r)


def seconds_to_us(seconds: float) -> int:
    """A time or duration given in seconds (a scenario key) as integer µs, halves away from
    zero (:func:`round_half_away`)."""
    return round_half_away(seconds * 1e6)


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative integers, exactly."""
    return (a + b - 1) // b
