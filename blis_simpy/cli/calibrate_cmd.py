"""``blis-simpy calibrate``: replay measured runs through the simulator and report sim vs real.

A run is a raw vLLM log folder, a ``vllm bench`` result JSON, the ``PREFIX`` of files
``blis-simpy convert`` (or ``observe``) wrote, or an inference-perf results folder
(:func:`blis_simpy.measured.converted.load_run`). The deployment is the run's logged settings
(model, GPU, parallelism, vLLM limits, KV blocks), or ``--scenario FILE``; BLIS's replay
flags override either (``--latency-model``, ``--coefficients``, ``--hardware``, ...). The
replay always runs to completion (no horizon) unless ``--horizon`` is given. An
inference-perf run is rebuilt with the scenario's seed and compared per stage
(:mod:`blis_simpy.calibrate.aggregate`).
"""

from __future__ import annotations

import enum
import inspect
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from blis_simpy.atomic import Batch, atomic_write
from blis_simpy.cli import flags as F
from blis_simpy.cli import plugin_optin
from blis_simpy.cli.logs import setup_logging
from blis_simpy.cli.options import flag_parameters, given_flags
from blis_simpy.errors import ConfigError
from blis_simpy.units import MAX_INT64

log = logging.getLogger("blis_simpy.calibrate")

if TYPE_CHECKING:   # the simulator stack loads only when a command runs
    from blis_simpy.cli import runner

#: replay flags that make no sense here (the workload is the measured run)
SKIP = ("--trace-header", "--trace-data", "--trace-output", "--results-path", "--timeline",
        "--timeline-interval-ms")   # calibrate has its own --timeline (real vs sim)


class CalFormat(str, enum.Enum):
    table = "table"
    json = "json"


def _aggregate(run) -> bool:
    """An inference-perf run (aggregates only), not a per-request one."""
    from blis_simpy.measured.run import AggregateRun
    return isinstance(run, AggregateRun)


def prepare_invocation(run, given: dict, scenario: str | None, command: str = "calibrate") -> runner.Invocation:
    """The scenario a measured run is replayed under: ``scenario`` (file) or the run's own
    settings, with the given flags on top; no horizon unless ``--horizon`` is given."""
    from blis_simpy.calibrate import scenario_data
    from blis_simpy.cli import runner
    given = dict(given)
    if scenario is not None:
        inv = runner.prepare(F.REPLAY, given, scenario, need_trace=False)
    else:
        if run.settings is None and "--model" in given:
            inv = runner.prepare(F.REPLAY, given, None, need_trace=False)
        elif run.settings is None:
            what = "no exp-config.yaml" if _aggregate(run) else "a vllm bench result"
            raise ConfigError(f"the run {run.name} records no engine settings ({what}): "
                              "pass --scenario FILE.yaml or --model/--hardware/--tp", field=command)
        else:
            if not run.settings.hardware and "--hardware" not in given:
                raise ConfigError(f"the run {run.name} does not record its GPU: pass --hardware "
                                  "(or --scenario FILE.yaml)", field="--hardware")
            data = scenario_data(run.settings, run.name)
            data["latency"] = {"model": runner.BLIS_DEFAULT_LATENCY_MODEL}
            inv = runner.prepare(F.REPLAY, given, data=data, need_trace=False)
    if "--horizon" not in given:
        inv.scenario = inv.scenario.model_copy(update={"horizon_us": MAX_INT64})
    return inv


def prepare_runs(paths: list[str], given: dict, scenario: str | None, command: str = "calibrate") -> list:
    """Every run read and checked, then its invocation (:func:`prepare_invocation`): ``[(run, inv)]``. An
    inference-perf run is rebuilt with its invocation's seed."""
    from blis_simpy.measured.converted import load_run
    from blis_simpy.measured.inference_perf import with_seed
    loaded = [load_run(r) for r in paths]          # every input checked before any run
    for path, run in zip(paths, loaded, strict=True):
        if not run.records:     # (fit: an internal error; calibrate: empty tables, exit 0)
            raise ConfigError(f"the run has no request rows: nothing to {command} against", file=path)
    out = []
    for run in loaded:
        inv = prepare_invocation(run, given, scenario, command)
        out.append((with_seed(run, inv.scenario.seed) if _aggregate(run) else run, inv))
    return out


