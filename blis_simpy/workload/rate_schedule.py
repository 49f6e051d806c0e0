"""Time-varying open load (docs/workloads.md, "Time-varying open load").

A rate over time is a list of :class:`RatePiece`: from ``start_us`` to ``end_us`` arrivals at
``rate`` requests/s. Three shapes make one:

* **stages** ``[{rate, duration_s}]`` (inference-perf's ``load.stages``): consecutive pieces
  from 0, each ``int(duration_s × 10⁶)`` µs long; nothing after the last;
* a **rate schedule** ``[{at_s, rate}]``: each rate from its point to the next; the last one
  to the end of the run (the horizon or the request cap); nothing before the first point;
* a **rate CSV** (``time_s,rate`` rows, e.g. a day's traffic): read as a rate schedule.

:func:`arrival_times` draws the arrival times (integer µs) piece by piece with the workload's
arrival process (constant, poisson or gamma with its cv) at the piece's rate. **Crossing a
boundary: every piece restarts its process at its start.** The first arrival of a piece is
one gap (drawn at the piece's rate) after its start; a gap that would pass the piece's end is
discarded and the next piece starts afresh at that end. A piece is ``(start, end]``: an
arrival exactly at the end belongs to it. For Poisson arrivals this is exact: by
memorylessness the time to the next arrival after the boundary is exponential at the new
rate whatever happened before, so the process is the non-homogeneous Poisson process of the
piecewise rate. For constant arrivals it resets the phase: a piece of rate r from s has its
arrivals at s + k·int(10⁶/r) µs (k = 1, 2, …) up to its end. For gamma arrivals the first gap
of a piece is a full gamma gap from the boundary (mean 1/λ), not the residual of a gap in
progress (mean (1 + cv²)/(2λ) in a stationary process): the renewal process restarts.
"""

from __future__ import annotations

import csv
import math
from array import array
from dataclasses import dataclass

import numpy as np

from blis_simpy.bounds import MAX_LOAD_PIECES, MAX_LOAD_RATE, MAX_REQUESTS, MAX_STAGE_S
from blis_simpy.errors import ConfigError
from blis_simpy.infile import open_input
from blis_simpy.units import MAX_INT64, seconds_to_us
from blis_simpy.workload.arrivals import make_arrival_sampler

__all__ = ["RatePiece", "arrival_times", "expected_arrivals", "rate_changes", "read_rate_csv",
           "schedule_pieces", "stage_pieces"]

#: µs per second
_US = 1_000_000


@dataclass(frozen=True, slots=True)
class RatePiece:
    """Arrivals at ``rate`` requests/s in ``(start_us, end_us]`` (``end_us`` MAX_INT64: open)."""

    start_us: int
    end_us: int
    rate: float


def _us(seconds: float) -> int:
    return seconds_to_us(seconds)


def stage_pieces(stages) -> list[RatePiece]:
    """Pieces of ``[{rate, duration_s}]`` stages (objects with ``rate`` and ``duration_s``), one
    after the other from 0."""
    out, t = [], 0
    for st in stages:
        end = t + max(_us(st.duration_s), 1)
        out.append(RatePiece(t, end, float(st.rate)))
        t = end
    return out


def schedule_pieces(points) -> list[RatePiece]:
    """Pieces of ``[(at_s, rate)]`` points (strictly increasing times): each rate until the next
    point, the last one open-ended."""
    out = []
    for i, (at_s, rate) in enumerate(points):
        end = _us(points[i + 1][0]) if i + 1 < len(points) else MAX_INT64
        out.append(RatePiece(_us(at_s), end, float(rate)))
    return out


