"""The figures of ``blis-simpy report`` (matplotlib, Agg; docs/planning.md, "Reports").

Each ``*_figure`` function takes recognised inputs (:mod:`blis_simpy.report.inputs`) and
returns a :class:`matplotlib.figure.Figure`, or None when its data is absent; tests inspect
the figures (:func:`has_data`) before they are saved. :func:`build_figures` makes every
figure the inputs allow, :func:`save_png` writes one. Figures are deterministic: a fixed
size and style (:mod:`blis_simpy.report.style`), and no date or software version in the PNG.

* ``latency_cdf`` — TTFT, ITL and E2E CDFs (ms, log axis with plain numbers), one line per
  results input, each run's SLO threshold of the metric as a dashed vertical line;
* ``timeline_<input>`` — per-instance running, waiting, KV blocks in use (% of the
  instance's blocks), cumulative preemptions and engine steps per second over simulated time;
* ``autoscaling_<input>`` — a run with an autoscaler (its timeline has the ``state`` column):
  instances serving, loading and draining, and the requests waiting (queue depth) and running
  over all instances, over simulated time (:mod:`blis_simpy.report.autoscale_figure`);
* ``pd_transfers_<input>`` — KV transfers in flight, running requests per pool, and engine
  steps per second per instance (PD runs): a prefill instance's requests leave ``running``
  when their only step begins, so its activity shows in its steps;
* ``latency_vs_rate_<input>``, ``slo_heatmap_<input>`` — a sweep's
  (:mod:`blis_simpy.report.sweep_figures`);
* ``pareto_<input>`` — a plan's deployments, cost (or GPUs) against p99 TTFT (log axis) or
  goodput, those meeting the SLOs filled, those missing them as red crosses, the Pareto
  front of the passing ones drawn and labelled, the winner starred, the plan's TTFT SLO
  drawn.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import matplotlib
from matplotlib.figure import Figure

from blis_simpy.atomic import Batch, atomic_write
from blis_simpy.metrics.timeline_file import GATEWAY_COLUMN
from blis_simpy.report.autoscale_figure import autoscale_figure
from blis_simpy.report.inputs import Input
from blis_simpy.report.knee import DEFAULT_FACTOR
from blis_simpy.report.style import (
    DPI,
    FIGSIZE,
    STYLE,
    log_axis,
    new_figure,
    outside_legend,
    place_labels,
    plain_numbers,
)
from blis_simpy.report.style import count_axis as _count_axis
from blis_simpy.report.style import finish_time_axes as _finish_time_axes
from blis_simpy.report.sweep_figures import TARGET_PCT, heatmap_figure, latency_rate_figure, num

__all__ = ["DPI", "FIGSIZE", "FigureSpec", "autoscale_figure", "build_figures", "cdf_figure", "has_data",
           "heatmap_figure", "latency_rate_figure", "pareto_figure", "save_png",
           "gateway_figure", "timeline_figure", "transfer_figure"]

MAX_LINES = 12           # lines of one axes (instances): the rest are left out


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
    """TTFT / ITL / E2E CDFs (ms, log x), one line per results input, the inputs' SLO
    thresholds as dashed vertical lines; a metric no input has gets no panel."""
    import numpy as np
    metrics = [(k, t) for k, t in (("ttft", "TTFT"), ("itl", "ITL (mean per request)"),
                                   ("e2e", "E2E")) if any(r.latency_ms.get(k) for r in results)]
    if not metrics:
        return None
    fig, axes = new_figure(1, len(metrics))
    for ax, (key, title) in zip(axes[0], metrics, strict=True):
        seen: list[float] = []
        for r in results:
            v = np.sort(np.asarray(r.latency_ms.get(key) or [], dtype=float))
            if v.size == 0:
                continue
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=r.label)
            seen += [float(v[0]), float(v[-1])]
        for thr in sorted({r.slo_ms[key] for r in results if key in r.slo_ms}):
            ax.axvline(thr, color="tab:red", linestyle="--", linewidth=1, label="SLO threshold")
            seen.append(thr)
        log_axis(ax, "x", min(seen), max(seen), max_ticks=5 if len(metrics) > 1 else 8)
        ax.set_title(title)
        ax.set_xlabel(f"{key.upper()} (ms)")
        ax.set_ylabel("fraction of completed requests")
        ax.set_ylim(0, 1.02)
    if len(results) > 1 or any(r.slo_ms for r in results):
        outside_legend(fig, axes[0], loc="outside lower center")
    return fig


# ---------------------------------------------------------------------------- timelines
_TL = ("t_us", "running", "waiting", "kv_blocks_used", "kv_blocks_total", "preemptions", "steps")


def _timeline_columns(tl: Input):
    names = ("instance", "role", "kv_transfers_in_flight") + _TL
    cols = {c: tl.table.column(c).to_pylist() for c in names if c in tl.table.column_names}
    by_inst: dict[str, dict[str, list]] = {}
    for i, inst in enumerate(cols["instance"]):
        d = by_inst.setdefault(inst, defaultdict(list))
        for c in _TL:
            if c in cols:
                d[c].append(cols[c][i])
        d["role"] = cols["role"][i]
    return cols, by_inst


def _inst_order(name: str):
    m = re.search(r"(\d+)$", name)
    return (0, int(m.group(1)), name) if m else (1, 0, name)


def _steps_per_s(t_us: list[int], steps: list[int]) -> tuple[list[float], list[float]]:
    """Engine steps per second over windows of consecutive samples (one sample, or more to
    make at most about 100 windows), at each window's start (s)."""
    w = max(1, (len(t_us) - 1) // 100)
    ts, rates = [], []
    for k in range(0, len(t_us) - w, w):
        dt = t_us[k + w] - t_us[k]
        if dt > 0:
            ts.append(t_us[k] / 1e6)
            rates.append((steps[k + w] - steps[k]) * 1e6 / dt)
    return ts, rates


STEPS_LABEL = "engine steps / s"


def timeline_figure(tl: Input) -> Figure | None:
    """Per-instance running, waiting, KV use (%), preemptions and (when the file has the
    ``steps`` column) engine steps per second against simulated seconds."""
    if tl.table is None or tl.table.num_rows == 0:
        return None
    _, by_inst = _timeline_columns(tl)
    names = sorted(by_inst, key=_inst_order)[:MAX_LINES]
    steps = "steps" in tl.table.column_names
    panels = [("running", "running"), ("waiting", "waiting"), ("kv", "KV blocks used (%)"),
              ("preemptions", "preemptions (cumulative)")] + ([("steps", "")] if steps else [])
    fig, axes = new_figure(len(panels), 1, height=2.0 * len(panels) + 1.0, sharex=True)
    for ax, (key, label) in zip(axes[:, 0], panels, strict=True):
        if key == "steps":
            for name in names:
                d = by_inst[name]
                role = f" ({d['role']})" if d["role"] else ""
                ax.step(*_steps_per_s(d["t_us"], d["steps"]), where="post",
                        label=f"{name}{role}", linewidth=1)
            ax.set_ylabel(STEPS_LABEL)
            continue
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
        if key != "kv":
            _count_axis(ax)
    _finish_time_axes(fig, axes[:, 0])
    return fig


def transfer_figure(tl: Input) -> Figure | None:
    """PD runs: KV transfers in flight, running requests summed per pool and (when the file
    has the ``steps`` column) engine steps per second per instance, over time."""
    if tl.table is None or tl.table.num_rows == 0:
        return None
    cols, by_inst = _timeline_columns(tl)
    if all(v is None for v in cols["kv_transfers_in_flight"]):
        return None
    transfers: dict[int, int] = {}
    pools: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    steps = "steps" in cols
    for i, (t, role, run) in enumerate(zip(cols["t_us"], cols["role"], cols["running"],
                                           strict=True)):
        transfers[t] = cols["kv_transfers_in_flight"][i] or 0
        acc = pools[role or "instances"][t]
        acc[0] += run
        acc[1] += cols["steps"][i] if steps else 0
    fig, axes = new_figure(3 if steps else 2, 1, height=8.0 if steps else 6.0, sharex=True)
    ts = sorted(transfers)
    axes[0][0].step([t / 1e6 for t in ts], [transfers[t] for t in ts], where="post",
                    color="tab:purple", label="KV transfers in flight")
    axes[0][0].set_ylabel("KV transfers in flight")
    _count_axis(axes[0][0])
    for k, role in enumerate(sorted(pools)):
        pts = sorted(pools[role].items())
        size = sum(1 for d in by_inst.values() if (d["role"] or "instances") == role)
        colour = f"C{k}"
        axes[1][0].step([t / 1e6 for t, _ in pts], [v[0] for _, v in pts], where="post",
                        label=f"{role} pool ({size})", color=colour)
        if steps:       # the pool's mean per instance
            xs, rates = _steps_per_s([t for t, _ in pts], [v[1] for _, v in pts])
            axes[2][0].step(xs, [r / size for r in rates], where="post", color=colour,
                            label=f"{role} pool ({size})")
    axes[1][0].set_ylabel("running requests")
    _count_axis(axes[1][0])
    if steps:
        axes[2][0].set_ylabel(f"{STEPS_LABEL}\n(mean per instance)")
    _finish_time_axes(fig, axes[:, 0])
    return fig


def gateway_figure(tl: Input) -> Figure | None:
    """Runs with a gateway queue (the timeline's ``gateway_queue_depth`` column): the requests
    waiting in the gateway and, summed over the instances, running and waiting, over time.
    None without the column."""
    if tl.table is None or tl.table.num_rows == 0 or GATEWAY_COLUMN not in tl.table.column_names:
        return None
    t_us = tl.table.column("t_us").to_pylist()
    depth = tl.table.column(GATEWAY_COLUMN).to_pylist()
    running = tl.table.column("running").to_pylist()
    waiting = tl.table.column("waiting").to_pylist()
    gw: dict[int, int] = {}
    run: dict[int, int] = defaultdict(int)
    wait: dict[int, int] = defaultdict(int)
    for t, d, r, w in zip(t_us, depth, running, waiting, strict=True):
        gw[t] = d
        run[t] += r
        wait[t] += w
    ts = sorted(gw)
    xs = [t / 1e6 for t in ts]
    fig, axes = new_figure(2, 1, height=5.0, sharex=True)
    axes[0][0].step(xs, [gw[t] for t in ts], where="post", color="tab:purple",
                    label="gateway queue depth")
    axes[0][0].set_ylabel("gateway queue depth")
    _count_axis(axes[0][0])
    axes[1][0].step(xs, [run[t] for t in ts], where="post", label="running (all instances)")
    axes[1][0].step(xs, [wait[t] for t in ts], where="post", label="waiting (all instances)")
    axes[1][0].set_ylabel("requests")
    _count_axis(axes[1][0])
    _finish_time_axes(fig, axes[:, 0])
    return fig


#: the figures of a timeline, in page order: ``(figure function, file stem, title, caption)``
_TIMELINE_FIGURES = (
    (timeline_figure, "timeline", "Per-instance timeline", "Sampled at a fixed simulated interval."),
    (autoscale_figure, "autoscaling", "Autoscaling",
     "Instances serving, loading (weights) and draining, and the requests waiting and running "
     "over all instances, at each timeline sample."),
    (transfer_figure, "pd_transfers", "PD KV transfers",
     "A prefill instance's requests leave running when their only step begins, so its "
     "activity shows in its engine steps per second."),
    (gateway_figure, "gateway", "Gateway queue",
     "Requests waiting in the gateway queue, and in and on the instances."),
)


# ---------------------------------------------------------------------------- plans
def _plan_marks(plan: Input) -> tuple[str | None, float | None]:
    """The winner's label and the TTFT p99 SLO (ms) of a ``plan --out`` document."""
    def d(x) -> dict:
        return x if isinstance(x, dict) else {}
    label = d(d(d(plan.doc.get("cheapest")).get("winner")).get("deployment")).get("label")
    thr = num(d(d(plan.doc.get("plan")).get("slo")).get("ttft_p99_ms"))
    return label, thr if thr and thr > 0 else None


def pareto_figure(plan: Input) -> Figure | None:
    """Cost per hour (or GPUs) against p99 TTFT (or goodput): every deployment, those
    meeting the SLOs filled, those missing them as red crosses, the Pareto front of the
    passing ones drawn and labelled (labels never overlap), the winner starred, the plan's
    TTFT SLO dashed. The latency axis is logarithmic: failing deployments are often orders
    of magnitude slower than passing ones."""
    deps = plan.deployments
    use_cost = deps and all(num(d.get("cost_per_hour_usd")) is not None for d in deps)
    xkey, xlabel = ("cost_per_hour_usd", "cost (USD/hour)") if use_cost else ("gpus", "GPUs")
    lat = any(num(d.get("ttft_p99_ms")) is not None for d in deps)
    ykey, ylabel = ("ttft_p99_ms", "p99 TTFT (ms)") if lat else ("goodput_rps", "goodput (req/s)")
    pts = [(num(d.get(xkey)), num(d.get(ykey)), d) for d in deps]
    pts = [p for p in pts if p[0] is not None and p[1] is not None and (p[1] > 0 or not lat)]
    if not pts:
        return None
    fig, axes = new_figure()
    ax = axes[0][0]
    ok = [p for p in pts if p[2].get("meets_slo", True)]
    bad = [p for p in pts if not p[2].get("meets_slo", True)]
    winner, slo = _plan_marks(plan)
    if bad:
        ax.scatter([p[0] for p in bad], [p[1] for p in bad], marker="x", color="tab:red",
                   label="misses the SLOs")
    front = []
    if ok:
        ax.scatter([p[0] for p in ok], [p[1] for p in ok], color="tab:blue", label="meets the SLOs")
        best, sign = float("inf"), 1.0 if lat else -1.0
        for x, y, d in sorted(ok, key=lambda p: (p[0], sign * p[1])):
            if sign * y < best:
                front.append((x, y, d))
                best = sign * y
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="tab:blue",
                label="Pareto front")
        won = [p for p in ok if winner is not None and p[2].get("label") == winner]
        if won:
            ax.scatter([won[0][0]], [won[0][1]], marker="*", s=180, color="gold",
                       edgecolors="black", zorder=3, label=f"winner: {winner}")
    ys = [p[1] for p in pts]
    if lat and slo is not None and ykey == "ttft_p99_ms":
        ax.axhline(slo, color="tab:red", linestyle="--", linewidth=1,
                   label=f"SLO: p99 TTFT {slo:g} ms")
        ys.append(slo)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    plain_numbers(ax.xaxis)
    if lat:
        log_axis(ax, "y", min(ys), max(ys))
        ax.margins(y=0.15)
    else:
        plain_numbers(ax.yaxis)
    outside_legend(fig, [ax])
    place_labels(ax, [(x, y, str(d.get("label", ""))) for x, y, d in front])
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
                                    "Completed requests only; log scale; dashed: the "
                                    "runs' SLO thresholds."))
    for inp in inputs:
        tag = _slug(inp.label)
        if inp.kind == "timeline":
            for make, stem, title, caption in _TIMELINE_FIGURES:
                fig = make(inp)
                if fig is not None:
                    specs.append(FigureSpec(f"{stem}_{tag}", f"{title}: {inp.label}", fig,
                                            [inp.path], caption))
        elif inp.kind == "sweep":
            made = latency_rate_figure(inp, factor)
            if made is not None:
                specs.append(FigureSpec(
                    f"latency_vs_rate_{tag}", f"Latency vs rate: {inp.label}", made[0], [inp.path],
                    f"Mean over seeds; band: lowest to highest seed; dashed: the SLO "
                    f"threshold. Knee: the lowest swept rate whose latency is more than "
                    f"{factor:g}x the latency at the lowest rate.", made[1]))
            made = heatmap_figure(inp, factor)
            if made is not None:
                specs.append(FigureSpec(
                    f"slo_heatmap_{tag}", f"SLO attainment: {inp.label}", made[0], [inp.path],
                    f"Mean of {made[1]} per cell (and completed req/s); colours centred on "
                    f"{TARGET_PCT:g} %: green above, red below. Hatched: saturated, at or past "
                    "the knee of a p99 latency line.", made[2]))
        elif inp.kind == "plan":
            fig = pareto_figure(inp)
            if fig is not None:
                specs.append(FigureSpec(
                    f"pareto_{tag}", f"Pareto front: {inp.label}", fig, [inp.path],
                    "Log latency axis; crosses miss the SLOs; labels on the Pareto front of "
                    "the deployments meeting them."))
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
            matplotlib.rc_context(STYLE):
        fig.savefig(f, format="png", dpi=DPI, metadata={"Software": None})