def _about(s, dep, total_kv_blocks: int, notes: list[str], run_names: tuple[str, ...]) -> dict:
    """What the twin ran: backend, coefficients, deployment; ``in_sample`` when the set was
    fitted on this very run, under any of its names (a converted run goes by the logged
    run's name too; its error is then no prediction: docs/accuracy.md)."""
    from blis_simpy.calibrate.twin import fitted_on, latency_used
    fitted = fitted_on(dep)
    hit = next((n for n in run_names if n in fitted), None)
    in_sample = hit is not None
    if in_sample:
        msg = (f"in-sample: the coefficient set was fitted on this run ({hit}), so these errors "
               "show how well it fits, not how well it predicts; --coefficients default runs uncalibrated")
        log.warning("%s", msg)
    return {"latency_model": s.latency.model, "coefficients": s.latency.coefficients,
            "coefficients_used": latency_used(dep), "in_sample": in_sample, "hardware": s.hardware,
            "model": s.model, "tp": s.tp, "dp": s.dp, "total_kv_blocks": total_kv_blocks, "notes": list(notes)}


def _headline(console, name: str, doc: dict) -> None:
    console.print(f"[bold]{name}[/bold]: {doc['latency_model']} on {doc['hardware']} "
                  f"(TP {doc['tp']}, DP {doc['dp']}), {doc['total_kv_blocks']} KV blocks"
                  + (f", {doc['coefficients_used']}" if doc["coefficients_used"] else ""), highlight=False)


def calibrate(runs: list[str], scenario: str | None, given: dict, fmt: CalFormat,
              plot_dir: str | None, report_path: str | None, timeline: bool) -> None:
    from blis_simpy.calibrate import compare, simulate
    from blis_simpy.calibrate.aggregate import calibrate_aggregate
    from blis_simpy.calibrate.report import (
        clean,
        paired_timeline,
        render,
        render_aggregate,
        render_timeline,
        timeline_errors,
    )
    from blis_simpy.cli.tables import stdout_console
    from blis_simpy.deploy.resolve import resolve
    if plot_dir and Path(plot_dir).exists() and not Path(plot_dir).is_dir():
        raise ConfigError("exists and is not a folder", file=str(plot_dir), field="--plot")
    if report_path and Path(report_path).is_dir():
        raise ConfigError("is a directory, expected a file path", file=str(report_path), field="--report")
    prepared = prepare_runs(runs, given, scenario)
    docs, outputs = [], []
    console = stdout_console()
    for run, inv in prepared:
        s = inv.scenario
        dep = resolve(s, quiet=True)
        if _aggregate(run):
            c = calibrate_aggregate(s, run, deployment=dep)
            doc = {**c.to_dict(), **_about(s, dep, c.sim.total_kv_blocks, run.notes, run.names),
                   "measured_at": run.measured_at, "seed": run.seed}
            docs.append(doc)
            outputs.append((run, None, c, []))
            continue
        sim = simulate(s, run, deployment=dep, horizon_us=s.horizon_us if s.horizon_us is not None else MAX_INT64)
        c = compare(run, sim)
        rows = paired_timeline(run.ticks, sim.samples) if timeline else []
        doc = {**c.to_dict(), **_about(s, dep, sim.total_kv_blocks, run.notes, run.names)}
        if rows:
            doc["timeline"] = rows
            doc["timeline_errors"] = timeline_errors(rows)
        docs.append(doc)
        outputs.append((run, sim, c, rows))
    files = Batch()          # the report and every plot land together, or none (docs/cli.md)
    plots: list[Path] = []
    try:
        if report_path:
            _write_json(report_path, clean({"runs": docs}), files)
        if plot_dir:
            from blis_simpy.calibrate.plots import write_plots
            for run, sim, _c, rows in outputs:
                if sim is None:
                    print(f"no plots for {run.name}: the run has aggregate metrics only", file=sys.stderr)
                    continue
                plots += write_plots(plot_dir, run, sim, rows, batch=files)
        files.commit()
    finally:
        files.abort()
    for p in plots:
        print(f"wrote {p}", file=sys.stderr)
    if fmt is CalFormat.json:
        sys.stdout.write(json.dumps(clean({"runs": docs}), indent=2, sort_keys=False) + "\n")
        return
    for (run, sim, c, rows), doc in zip(outputs, docs, strict=True):
        _headline(console, run.name, doc)
        if sim is None:
            render_aggregate(console, c)
            for note in run.notes:
                console.print(f"note: {note}", highlight=False)
            continue
        render(console, c)
        if rows:
            render_timeline(console, rows)
            e = doc["timeline_errors"]
            kv = e["kv_pct_mean_abs_diff"]
            kv_text = "KV not recorded" if kv != kv else f"KV {kv:.1f} points"
            console.print(f"timeline mean |sim − real|: running {e['running_mean_abs_diff']:.1f}, "
                          f"waiting {e['waiting_mean_abs_diff']:.1f} requests, {kv_text}",
                          highlight=False)


