"""The autoscaling figure of ``blis-simpy report`` (docs/planning.md, "Reports"): from a
timeline with the ``state`` column (a run with an autoscaler, docs/control-plane.md,
"Autoscaling"), the instance count over time — serving, loading and draining — and the
queue depth over time (waiting requests summed over the instances, and running ones). With
prefill/decode pools (the ``role`` column) the serving instances of each pool are drawn too,
and the queue depth of each pool."""

from __future__ import annotations

from collections import Counter, defaultdict

from matplotlib.figure import Figure

from blis_simpy.metrics.timeline_file import STATE
from blis_simpy.report.inputs import Input
from blis_simpy.report.style import count_axis, finish_time_axes, new_figure

__all__ = ["POOL_ROLES", "SCALED_STATES", "autoscale_figure", "autoscale_series", "pool_series"]

#: the pools drawn apart when the timeline has them
POOL_ROLES = ("prefill", "decode")

#: the states drawn, in order (``off`` instances are not counted)
SCALED_STATES = ("serving", "loading", "draining")


def autoscale_series(tl: Input) -> tuple[list[int], dict[str, list[int]], list[int], list[int]]:
    """``(sample times µs, {state: instances per sample}, waiting per sample, running per
    sample)`` of a timeline with the ``state`` column."""
    t = tl.table
    times = t.column("t_us").to_pylist()
    states = t.column(STATE).to_pylist()
    waiting = t.column("waiting").to_pylist()
    running = t.column("running").to_pylist()
    counts: dict[int, Counter] = defaultdict(Counter)
    queue: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for ts, st, w, r in zip(times, states, waiting, running, strict=True):
        counts[ts][st] += 1
        queue[ts][0] += w
        queue[ts][1] += r
    order = sorted(counts)
    return (order, {s: [counts[ts][s] for ts in order] for s in SCALED_STATES},
            [queue[ts][0] for ts in order], [queue[ts][1] for ts in order])


def pool_series(tl: Input, times: list[int]) -> dict[str, tuple[list[int], list[int]]]:
    """``{pool: (serving instances per sample, waiting per sample)}`` at ``times`` (the
    samples of :func:`autoscale_series`) for the prefill/decode pools of the timeline's
    ``role`` column; empty without pools."""
    t = tl.table
    if "role" not in t.column_names:
        return {}
    roles = t.column("role").to_pylist()
    present = [r for r in POOL_ROLES if r in set(roles)]
    if not present:
        return {}
    serving: dict[tuple[int, str], int] = Counter()
    waiting: dict[tuple[int, str], int] = Counter()
    for ts, role, st, w in zip(t.column("t_us").to_pylist(), roles, t.column(STATE).to_pylist(),
                               t.column("waiting").to_pylist(), strict=True):
        serving[ts, role] += st == "serving"
        waiting[ts, role] += w
    return {r: ([serving[ts, r] for ts in times], [waiting[ts, r] for ts in times]) for r in present}


def autoscale_figure(tl: Input) -> Figure | None:
    """Instance count (serving, loading, draining) and queue depth against simulated
    seconds; None when the timeline has no ``state`` column or no row. Engine ranks
    (``dp > 1``) count one each."""
    if tl.table is None or tl.table.num_rows == 0 or STATE not in tl.table.column_names:
        return None
    ts, by_state, waiting, running = autoscale_series(tl)
    x = [t / 1e6 for t in ts]
    fig, axes = new_figure(2, 1, height=6.0, sharex=True)
    ax = axes[0][0]
    colours = {"serving": "tab:green", "loading": "tab:orange", "draining": "tab:red"}
    for s in SCALED_STATES:
        ax.step(x, by_state[s], where="post", label=s, color=colours[s], linewidth=1.2)
    pools = pool_series(tl, ts)
    styles = {"prefill": ":", "decode": "--"}
    for role, (serving, _) in pools.items():
        ax.step(x, serving, where="post", label=f"{role} serving", color="tab:green",
                linestyle=styles[role], linewidth=1)
    ax.set_ylabel("instances")
    count_axis(ax)
    ax = axes[1][0]
    ax.step(x, waiting, where="post", label="waiting (queue depth)", color="tab:blue", linewidth=1.2)
    for role, (_, queued) in pools.items():
        ax.step(x, queued, where="post", label=f"{role} waiting", color="tab:blue",
                linestyle=styles[role], linewidth=1)
    ax.step(x, running, where="post", label="running", color="tab:gray", linewidth=1)
    ax.set_ylabel("requests (all instances)")
    count_axis(ax)
    finish_time_axes(fig, axes[:, 0])
    return fig
