"""The look of every report figure (docs/planning.md, "Reports"): size, fonts, layout, axes
labelled with plain numbers, legends outside the data, labels that do not overlap.

* :func:`new_figure` — a fixed-size figure with *constrained layout* (matplotlib's layout
  engine keeps tick labels, axis labels and legends of neighbouring panels apart);
* :func:`plain_numbers` / :func:`log_axis` — tick labels written ``400``, ``2,000``,
  ``0.5`` instead of ``4×10²``; a log axis is numbered at the densest of 1-9, 1-2-5, 1-3 or
  1 times each decade that fits (:func:`log_ticks`), so even a short range has numbers and
  a long one no crowded labels;
* :func:`outside_legend` — one legend for the figure, outside every axes;
* :func:`place_labels` — annotations next to points, each at the first of a few offsets
  where it overlaps no label already placed and stays inside the axes; a label that fits
  nowhere is left out (and returned).
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

__all__ = ["DPI", "FIGSIZE", "STYLE", "count_axis", "finish_time_axes", "log_axis", "new_figure", "outside_legend", "place_labels",
           "log_ticks", "plain", "plain_numbers"]

FIGSIZE = (9.0, 5.0)
DPI = 100
STYLE = {"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": DPI,
         "savefig.dpi": DPI, "path.simplify": True}
#: offsets (points) tried in turn for a label, with its alignment
_OFFSETS = ((6, 6, "left", "bottom"), (6, -6, "left", "top"), (-6, 6, "right", "bottom"),
            (-6, -6, "right", "top"), (6, 18, "left", "bottom"), (-6, 18, "right", "bottom"),
            (6, -18, "left", "top"), (-6, -18, "right", "top"))


def new_figure(rows: int = 1, cols: int = 1, *, height: float | None = None,
               sharex: bool = False):
    """A :data:`FIGSIZE` figure (``height`` inches instead) with ``rows`` x ``cols`` axes (a
    2-D array), constrained layout, an Agg canvas (text sizes are measurable before saving)."""
    with plt.rc_context(STYLE):
        fig = Figure(figsize=(FIGSIZE[0], height or FIGSIZE[1]), dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, cols, squeeze=False, sharex=sharex)
    return fig, axes


def plain(v: float, _pos=None) -> str:
    """A tick value as a plain number: ``2,000``, ``400``, ``2.5``, ``0.05``."""
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else ""
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def plain_numbers(axis) -> None:
    """Plain-number tick labels on a linear ``axis`` (no offset, no ``1e4`` factor)."""
    axis.set_major_formatter(FuncFormatter(plain))


_SUBS = ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 5), (1, 3), (1,))


def log_ticks(lo: float, hi: float, max_ticks: int = 6) -> list[float]:
    """Tick values for a log axis over [``lo``, ``hi``] (> 0): the densest of the 1-9, 1-2-5,
    1-3 and 1 multiples of each decade with at most ``max_ticks`` values in the range and at
    least two; when a sparser set would have fewer than two, every k-th of the densest."""
    def ticks(subs) -> list[float]:
        e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        return [v for e in range(e0, e1 + 1) for s in subs
                if lo <= (v := float(f"{s}e{e}")) <= hi]
    for subs in _SUBS:
        t = ticks(subs)
        if len(t) <= max_ticks:
            if len(t) >= 2:
                return t
            break
    dense = ticks(_SUBS[0])
    if len(dense) < 2:
        return sorted({float(f"{lo:.2g}"), float(f"{hi:.2g}")})
    return dense[::math.ceil(len(dense) / max_ticks)]


def log_axis(ax, which: str, lo: float, hi: float, max_ticks: int = 6) -> None:
    """Make the ``which`` (``"x"`` / ``"y"``) axis of ``ax`` logarithmic for data in [``lo``,
    ``hi``] (> 0), numbered at :func:`log_ticks` with plain numbers; unnumbered minor ticks
    at every integer multiple of a decade."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(FixedLocator(log_ticks(lo, hi, max_ticks)))
    axis.set_major_formatter(FuncFormatter(plain))
    axis.set_minor_locator(LogLocator(base=10, subs=_SUBS[0], numticks=30))
    axis.set_minor_formatter(NullFormatter())


def outside_legend(fig: Figure, axes_list, *, loc: str = "outside right upper",
                   extra: list | None = None) -> None:
    """One legend for ``fig`` outside its axes, from the labelled artists of ``axes_list``
    (each label once, in first-seen order) and ``extra`` handles; none without labels."""
    seen: dict[str, object] = {}
    for ax in axes_list:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    for h in extra or []:
        seen.setdefault(h.get_label(), h)
    if seen:
        ncol = 1 if "right" in loc or "left" in loc else min(4, len(seen))
        fig.legend(list(seen.values()), list(seen), loc=loc, fontsize=7, ncol=ncol)


def place_labels(ax, points: list[tuple[float, float, str]]) -> list[str]:
    """Annotate ``(x, y, text)`` points of ``ax`` without overlaps (see the module
    docstring). Lays the figure out first and then freezes the layout, so the positions
    measured are the ones saved. Returns the texts left out."""
    fig = ax.figure
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    placed, left_out = [], []
    for x, y, text in points:
        for dx, dy, ha, va in _OFFSETS:
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy),
                              ha=ha, va=va, fontsize=7)
            box = ann.get_window_extent(renderer)
            fits = (box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0
                    and box.y1 <= inside.y1)
            if fits and not any(box.overlaps(b) for b in placed):
                placed.append(box)
                break
            ann.remove()
        else:
            left_out.append(text)
    return left_out


def count_axis(ax) -> None:
    """A panel of counts (requests, preemptions, transfers): integer ticks from 0 (up to 1 when
    every count is 0), a sliver below 0 so a line at 0 is not hidden by the frame."""
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    top = max(1.0, ax.get_ylim()[1])
    ax.set_ylim(-0.02 * top, top)


def finish_time_axes(fig: Figure, axes) -> None:
    """Plain numbers and a time label on every panel of a shared-x time figure; the legend
    outside, on the right."""
    for ax in axes:
        plain_numbers(ax.yaxis)
        plain_numbers(ax.xaxis)
        ax.set_xlabel("simulated time (s)")
        ax.tick_params(labelbottom=True)
    outside_legend(fig, axes)
