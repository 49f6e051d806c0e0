"""``calibrate --plot DIR``: matplotlib PNGs of sim vs real.

* ``<run>-cdf.png`` — CDFs of TTFT, TPOT and E2E, real and sim;
* ``<run>-scatter.png`` — per request sim vs real (log axes), with the y = x line;
* ``<run>-timeline.png`` — running, waiting and KV use over time, real and sim (only when
  the run has a timeseries).

Files are staged (:mod:`blis_simpy.atomic`) and renamed into place, so a failed run leaves no
partial PNG; ``calibrate`` commits them with its ``--report`` file.
Uses the non-interactive Agg backend (no display needed).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from blis_simpy.atomic import Batch, atomic_write
from blis_simpy.calibrate.compare import LABELS, real_values, sim_values
from blis_simpy.calibrate.twin import SimRun
from blis_simpy.errors import ConfigError
from blis_simpy.measured.run import MeasuredRun

PLOT_METRICS = ("ttft", "tpot", "e2e")


def _save(fig, path: Path, batch: Batch | None) -> Path:
    with atomic_write(path, batch=batch, field="--plot", what="cannot write the plot") as f:
        fig.savefig(f, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path


def write_plots(out_dir: str | os.PathLike, run: MeasuredRun, sim: SimRun,
                timeline: list[dict] | None = None, *, batch: Batch | None = None) -> list[Path]:
    """Write the PNGs for one run into ``out_dir`` (created if missing); returns their paths.
    With ``batch`` they are staged there, to commit with the batch's other outputs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(out_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the folder: {exc.strerror or exc}", file=str(d),
                          field="--plot") from None
    stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run.name) or "run"
    written = []

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, m in zip(axes, PLOT_METRICS, strict=True):
        real, simv = real_values(run, m), sim_values(sim, m)
        keys = [k for k in real if k in simv]
        for label, vals in (("real", [real[k] for k in keys]), ("sim", [simv[k] for k in keys])):
            v = np.sort(np.asarray(vals, dtype=float))
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label)
        ax.set_title(f"{LABELS[m]} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        if ax.get_legend_handles_labels()[0]:    # (none: matplotlib's UserWarning on stderr)
            ax.legend()
    written.append(_save(fig, d / f"{stem}-cdf.png", batch))
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, m in zip(axes, PLOT_METRICS, strict=True):
        real, simv = real_values(run, m), sim_values(sim, m)
        keys = [k for k in real if k in simv and real[k] > 0 and simv[k] > 0]
        x = np.array([real[k] for k in keys])
        y = np.array([simv[k] for k in keys])
        ax.scatter(x, y, s=8, alpha=0.6)
        if len(x):
            lo, hi = min(x.min(), y.min()), max(x.max(), y.max())
            ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_title(f"{LABELS[m]} per request")
        ax.set_xlabel("real (ms)")
        ax.set_ylabel("sim (ms)")
    written.append(_save(fig, d / f"{stem}-scatter.png", batch))
    plt.close(fig)

    if timeline:
        fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
        t = [r["t_s"] for r in timeline]
        for ax, key, label in zip(axes, ("running", "waiting", "kv_pct"),
                                  ("running requests", "waiting requests", "KV cache use (%)"), strict=True):
            for side in ("real", "sim"):
                ax.plot(t, [np.nan if r[f"{side}_{key}"] is None else r[f"{side}_{key}"] for r in timeline],
                        label=side)
            ax.set_ylabel(label)
            ax.legend()
        axes[-1].set_xlabel("time (s)")
        written.append(_save(fig, d / f"{stem}-timeline.png", batch))
        plt.close(fig)
    return written
