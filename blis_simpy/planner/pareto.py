"""Pareto fronts of evaluated deployments (cost vs a latency or a throughput)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def front(items: Sequence, cost: Callable[[object], float], value: Callable[[object], float | None],
          *, maximize: bool = False) -> list:
    """The items no other item beats on both axes: lower ``cost`` and better ``value``
    (lower, or higher with ``maximize``). Items whose value is None or NaN are left out.
    Sorted by cost; of equal-cost items only the best value stays (first one on a tie)."""
    sign = -1.0 if maximize else 1.0
    scored = []
    for i, it in enumerate(items):
        v = value(it)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        scored.append((cost(it), sign * v, i, it))
    scored.sort(key=lambda t: (t[0], t[1], t[2]))
    out, best = [], math.inf
    for _c, v, _i, it in scored:
        if v < best:
            out.append(it)
            best = v
    return out
