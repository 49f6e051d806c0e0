"""The figures of a sweep dataset (docs/planning.md, "Reports").

* ``latency_vs_rate`` — p99 TTFT/E2E/ITL (ms, log axis with plain numbers) against the swept
  rate, the mean over seeds, one line per combination of the other axes, a band from the
  lowest to the highest seed's value where a point has several seeds, the knee marked
  (:mod:`blis_simpy.report.knee`), and the SLO threshold of the metric (``slo.<m>_ms``)
  drawn as a dashed line when the dataset has one;
* ``slo_heatmap`` — SLO attainment (%) over two axes (mean over the rest) in a diverging
  colormap centred on the attainment target (:data:`TARGET_PCT`: green above, red below,
  pale near it); cells at or past the knee of any p99 latency line are *saturated*: hatched
  and listed, and each cell also gives its completed requests per second.
"""

from __future__ import annotations

import math
from collections import defaultdict

from matplotlib.colors import Normalize, TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from blis_simpy.report.inputs import Input
from blis_simpy.report.knee import DEFAULT_FACTOR, knee
from blis_simpy.report.style import log_axis, new_figure, outside_legend, plain_numbers

__all__ = ["LATENCY_COLUMNS", "TARGET_PCT", "heatmap_figure", "latency_rate_figure", "num"]

MAX_LINES = 12           # lines of one axes: the rest are left out
#: the attainment the heat map's colours are centred on, % (the plan's default
#: ``min_completed_fraction`` of 0.99, as a per-request attainment)
TARGET_PCT = 99.0
#: p99 latency columns drawn against the rate, their label and their SLO threshold column
LATENCY_COLUMNS = (("m.ttft_p99_ms", "p99 TTFT (ms)", "slo.ttft_ms"),
                   ("m.e2e_p99_ms", "p99 E2E (ms)", "slo.e2e_ms"),
                   ("m.itl_p99_ms", "p99 ITL (ms)", "slo.itl_ms"))
_NON_AXIS = {"config_hash", "config_key", "seed", "command", "status", "error", "wall_s", "config"}
_METRIC_PREFIXES = ("m.", "slo.", "deployment.")


def _axes_of(table) -> list[str]:
    return [n for n in table.column_names
            if n not in _NON_AXIS and not n.startswith(_METRIC_PREFIXES)]


def _varied(table) -> list[str]:
    return [a for a in _axes_of(table) if len(set(map(str, table.column(a).to_pylist()))) > 1]


