"""``blis-simpy sweep``: run a sweep file's points on Dask into a Parquet dataset, or summarize one.

::

    blis-simpy sweep SWEEP.yaml --out DIR [--scheduler tcp://host:8786] [--workers N]
                     [--format table|json] [--metric KEY ...]
    blis-simpy sweep --summary DIR [--format table|json] [--metric KEY ...]

Running: every point is validated first (a bad axis value stops the sweep before anything
runs, exit 2); points whose config hash already has an ``ok`` row in DIR are skipped (resume);
the others run on a local Dask cluster (one worker process per core, or ``--workers N``) or
on the cluster of ``--scheduler``; rows are written to DIR as points complete. Then the
summary prints: per configuration, the mean of each metric over the seeds with its 95 %
confidence interval. Exit status: 0, or 1 when a point failed (its row holds the error).
docs/planning.md, "Sweeps".
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import typer

from blis_simpy.cli import plugin_optin

#: metrics of the summary table unless --metric is given (those present in the dataset)
DEFAULT_METRICS = ("m.ttft_p99_ms", "m.itl_p99_ms", "m.e2e_p99_ms", "m.responses_per_sec",
                   "slo.attainment_pct.all", "slo.goodput_rps", "deployment.total_gpus")
#: the default columns a narrow terminal leaves out, first left out first (the SLO
#: attainment and TTFT stay longest); columns named with --metric go from the last named
DEFAULT_DROP = ("deployment.total_gpus", "m.responses_per_sec", "m.e2e_p99_ms", "slo.goodput_rps",
                "m.itl_p99_ms", "slo.attainment_pct.all")
#: short headers of the table (other columns show their dataset name)
HEADERS = {"m.ttft_p99_ms": "TTFT p99 ms", "m.itl_p99_ms": "ITL p99 ms", "m.e2e_p99_ms": "E2E p99 ms",
           "m.responses_per_sec": "req/s", "slo.attainment_pct.all": "SLO met %",
           "slo.goodput_rps": "goodput req/s", "deployment.total_gpus": "GPUs"}


class SweepFormat(str, enum.Enum):
    table = "table"
    json = "json"


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_sweep(path: str, out: str, *, scheduler: str | None = None, workers: int | None = None,
              executor=None, flush_s: float | None = None) -> dict:
    """Validate, skip what DIR has, run the rest, write rows; returns run counts. ``executor``:
    an open :class:`~blis_simpy.planner.executor.Executor` to use (left open) instead of a new
    one; ``flush_s``: seconds between part files (default :data:`~blis_simpy.planner.dataset.FLUSH_S`)."""
    from blis_simpy.cli.runner import check_point
    from blis_simpy.planner import dataset, sweep_points
    from blis_simpy.planner.executor import Executor, check_options
    from blis_simpy.planner.sweep_file import axis_values
    from blis_simpy.run.point import run_point
    if executor is None:    # a bad option is the only line: before the sweep file is expanded
        check_options(scheduler, workers)
    sweep = sweep_points.load(path)
    pts = sweep_points.expand(sweep, check_point)
    kinds = dataset.axis_columns({k: axis_values(a) for k, a in sweep.spec.axes.items()})
    done = dataset.done_hashes(out)   # the directory is created once the cluster is up
    seen: set[str] = set()
    todo = []
    for p in pts:
        if p.config_hash not in done and p.config_hash not in seen:
            todo.append(p)
        seen.add(p.config_hash)
    skipped = sum(1 for h in seen if h in done)
    dup = len(pts) - len(seen)
    name = f" {sweep.spec.name}" if sweep.spec.name else ""
    n_seeds = len(sweep.seeds)
    n_cfg = len(sweep.combos)
    _err(f"sweep{name}: {len(pts)} points ({n_cfg} configuration{'s' if n_cfg != 1 else ''} x {n_seeds} "
         f"seed{'s' if n_seeds != 1 else ''}){f', {dup} duplicate points dropped' if dup else ''}; "
         f"{skipped} already in {out} (skipped), {len(todo)} to run")
    stats = {"points": len(pts), "skipped": skipped, "run": 0, "failed": 0, "first_error": "",
             "wall_s": 0.0}
    if not todo:
        return stats
    t0 = time.perf_counter()
    own = executor is None
    ex = Executor(scheduler=scheduler, n_workers=workers) if own else executor
    flush = dataset.FLUSH_S if flush_s is None else flush_s
    with (ex if own else contextlib.nullcontext()), dataset.DatasetWriter(out, flush) as writer:
        dataset.promote_axis_columns(out, kinds)     # an integer axis given a float value
        _err(f"running on {ex.n_workers} Dask worker{'s' if ex.n_workers != 1 else ''}"
             f"{f' at {scheduler}' if scheduler else ' (local cluster)'}")

        def on_result(i: int, row: dict) -> None:
            writer.add(dataset.dataset_row(todo[i], row, kinds))
            stats["run"] += 1
            if row.get("status") != "ok":
                stats["failed"] += 1
                stats["first_error"] = stats["first_error"] or row.get("error", "")

        ex.map(partial(run_point, allow_plugins=plugin_optin.allowed()), [p.job() for p in todo],
               on_result=on_result)
    stats["wall_s"] = time.perf_counter() - t0
    failed = f", {stats['failed']} failed (first: {stats['first_error']})" if stats["failed"] else ""
    _err(f"{stats['run']} points run in {stats['wall_s']:.1f} s{failed}; dataset: {out}")
    return stats


# ---------------------------------------------------------------------------- summary
def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    a = abs(x)
    if float(x).is_integer() and a < 1e15:
        return f"{x:.0f}"
    return f"{x:.0f}" if a >= 1000 else f"{x:.1f}" if a >= 100 else f"{x:.2f}" if a >= 1 else f"{x:.3g}"


def _cell(m: dict | None) -> str:
    if m is None:
        return "-"
    if m["ci95_low"] is None or m["ci95_low"] == m["ci95_high"]:
        return _fmt(m["mean"])
    return f"{_fmt(m['mean'])} ± {_fmt((m['ci95_high'] - m['ci95_low']) / 2)}"


def print_summary(summary: dict, fmt: SweepFormat, metrics: list[str], title: str) -> None:
    if fmt is SweepFormat.json:
        sys.stdout.write(json.dumps(summary, indent=2, allow_nan=False, default=str) + "\n")
        return
    from rich.table import Table

    from blis_simpy.cli.tables import Fitted, stdout_console
    present = summary["metrics"]
    if metrics:
        unknown = [m for m in metrics if m not in present]
        if unknown:
            from blis_simpy.errors import ConfigError, did_you_mean
            near = did_you_mean(unknown[0], present)
            raise ConfigError(f"no such metric in the dataset: {unknown[0]}" + (near or (
                f" (have: {', '.join(present[:8])}{', ...' if len(present) > 8 else ''})")),
                              field="--metric")
        shown = metrics
    else:
        shown = [m for m in DEFAULT_METRICS if m in present]
    table = Table(title=title, title_justify="left")
    axes = summary["axes"]
    last = [a.rsplit(".", 1)[-1] for a in axes]
    for a, short in zip(axes, last, strict=True):
        table.add_column(short if last.count(short) == 1 else a, justify="right", no_wrap=True)
    table.add_column("seeds", justify="right")
    for m in shown:
        table.add_column(HEADERS.get(m, m), justify="right", no_wrap=True)
    failed = any(c["failed"] for c in summary["configs"])
    if failed:
        table.add_column("failed", justify="right")
    for c in summary["configs"]:
        cells = [str(c["axes"].get(a)) for a in summary["axes"]] + [str(c["n"])]
        cells += [_cell(c["metrics"].get(m)) for m in shown]
        if failed:
            cells.append(str(c["failed"]) if c["failed"] else "")
        table.add_row(*cells)
    console = stdout_console()
    drop = shown[:0:-1] if metrics else DEFAULT_DROP   # the axes, seeds and failures stay
    console.print(Fitted(table, drop=[HEADERS.get(m, m) for m in drop],
                         note="--metric KEY picks the columns, --format json has them all"))
    console.print(f"{summary['points']} points ({summary['ok']} ok, {summary['failed']} failed); "
                  "cells: mean over the seeds ± half the 95 % confidence interval (Student's t)",
                  highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        path: Path = typer.Argument(None, metavar="SWEEP.yaml", help="the sweep file"),
        out: Path = typer.Option(None, "--out", metavar="DIR", help="the Parquet dataset directory "
                                 "(created; points already in it are skipped)"),
        scheduler: str = typer.Option(None, "--scheduler", metavar="ADDR",
                                      help="a running Dask scheduler (tcp://host:8786); default: a "
                                           "local cluster"),
        workers: int = typer.Option(None, "--workers", metavar="N",
                                    help="worker processes of the local cluster (default: one per core)"),
        summary: Path = typer.Option(None, "--summary", metavar="DIR",
                                     help="only print the summary of an existing dataset"),
        metric: list[str] = typer.Option(None, "--metric", metavar="KEY",
                                         help="summary column (repeatable), e.g. m.ttft_p99_ms"),
        fmt: SweepFormat = typer.Option(SweepFormat.table, "--format", case_sensitive=False,
                                        help="summary as a rich table or one JSON document"),
        allow_plugins: bool = plugin_optin.option(),
    ) -> None:
        """Run a sweep (a base scenario x axes x seeds) on Dask into a Parquet dataset, then
        print the mean and 95 % CI of each metric per configuration (docs/planning.md)."""
        from blis_simpy.cli.logs import setup_logging
        from blis_simpy.errors import ConfigError
        from blis_simpy.planner import dataset
        setup_logging(None)
        plugin_optin.set_given(allow_plugins)
        if summary is not None:
            if path is not None or out is not None or scheduler or workers:
                raise ConfigError("--summary DIR takes no sweep file, --out, --scheduler or --workers",
                                  field="--summary")
            table = dataset.read(str(summary), required=True)
            print_summary(dataset.summarize(table), fmt, metric or [], f"sweep dataset {summary}")
            return
        if path is None:
            raise ConfigError("give a sweep file (blis-simpy sweep SWEEP.yaml --out DIR) or "
                              "--summary DIR", field="SWEEP.yaml")
        if out is None:
            raise ConfigError("is required: the dataset directory", field="--out")
        stats = run_sweep(str(path), str(out), scheduler=scheduler, workers=workers)
        table = dataset.read(str(out))
        if table.num_rows:
            print_summary(dataset.summarize(table), fmt, metric or [], f"sweep {path} -> {out}")
        if stats["failed"]:
            raise typer.Exit(1)
