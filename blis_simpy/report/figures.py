"""The figures of ``blis-simpy report`` (matplotlib, Agg; docs/planning.md, "Reports").

Each ``*_figure`` function takes recognised inputs (:mod:`blis_simpy.report.inputs`) and
returns a :class:`matplotlib.figure.Figure`, or None when its data is absent; tests inspect
the figures (:func:`has_data`) before they are saved. :func:`build_figures` makes every
figure the inputs allow, :func:`save_png` writes one. Figures are deterministic: a fixed
size (:data:`FIGSIZE` inches at :data:`DPI`), a fixed style, and no date or software version
in the PNG.

* ``latency_cdf`` — TTFT, ITL and E2E CDFs, one line per results input;
* ``timeline_<input>`` — per-instance running, waiting, KV blocks in use (% of the
  instance's blocks) and cumulative preemptions over simulated time;
* ``pd_transfers_<input>`` — KV transfers in flight, and running requests per pool (PD runs);
* ``latency_vs_rate_<input>`` — p99 TTFT/E2E/ITL against the swept rate, one line per
  combination of the other axes, the knee marked (:mod:`blis_simpy.report.knee`);
* ``slo_heatmap_<input>`` — SLO attainment over two axes of a sweep (mean over the rest);
* ``pareto_<input>`` — a plan's deployments, cost (or GPUs) against p99 TTFT (or goodput),
  the Pareto front of those meeting the SLOs drawn through them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from blis_simpy.atomic import Batch, atomic_write  # noqa: E402
from blis_simpy.report.inputs import Input  # noqa: E402
from blis_simpy.report.knee import DEFAULT_FACTOR, knee  # noqa: E402

__all__ = ["DPI", "FIGSIZE", "FigureSpec", "build_figures", "cdf_figure", "has_data",
           "heatmap_figure", "latency_rate_figure", "pareto_figure", "save_png",
           "timeline_figure", "transfer_figure"]

FIGSIZE = (9.0, 5.0)
DPI = 100
MAX_LINES = 12           # lines of one axes (instances, sweep groups): the rest are left out
_STYLE = {"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": DPI,
          "savefig.dpi": DPI, "path.simplify": True}
_NON_AXIS = {"config_hash", "config_key", "seed", "command", "status", "error", "wall_s", "config"}
_METRIC_PREFIXES = ("m.", "slo.", "deployment.")
_LATENCY_COLUMNS = (("m.ttft_p99_ms", "p99 TTFT (ms)"), ("m.e2e_p99_ms", "p99 E2E (ms)"),
                    ("m.itl_p99_ms", "p99 ITL (ms)"))


@dataclass
class FigureSpec:
    """A figure to save: ``name`` (file stem), ``title``, ``caption`` (text under it) and the
    input paths it was made from."""

    name: str
    title: str
    fig: Figure
    sources: list[str]
    caption: str = ""
    notes: list[str] = field(default_factory=list)


def _figure(rows: int = 1, cols: int = 1, *, height: float | None = None, sharex: bool = False):
    with plt.rc_context(_STYLE):
        fig = Figure(figsize=(FIGSIZE[0], height or FIGSIZE[1]), dpi=DPI)
        axes = fig.subplots(rows, cols, squeeze=False, sharex=sharex)
    return fig, axes


def has_data(fig: Figure) -> bool:
    """Every axes of ``fig`` shows data: a line with points, a non-empty collection or an
    image."""
    axes = fig.get_axes()
    if not axes:
        return False
    for ax in axes:
        if getattr(ax, "_colorbar", None) is not None or ax.get_label() == "<colorbar>":
            continue
        lines = any(len(ln.get_xdata()) > 0 for ln in ax.get_lines())
        colls = any(len(c.get_offsets()) > 0 or len(c.get_paths()) > 0 for c in ax.collections)
        if not (lines or colls or ax.images):
            return False
    return True


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "input"


# ---------------------------------------------------------------------------- results
def cdf_figure(results: list[Input]) -> Figure | None:
    """TTFT / ITL / E2E CDFs (ms, log x), one line per results input; a metric no input has
    gets no panel."""
    import numpy as np
    metrics = [(k, t) for k, t in (("ttft", "TTFT"), ("itl", "ITL (mean per request)"),
                                   ("e2e", "E2E")) if any(r.latency_ms.get(k) for r in results)]
    if not metrics:
        return None
    fig, axes = _figure(1, len(metrics))
    for ax, (key, title) in zip(axes[0], metrics, strict=True):
        for r in results:
            v = np.sort(np.asarray(r.latency_ms.get(key) or [], dtype=float))
            if v.size == 0:
                continue
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=r.label)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())   # minor labels overlap on short ranges
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("fraction of completed requests")
    if len(results) > 1:
        axes[0][-1].legend(loc="lower right", fontsize=7)
    return fig


# ---------------------------------------------------------------------------- timelines
def _timeline_columns(tl: Input):
    cols = {c: tl.table.column(c).to_pylist() for c in
            ("t_us", "instance", "role", "running", "waiting", "kv_blocks_used",
             "kv_blocks_total", "preemptions", "kv_transfers_in_flight")}
    by_inst: dict[str, dict[str, list]] = {}
    for i, inst in enumerate(cols["instance"]):
        d = by_inst.setdefault(inst, defaultdict(list))
        for c in ("t_us", "running", "waiting", "kv_blocks_used", "kv_blocks_total", "preemptions"):
            d[c].append(cols[c][i])
        d["role"] = cols["role"][i]
    return cols, by_inst


def _inst_order(name: str):
    m = re.search(r"(\d+)$", name)
    return (0, int(m.group(1)), name) if m else (1, 0, name)


def timeline_figure(tl: Input) -> Figure | None:
    """Per-instance running, waiting, KV use (%) and preemptions against simulated seconds."""
    if tl.table is None or tl.table.num_rows == 0:
        return None
    _, by_inst = _timeline_columns(tl)
    names = sorted(by_inst, key=_inst_order)[:MAX_LINES]
    fig, axes = _figure(4, 1, height=8.0, sharex=True)
    panels = (("running", "running"), ("waiting", "waiting"), ("kv", "KV blocks used (%)"),
              ("preemptions", "preemptions (cumulative)"))
    for ax, (key, label) in zip(axes[:, 0], panels, strict=True):
        for name in names:
            d = by_inst[name]
            t = [x / 1e6 for x in d["t_us"]]
            if key == "kv":
                y = [100.0 * u / tot if tot else 0.0
                     for u, tot in zip(d["kv_blocks_used"], d["kv_blocks_total"], strict=True)]
            else:
                y = d[key]
            role = f" ({d['role']})" if d["role"] else ""
            ax.step(t, y, where="post", label=f"{name}{role}", linewidth=1)
        ax.set_ylabel(label)
    axes[-1][0].set_xlabel("simulated time (s)")
    if len(names) <= 8:
        axes[0][0].legend(loc="upper right", fontsize=7, ncol=2)
    return fig


def transfer_figure(tl: Input) -> Figure | None:
    """PD runs: KV transfers in flight, and running requests summed per pool, over time."""
    if tl.table is None or tl.table.num_rows == 0:
        return None
    cols, _ = _timeline_columns(tl)
    if all(v is None for v in cols["kv_transfers_in_flight"]):
        return None
    transfers: dict[int, int] = {}
    pools: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for t, role, run, tr in zip(cols["t_us"], cols["role"], cols["running"],
                                cols["kv_transfers_in_flight"], strict=True):
        transfers[t] = tr or 0
        pools[role or "instances"][t] += run
    fig, axes = _figure(2, 1, height=6.0, sharex=True)
    ts = sorted(transfers)
    axes[0][0].step([t / 1e6 for t in ts], [transfers[t] for t in ts], where="post",
                    color="tab:purple")
    axes[0][0].set_ylabel("KV transfers in flight")
    for role in sorted(pools):
        pts = sorted(pools[role].items())
        axes[1][0].step([t / 1e6 for t, _ in pts], [v for _, v in pts], where="post",
                        label=f"{role} pool")
    axes[1][0].set_ylabel("running requests")
    axes[1][0].set_xlabel("simulated time (s)")
    axes[1][0].legend(loc="upper right", fontsize=7)
    return fig


# ---------------------------------------------------------------------------- sweeps
def _axes_of(table) -> list[str]:
    return [n for n in table.column_names
            if n not in _NON_AXIS and not n.startswith(_METRIC_PREFIXES)]


def _num(v) -> float | None:
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
        if name in axes and all(_num(v) is not None for v in table.column(name).to_pylist()):
            return name
    return None


def _means(table, keys: list[str], value: str) -> dict[tuple, float]:
    """Mean of ``value`` per combination of ``keys`` (seeds and other axes averaged)."""
    acc: dict[tuple, list[float]] = defaultdict(list)
    cols = [table.column(k).to_pylist() for k in keys]
    vals = table.column(value).to_pylist()
    for i, v in enumerate(vals):
        f = _num(v)
        if f is not None:
            acc[tuple(c[i] for c in cols)].append(f)
    return {k: sum(v) / len(v) for k, v in acc.items()}


def _sort_key(v):
    f = _num(v)
    return (0, f, "") if f is not None else (1, 0.0, str(v))


def latency_rate_figure(sweep: Input, factor: float = DEFAULT_FACTOR
                        ) -> tuple[Figure, list[str]] | None:
    """p99 latencies against the rate axis, the knee of each line marked; also the knee
    notes (one line each). None without a numeric rate axis or a p99 latency column."""
    t = sweep.table
    rate = _rate_axis(t) if t is not None and t.num_rows else None
    metrics = [(c, lab) for c, lab in _LATENCY_COLUMNS if rate and c in t.column_names]
    if not metrics:
        return None
    others = [a for a in _axes_of(t) if a != rate and len(set(map(str, t.column(a).to_pylist()))) > 1]
    fig, axes = _figure(1, len(metrics))
    notes: list[str] = []
    for ax, (col, label) in zip(axes[0], metrics, strict=True):
        means = _means(t, others + [rate], col)
        groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        for key, y in means.items():
            groups[key[:-1]].append((float(key[-1]), y))
        for g in sorted(groups, key=lambda k: tuple(map(_sort_key, k)))[:MAX_LINES]:
            pts = sorted(groups[g])
            name = ", ".join(f"{a}={v}" for a, v in zip(others, g, strict=True)) or "sweep"
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=name)
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
        ax.set_xlabel(rate)
        ax.set_ylabel(label)
        ax.set_yscale("log")
    if len(axes[0]) and others:
        axes[0][-1].legend(loc="upper left", fontsize=7)
    return fig, notes


def _attainment_column(names: list[str]) -> str | None:
    if "slo.attainment_pct.all" in names:
        return "slo.attainment_pct.all"
    for prefix in ("slo.attainment_pct", "slo."):
        found = sorted(n for n in names if n.startswith(prefix))
        if found:
            return found[0]
    return None


def heatmap_figure(sweep: Input) -> tuple[Figure, str] | None:
    """The SLO attainment column (mean) over the first two axes with at least two values;
    also the column shown. None without such axes or column."""
    t = sweep.table
    if t is None or not t.num_rows:
        return None
    value = _attainment_column(t.column_names)
    axes_ = [a for a in _axes_of(t) if len(set(map(str, t.column(a).to_pylist()))) > 1]
    if value is None or len(axes_) < 2:
        return None
    x, y = axes_[0], axes_[1]
    means = _means(t, [x, y], value)
    if not means:
        return None
    xs = sorted({k[0] for k in means}, key=_sort_key)
    ys = sorted({k[1] for k in means}, key=_sort_key)
    grid = [[means.get((xv, yv), math.nan) for xv in xs] for yv in ys]
    fig, axes = _figure()
    ax = axes[0][0]
    im = ax.imshow(grid, origin="lower", aspect="auto", cmap="RdYlGn", vmin=0,
                   vmax=100 if "pct" in value else None)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=45, ha="right")
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.grid(False)
    fig.colorbar(im, ax=ax, label=value)
    return fig, value


# ---------------------------------------------------------------------------- plans
def pareto_figure(plan: Input) -> Figure | None:
    """Cost per hour (or GPUs) against p99 TTFT (or goodput): every deployment, those
    meeting the SLOs filled, the Pareto front of those drawn through them."""
    deps = plan.deployments
    use_cost = deps and all(_num(d.get("cost_per_hour_usd")) is not None for d in deps)
    xkey, xlabel = ("cost_per_hour_usd", "cost (USD/hour)") if use_cost else ("gpus", "GPUs")
    lat = any(_num(d.get("ttft_p99_ms")) is not None for d in deps)
    ykey, ylabel = ("ttft_p99_ms", "p99 TTFT (ms)") if lat else ("goodput_rps", "goodput (req/s)")
    pts = [(_num(d.get(xkey)), _num(d.get(ykey)), d) for d in deps]
    pts = [p for p in pts if p[0] is not None and p[1] is not None]
    if not pts:
        return None
    fig, axes = _figure()
    ax = axes[0][0]
    ok = [p for p in pts if p[2].get("meets_slo", True)]
    bad = [p for p in pts if not p[2].get("meets_slo", True)]
    if bad:
        ax.scatter([p[0] for p in bad], [p[1] for p in bad], facecolors="none",
                   edgecolors="tab:gray", label="misses the SLOs")
    if ok:
        ax.scatter([p[0] for p in ok], [p[1] for p in ok], color="tab:blue", label="meets the SLOs")
        front, best = [], math.inf
        sign = 1.0 if lat else -1.0
        for x, y, d in sorted(ok, key=lambda p: (p[0], sign * p[1])):
            if sign * y < best:
                front.append((x, y, d))
                best = sign * y
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="tab:red",
                label="Pareto front")
        for x, y, d in front:
            ax.annotate(str(d.get("label", "")), (x, y), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(loc="best", fontsize=7)
    return fig


# ---------------------------------------------------------------------------- all of them
def build_figures(inputs: list[Input], factor: float = DEFAULT_FACTOR) -> list[FigureSpec]:
    """Every figure the inputs allow, in page order; names are unique file stems."""
    specs: list[FigureSpec] = []
    results = [i for i in inputs if i.kind == "results"]
    if results:
        fig = cdf_figure(results)
        if fig is not None:
            specs.append(FigureSpec("latency_cdf", "Latency CDFs (TTFT, ITL, E2E)", fig,
                                    [r.path for r in results],
                                    "Completed requests only; log scale."))
    for inp in inputs:
        tag = _slug(inp.label)
        if inp.kind == "timeline":
            fig = timeline_figure(inp)
            if fig is not None:
                specs.append(FigureSpec(f"timeline_{tag}", f"Per-instance timeline: {inp.label}",
                                        fig, [inp.path], "Sampled at a fixed simulated interval."))
            fig = transfer_figure(inp)
            if fig is not None:
                specs.append(FigureSpec(f"pd_transfers_{tag}", f"PD KV transfers: {inp.label}",
                                        fig, [inp.path]))
        elif inp.kind == "sweep":
            made = latency_rate_figure(inp, factor)
            if made is not None:
                specs.append(FigureSpec(
                    f"latency_vs_rate_{tag}", f"Latency vs rate: {inp.label}", made[0], [inp.path],
                    f"Knee: the lowest swept rate whose latency is more than {factor:g}x the "
                    "latency at the lowest rate.", made[1]))
            made = heatmap_figure(inp)
            if made is not None:
                specs.append(FigureSpec(f"slo_heatmap_{tag}", f"SLO attainment: {inp.label}",
                                        made[0], [inp.path], f"Mean of {made[1]} per cell."))
        elif inp.kind == "plan":
            fig = pareto_figure(inp)
            if fig is not None:
                specs.append(FigureSpec(f"pareto_{tag}", f"Pareto front: {inp.label}", fig,
                                        [inp.path]))
    seen: dict[str, int] = {}
    for s in specs:
        n = seen.get(s.name, 0)
        seen[s.name] = n + 1
        if n:
            s.name = f"{s.name}_{n + 1}"
    return [s for s in specs if has_data(s.fig)]


def save_png(fig: Figure, path: str, *, batch: Batch | None = None) -> None:
    """Write ``fig`` as a PNG (no software/date metadata), all-or-nothing; with ``batch``,
    staged to commit with the batch's other outputs (:mod:`blis_simpy.atomic`)."""
    with atomic_write(path, batch=batch, field="--out", what="cannot write the report") as f, \
            plt.rc_context(_STYLE):
        fig.savefig(f, format="png", dpi=DPI, metadata={"Software": None})
