"""The knee of a latency-vs-rate curve (docs/planning.md, "Reports").

**Definition.** Sort the points by rate. The low-load latency is the latency at the lowest
rate. The knee is the *lowest rate whose latency exceeds* ``factor`` × *the low-load
latency* (default factor 2: "p99 latency doubled"). It is a swept point, not an
interpolation, so it is a rate that was actually run. No point above the threshold means no
knee within the sweep (None).

Why this rule and not the point of maximum curvature: it needs no smoothing, it does not move
when points are added far beyond the knee, and its meaning is the one a capacity planner
asks for ("from which rate does p99 TTFT degrade by 2×?").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["DEFAULT_FACTOR", "knee"]

DEFAULT_FACTOR = 2.0


def knee(rates: Sequence[float], latencies: Sequence[float],
         factor: float = DEFAULT_FACTOR) -> tuple[float, float] | None:
    """``(rate, latency)`` of the knee of the curve, or None (fewer than two finite points,
    a non-positive low-load latency, or no point above ``factor`` × it). ``factor`` > 1."""
    if not (math.isfinite(factor) and factor > 1):
        raise ValueError(f"knee factor must be finite and > 1, got {factor}")
    pts = sorted((float(r), float(y)) for r, y in zip(rates, latencies, strict=True)
                 if y is not None and math.isfinite(float(r)) and math.isfinite(float(y)))
    if len(pts) < 2 or pts[0][1] <= 0:
        return None
    limit = factor * pts[0][1]
    for r, y in pts[1:]:
        if y > limit:
            return r, y
    return None