def read_rate_csv(path: str, field: str = "workload.rate_csv") -> list[tuple[float, float]]:
    """The ``(time_s, rate)`` points of a rate CSV: a header naming the columns ``time_s`` and
    ``rate`` (any order, other columns ignored), then one row per point, times strictly
    increasing from ≥ 0 (at most 1e8 s), rates in [0, 1e9] requests/s, at most
    1,000,000 rows. A bad row is a :class:`ConfigError` naming the file, line and column."""
    try:
        with open_input(path, encoding="utf-8", newline="") as f:
            return _points(csv.reader(f), path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read the rate CSV {path}: {why}", field=field) from None


def _points(rows, path: str) -> list[tuple[float, float]]:
    header = next(rows, None)
    cols = [c.strip() for c in header] if header else []
    if "time_s" not in cols or "rate" not in cols:
        raise ConfigError(f"the header must name the columns time_s and rate, got {','.join(cols)!r}",
                          file=path, line=1)
    ti, ri = cols.index("time_s"), cols.index("rate")
    points: list[tuple[float, float]] = []
    for line, row in enumerate(rows, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(points) >= MAX_LOAD_PIECES:
            raise ConfigError(f"more than {MAX_LOAD_PIECES} rows", file=path, line=line)
        vals = []
        for name, i, lo, hi in (("time_s", ti, 0.0, MAX_STAGE_S), ("rate", ri, 0.0, MAX_LOAD_RATE)):
            cell = row[i].strip() if i < len(row) else ""
            try:
                v = float(cell)
            except ValueError:
                raise ConfigError(f"not a number: {cell!r}", file=path, line=line, field=name) from None
            if not (math.isfinite(v) and lo <= v <= hi):
                raise ConfigError(f"must be in [{lo:g}, {hi:g}], got {cell}", file=path, line=line,
                                  field=name)
            vals.append(v)
        if points and vals[0] <= points[-1][0]:
            raise ConfigError(f"{vals[0]:g} is not after the previous row's {points[-1][0]:g}",
                              file=path, line=line, field="time_s")
        points.append((vals[0], vals[1]))
    if not points:
        raise ConfigError("no rows after the header", file=path, line=1)
    return points


def _bounded(pieces: list[RatePiece], horizon_us: int) -> list[RatePiece]:
    return [RatePiece(p.start_us, min(p.end_us, horizon_us), p.rate)
            for p in pieces if p.start_us < horizon_us and p.rate > 0]


def expected_arrivals(pieces: list[RatePiece], horizon_us: int) -> float:
    """Σ rate × length over the pieces up to the horizon (inf when one is open with rate > 0)."""
    total = 0.0
    for p in _bounded(pieces, horizon_us):
        if p.end_us >= MAX_INT64:
            return math.inf
        total += p.rate * (p.end_us - p.start_us) / _US
    return total


def rate_changes(pieces: list[RatePiece]) -> np.ndarray:
    """The times (µs, increasing int64) where the rate changes: every piece's start and its end
    (an open end, MAX_INT64, included), once each."""
    n = len(pieces)
    starts = np.fromiter((p.start_us for p in pieces), dtype=np.int64, count=n)
    ends = np.fromiter((p.end_us for p in pieces), dtype=np.int64, count=n)
    # two increasing runs: a stable (merge) sort takes them in linear time, np.unique's
    # quicksort in about 1 s for a million pieces
    t = np.sort(np.concatenate((starts, ends)), kind="stable")
    return t[np.concatenate(([True], t[1:] != t[:-1]))] if n else t


def arrival_times(pieces: list[RatePiece], process: str, cv: float | None,
                  rng: np.random.Generator, *, horizon_us: int = MAX_INT64,
                  max_requests: int = 0) -> array:
    """The arrival times (µs, increasing; an ``array('q')``) of the pieces up to ``horizon_us``, each piece
    restarting the arrival ``process`` at its start (module docstring), at most
    ``max_requests`` (0: no cap but :data:`~blis_simpy.bounds.MAX_REQUESTS`). Draws from ``rng``."""
    cap = max_requests if 0 < max_requests <= MAX_REQUESTS else MAX_REQUESTS
    out = array("q")
    for i, p in enumerate(_bounded(pieces, horizon_us)):
        sampler = make_arrival_sampler(process, p.rate / _US, cv, field=f"piece[{i}]")
        t, end = p.start_us, p.end_us
        while len(out) < cap:
            t += sampler.iat(rng)
            if t > end:
                break
            out.append(t)
        if len(out) >= cap:
            break
    return out