def num(v) -> float | None:
    """``v`` as a finite float, else None (booleans too)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _rate_axis(table) -> str | None:
    axes = _axes_of(table)
    for name in ["workload.rate"] + [a for a in axes if a.endswith("rate")]:
        if name in axes and all(num(v) is not None for v in table.column(name).to_pylist()):
            return name
    return None


def _stats(table, keys: list[str], value: str) -> dict[tuple, tuple[float, float, float]]:
    """(mean, lowest, highest) of ``value`` per combination of ``keys`` (over the seeds and
    the other axes)."""
    acc: dict[tuple, list[float]] = defaultdict(list)
    cols = [table.column(k).to_pylist() for k in keys]
    for i, v in enumerate(table.column(value).to_pylist()):
        f = num(v)
        if f is not None:
            acc[tuple(c[i] for c in cols)].append(f)
    return {k: (math.fsum(v) / len(v), min(v), max(v)) for k, v in acc.items()}


def _sort_key(v):
    f = num(v)
    return (0, f, "") if f is not None else (1, 0.0, str(v))


def _lines(table, rate: str, others: list[str], col: str) -> dict[tuple, list[tuple]]:
    """Per combination of ``others``: sorted ``(rate, mean, lowest, highest)`` points."""
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for key, (mean, lo, hi) in _stats(table, others + [rate], col).items():
        groups[key[:-1]].append((float(key[-1]), mean, lo, hi))
    return {g: sorted(groups[g]) for g in sorted(groups, key=lambda k: tuple(map(_sort_key, k)))}


def _thresholds(table, col: str | None) -> list[float]:
    """The distinct positive SLO thresholds of column ``col`` (none when absent)."""
    if col is None or col not in table.column_names:
        return []
    return sorted({f for f in map(num, table.column(col).to_pylist()) if f is not None and f > 0})


def latency_rate_figure(sweep: Input, factor: float = DEFAULT_FACTOR
                        ) -> tuple[Figure, list[str]] | None:
    """p99 latencies against the rate axis (see the module docstring); also the knee notes
    (one line each). None without a numeric rate axis or a p99 latency column."""
    t = sweep.table
    rate = _rate_axis(t) if t is not None and t.num_rows else None
    metrics = [m for m in LATENCY_COLUMNS if rate and m[0] in t.column_names]
    if not metrics:
        return None
    others = [a for a in _varied(t) if a != rate]
    fig, axes = new_figure(1, len(metrics))
    notes: list[str] = []
    banded = False
    for ax, (col, label, slo_col) in zip(axes[0], metrics, strict=True):
        values: list[float] = []
        for g, pts in list(_lines(t, rate, others, col).items())[:MAX_LINES]:
            name = ", ".join(f"{a}={v}" for a, v in zip(others, g, strict=True)) or "sweep"
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=name)
            values += [v for p in pts for v in p[1:]]
            if any(p[3] > p[2] for p in pts):
                ax.fill_between(xs, [p[2] for p in pts], [p[3] for p in pts], alpha=0.2,
                                color=line.get_color(), linewidth=0)
                banded = True
            k = knee(xs, ys, factor)
            if k is not None:
                ax.plot([k[0]], [k[1]], marker="X", markersize=11, color=line.get_color(),
                        linestyle="none")
                ax.annotate(f"knee {k[0]:g}", k, textcoords="offset points", xytext=(-10, 8),
                            fontsize=7, ha="right")
                notes.append(f"{label}, {name}: knee at rate {k[0]:g} ({k[1]:.1f} ms, more than "
                             f"{factor:g}x the lowest-rate value)")
            else:
                notes.append(f"{label}, {name}: no knee within the sweep (never above "
                             f"{factor:g}x the lowest-rate value)")
        for thr in _thresholds(t, slo_col):
            ax.axhline(thr, color="tab:red", linestyle="--", linewidth=1, label="SLO threshold")
            values.append(thr)
        ax.set_xlabel(rate)
        ax.set_ylabel(label)
        plain_numbers(ax.xaxis)
        pos = [v for v in values if v > 0]
        if pos:
            log_axis(ax, "y", min(pos), max(pos))
    extra = [Patch(color="gray", alpha=0.2, label="lowest to highest seed")] if banded else []
    outside_legend(fig, axes[0], loc="outside lower center", extra=extra)
    return fig, notes


def _attainment_column(names: list[str]) -> str | None:
    if "slo.attainment_pct.all" in names:
        return "slo.attainment_pct.all"
    for prefix in ("slo.attainment_pct", "slo."):
        found = sorted(n for n in names if n.startswith(prefix))
        if found:
            return found[0]
    return None


def _saturated(t, x: str, y: str, factor: float) -> set[tuple]:
    """Cells ``(x value, y value)`` at or past the knee of a p99 latency line, when one of
    the two axes is the rate (means over the other axes)."""
    rate = _rate_axis(t)
    if rate not in (x, y):
        return set()
    other = y if rate == x else x
    out: set[tuple] = set()
    for col, _, _ in LATENCY_COLUMNS:
        if col not in t.column_names:
            continue
        for (ov,), pts in _lines(t, rate, [other], col).items():
            k = knee([p[0] for p in pts], [p[1] for p in pts], factor)
            if k is None:
                continue
            for rv in {r for r in t.column(rate).to_pylist() if float(r) >= k[0]}:
                out.add((rv, ov) if rate == x else (ov, rv))
    return out


def heatmap_figure(sweep: Input, factor: float = DEFAULT_FACTOR
                   ) -> tuple[Figure, str, list[str]] | None:
    """The SLO attainment column (mean) over the first two axes with at least two values
    (see the module docstring); also the column shown and one note per saturated cell.
    None without such axes or column."""
    t = sweep.table
    if t is None or not t.num_rows:
        return None
    value = _attainment_column(t.column_names)
    axes_ = _varied(t)
    if value is None or len(axes_) < 2:
        return None
    x, y = axes_[0], axes_[1]
    means = {k: v[0] for k, v in _stats(t, [x, y], value).items()}
    if not means:
        return None
    tput = ({k: v[0] for k, v in _stats(t, [x, y], "m.responses_per_sec").items()}
            if "m.responses_per_sec" in t.column_names else {})
    xs = sorted({k[0] for k in means}, key=_sort_key)
    ys = sorted({k[1] for k in means}, key=_sort_key)
    grid = [[means.get((xv, yv), math.nan) for xv in xs] for yv in ys]
    pct = "pct" in value
    norm = (TwoSlopeNorm(vmin=0.0, vcenter=TARGET_PCT, vmax=100.0) if pct
            else Normalize(vmin=0.0))
    fig, axes = new_figure()
    ax = axes[0][0]
    im = ax.imshow(grid, origin="lower", aspect="auto", cmap="RdYlGn", norm=norm)
    sat = _saturated(t, x, y, factor)
    notes = []
    for i, yv in enumerate(ys):
        for j, xv in enumerate(xs):
            v = grid[i][j]
            if math.isnan(v):
                continue
            text = "100" if v == 100 else f"{v:.1f}"
            if (xv, yv) in tput:
                text += f"\n{tput[xv, yv]:.3g} req/s"
            ax.text(j, i, text, ha="center", va="center", fontsize=7, zorder=3,
                    bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.85,
                          "linewidth": 0})
            if (xv, yv) in sat:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                                       edgecolor="black", linewidth=1.2, gid="saturated"))
                notes.append(f"saturated: {x}={xv}, {y}={yv} (at or past the knee of a p99 "
                             f"latency line; {text.replace(chr(10), ', ')})")
    ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=45, ha="right")
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.grid(False)
    bar = fig.colorbar(im, ax=ax, label=value)
    if pct:
        bar.set_ticks([0, 25, 50, 75, TARGET_PCT, 100])
    if sat:
        outside_legend(fig, [], loc="outside lower center", extra=[Patch(
            fill=False, hatch="//", label=f"saturated: at or past the knee ({factor:g}x the "
                                           "lowest-rate p99) of a latency line")])
    return fig, value, notes