def _write_json(path: str, obj, batch: Batch) -> None:
    """Stage ``obj`` as indented JSON at ``path`` in ``batch`` (committed with the plots)."""
    with atomic_write(path, batch=batch, field="--report", what="cannot write", binary=False) as f:
        f.write(json.dumps(obj, indent=2) + "\n")


def register(app: typer.Typer) -> None:
    params = [
        inspect.Parameter("runs", inspect.Parameter.KEYWORD_ONLY, annotation=list[str],
                          default=typer.Argument(..., metavar="RUN...",
                                                 help="measured runs: a vLLM log folder, an inference-perf "
                                                      "results folder, a vllm bench result .json, or "
                                                      "the PREFIX of converted files")),
        inspect.Parameter("scenario", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                          default=typer.Option(None, "--scenario", metavar="FILE.yaml",
                                               help="deployment to replay under (default: the run's "
                                                    "logged settings); flags override it")),
        inspect.Parameter("format", inspect.Parameter.KEYWORD_ONLY, annotation=CalFormat,
                          default=typer.Option(CalFormat.table, "--format", case_sensitive=False,
                                               help="rich tables or one JSON document",
                                               rich_help_panel=F.OUTPUT)),
        inspect.Parameter("plot", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                          default=typer.Option(None, "--plot", metavar="DIR",
                                               help="write PNGs: CDFs, per-request scatter, timelines",
                                               rich_help_panel=F.OUTPUT)),
        inspect.Parameter("report", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                          default=typer.Option(None, "--report", metavar="FILE.json",
                                               help="write the JSON document to a file too",
                                               rich_help_panel=F.OUTPUT)),
        inspect.Parameter("timeline", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(True, "--timeline/--no-timeline",
                                               help="compare running/waiting/KV timelines where the "
                                                    "run has a timeseries", rich_help_panel=F.OUTPUT)),
        inspect.Parameter("allow_plugins", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=plugin_optin.option()),
    ] + flag_parameters(F.REPLAY, SKIP)

    def cmd(**kw) -> None:
        runs, scenario, fmt = kw.pop("runs"), kw.pop("scenario"), kw.pop("format")
        plot, report, timeline = kw.pop("plot"), kw.pop("report"), kw.pop("timeline")
        plugin_optin.set_given(kw.pop("allow_plugins"))
        given = given_flags(F.REPLAY, kw)
        setup_logging(given.get("--log"))
        calibrate(runs, str(scenario) if scenario else None, given, fmt,
                  str(plot) if plot else None, str(report) if report else None, timeline)

    cmd.__signature__ = inspect.Signature(params)
    cmd.__name__ = "calibrate"
    cmd.__doc__ = ("Replay measured runs (vLLM log folder, inference-perf results folder, vllm bench "
                   "result, converted PREFIX) to completion and report sim vs real: TTFT/TPOT/E2E/"
                   "scheduling-delay errors, MAPE, the three-number score, throughput, timelines.")
    app.command("calibrate")(cmd)
