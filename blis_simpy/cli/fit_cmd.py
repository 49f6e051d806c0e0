"""``blis-simpy fit``: fit a latency backend's coefficients to measured runs and write them
as a coefficient-set file (``--coefficients FILE`` / ``latency.coefficients`` load it).

Runs are given as for ``calibrate`` (vLLM log folder, inference-perf results folder, vllm
bench result, converted PREFIX); each is replayed under its own logged settings (or
``--scenario``) with the flags on top.
A set describes a GPU (or, for ``physics``, GPUs: its multipliers scale each GPU's own
catalog rates), never a model or a run: other backends' runs must all be on one GPU.
"""

from __future__ import annotations

import inspect
import logging
import shlex
import sys
from pathlib import Path

import typer

from blis_simpy.cli import flags as F
from blis_simpy.cli import plugin_optin
from blis_simpy.cli.calibrate_cmd import SKIP, prepare_runs
from blis_simpy.cli.logs import setup_logging
from blis_simpy.cli.options import flag_parameters, given_flags
from blis_simpy.errors import ConfigError

MAX_BUDGET_S = 7 * 24 * 3600.0
log = logging.getLogger("blis_simpy.fit")

#: blackbox's start when the run's model has no catalog row: 5 ms a step, 0.5 µs a prefill
#: token, 50 µs a decode token (the magnitude of the catalog's 8B rows)
BLACKBOX_START = "5000,0.5,50"
#: backends whose fitted set may span GPUs: physics' multipliers scale each GPU's own catalog
#: rates and its CPU costs are the host's, so one set can be shared across GPUs
SHARED_ACROSS_GPUS = ("physics",)


def _summary(c) -> dict:
    """The figures fit reports for one run's comparison: mean errors (and E2E MAPE for a run
    with per-request data; the whole run's for an aggregate one) and the three-number score."""
    whole = getattr(c, "total", c)          # an AggregateComparison's whole-run scope
    out = {}
    for m in ("ttft", "tpot", "e2e"):
        r = whole.row(m)
        if r is not None and r.real and r.sim:
            out[f"{m}_mean_error_pct"] = round(r.err_pct["mean"], 3)
    e2e = whole.row("e2e")
    if e2e is not None and hasattr(e2e, "mape_pct"):
        out["e2e_mape_pct"] = round(e2e.mape_pct, 3)
    if whole.score is not None:
        out["avg3_pct"] = round(whole.score.avg3_pct, 3)
    return out


def _cell(summary: dict, key: str, sign: str = "") -> str:
    """A % figure of :func:`_summary`, or "-" when the run has none (an aggregate run's MAPE)."""
    return f"{summary[key]:{sign}.1f}%" if key in summary else "-"


def _warn_if_starting_at_the_answer(cases) -> None:
    """A warning when the start set was fitted on one of the runs (its ``fit.runs`` names
    it): the fit then starts where it would end and returns that set."""
    from blis_simpy.calibrate.twin import fitted_on, latency_used
    from blis_simpy.deploy.resolve import resolve
    for c in cases:
        dep = resolve(c.scenario, quiet=True)
        hit = next((n for n in c.run.names if n in fitted_on(dep)), None)
        if hit is not None:
            log.warning("the start, %s, was fitted on run %s already: the fit starts at its answer "
                        "and returns it; --coefficients default starts from the physical set",
                        latency_used(dep), hit)
            return


def run_fit(runs: list[str], scenario: str | None, given: dict, output: str, budget_s: float,
            max_evaluations: int, cross_validate: bool, name: str, argv: list[str]) -> None:
    from rich.console import Console
    from rich.progress import Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from blis_simpy.atomic import check_target
    from blis_simpy.cli.tables import stdout_console
    from blis_simpy.fit import case_for, fit, space_for
    from blis_simpy.latency.coefficient_sets import write_set
    if not (0 < budget_s <= MAX_BUDGET_S):
        raise ConfigError(f"must be > 0 and <= {MAX_BUDGET_S:.0f} s, got {budget_s}", field="--time-budget")
    if not (1 <= max_evaluations <= 100_000):
        raise ConfigError(f"must be in [1, 100000], got {max_evaluations}", field="--max-evaluations")
    check_target(output, field="--output")     # before the fit's minutes of simulations
    if given.get("--latency-model") == "blackbox" and scenario is None and not (
            "--alpha-coeffs" in given or "--beta-coeffs" in given):
        # a model with no catalog row still fits: start from a generic point
        given = {**given, "--alpha-coeffs": "0,0,0", "--beta-coeffs": BLACKBOX_START}
    cases = [case_for(r, inv.scenario) for r, inv in prepare_runs(runs, given, scenario, "fit")]
    first = cases[0].scenario
    for c in cases[1:]:
        s = c.scenario
        if s.latency.model != first.latency.model or (
                s.hardware != first.hardware and first.latency.model not in SHARED_ACROSS_GPUS):
            raise ConfigError(f"run {c.run.name} is on {s.hardware} ({s.latency.model}), run "
                              f"{cases[0].run.name} on {first.hardware} ({first.latency.model}): a "
                              "coefficient set describes one GPU and one backend", field="fit")
    _warn_if_starting_at_the_answer(cases)
    gpus = sorted({c.scenario.hardware for c in cases})
    where = gpus[0] if len(gpus) == 1 else "+".join(gpus)
    space = space_for(first)
    err = Console(stderr=True)
    bar = Progress(TextColumn("fitting {task.fields[backend]}: {task.completed} simulations, "
                              "best cost {task.fields[cost]}"), TimeElapsedColumn(), console=err,
                   transient=True, disable=not sys.stderr.isatty())
    with bar:
        task = bar.add_task("fit", total=None, backend=space.backend, cost="-")
        n = [0]

        def on_eval(evals: int, cost: float) -> None:
            n[0] += 1
            bar.update(task, completed=n[0], cost=f"{cost:.4g}")

        res = fit(space, cases, time_budget_s=budget_s, max_evaluations=max_evaluations,
                  cross_validate=cross_validate, on_eval=on_eval)
    if res.budget_hit:   # the one way the fitted set can depend on the machine, not the inputs
        log.warning("the time budget (--time-budget %g s) ended a search before it converged or "
                    "used --max-evaluations: the fitted set depends on how fast this machine ran; "
                    "raise --time-budget for a reproducible fit", budget_s)
    provenance = {
        "command": "blis-simpy " + " ".join(shlex.quote(a) for a in argv),
        # every name a run goes by (a converted run: the logged run's too), so calibrate of
        # either says in-sample
        "runs": [n for c in cases for n in c.run.names],
        "parameters": {p.name: round(v, 6) for p, v in zip(space.params, res.x, strict=True)},
        "in_sample": {c.run: _summary(c) for c in res.in_sample},
        "evaluations": res.evaluations, "stopped": res.stopped,
    }
    if res.held_out:
        provenance["leave_one_out"] = {c.run: _summary(c) for c in res.held_out}
    if res.frontend is not None:
        provenance["frontend"] = res.frontend.to_dict()
    step_line = ""
    if res.prefit is not None:
        from blis_simpy.fit.aggregate_steps import case_steps
        from blis_simpy.fit.prefit import step_mape_pct
        pre = res.prefit.to_dict()
        pre["step_mape_fitted_pct"] = round(step_mape_pct(space, case_steps(space, cases), res.x), 3)
        provenance["step_prefit"] = pre
        step_line = (f"step-level pre-fit on {pre['ticks']} pure-decode steps (log ticks, aggregate stages): step MAPE "
                     f"{pre['step_mape_before_pct']:.1f}% at the base set, {pre['step_mape_after_pct']:.1f}% "
                     f"after the pre-fit (a second start), {pre['step_mape_fitted_pct']:.1f}% with the fitted set")
    cs = res.coefficient_set.model_copy(update={
        "name": name or f"{where}-{space.backend}-fitted", "gpu": where,
        "description": f"{space.backend} coefficients fitted to {len(cases)} measured run(s) on {where}",
        "fit": provenance})
    write_set(Path(output), cs, comment=f"written by: {provenance['command']}", field="--output")
    con = stdout_console()
    t = Table(title=f"fit: {space.backend} on {where} ({res.evaluations} simulations, "
                    f"{res.seconds:.0f} s, {res.stopped})", title_justify="left")
    for col in ("parameter", "start", "fitted", "bounds"):
        t.add_column(col, justify="right" if col != "parameter" else "left")
    for p, v in zip(space.params, res.x, strict=True):
        t.add_row(p.name + (f" ({p.unit})" if p.unit else ""), f"{p.x0:.4g}", f"{v:.4g}", f"[{p.lo:.4g}, {p.hi:.4g}]")
    con.print(t)
    t = Table(title="error after the fit (mean sim vs real; E2E MAPE per request; the three-number score)",
              title_justify="left")
    for col in ("run", "", "TTFT", "TPOT", "E2E", "E2E MAPE", "avg3"):
        t.add_column(col, justify="left" if col in ("run", "") else "right")
    for label, comps in (("in-sample", res.in_sample), ("held out", res.held_out)):
        for c in comps:
            s = _summary(c)
            t.add_row(c.run, label, *(_cell(s, k, "+") for k in
                                      ("ttft_mean_error_pct", "tpot_mean_error_pct", "e2e_mean_error_pct")),
                      _cell(s, "e2e_mape_pct"), _cell(s, "avg3_pct"))
    con.print(t)
    if step_line:
        con.print(step_line, highlight=False)
    if res.frontend is not None:
        gaps = ", ".join(f"{g.run} {g.gap_ms:.2f} ms" for g in res.frontend.gaps)
        con.print(f"front end: {res.frontend.params.network_us:.0f} µs each way, half the median TTFT gap "
                  f"of the light stages measured at the client ({gaps})", highlight=False)
    con.print(f"wrote {output}", highlight=False)


def register(app: typer.Typer) -> None:
    P = inspect.Parameter
    params = [
        P("runs", P.KEYWORD_ONLY, annotation=list[str],
          default=typer.Argument(..., metavar="RUN...", help="measured runs (as for calibrate), one GPU")),
        P("output", P.KEYWORD_ONLY, annotation=Path,
          default=typer.Option(..., "--output", "-o", metavar="FILE.yaml", help="coefficient-set file to write")),
        P("scenario", P.KEYWORD_ONLY, annotation=Path | None,
          default=typer.Option(None, "--scenario", metavar="FILE.yaml",
                               help="deployment to replay under (default: each run's logged settings)")),
        P("time_budget", P.KEYWORD_ONLY, annotation=float,
          default=typer.Option(600.0, "--time-budget", metavar="S", help="stop after S seconds (best so far)")),
        P("max_evaluations", P.KEYWORD_ONLY, annotation=int,
          default=typer.Option(200, "--max-evaluations", metavar="N", help="at most N simulations per search")),
        P("cross_validate", P.KEYWORD_ONLY, annotation=bool,
          default=typer.Option(True, "--cross-validate/--no-cross-validate",
                               help="with several runs, also fit leaving each out and score on it")),
        P("name", P.KEYWORD_ONLY, annotation=str,
          default=typer.Option("", "--name", help="name written into the set")),
        P("allow_plugins", P.KEYWORD_ONLY, annotation=bool, default=plugin_optin.option()),
    ] + flag_parameters(F.REPLAY, SKIP)

    def cmd(**kw) -> None:
        runs, output, scenario = kw.pop("runs"), kw.pop("output"), kw.pop("scenario")
        budget, max_eval = kw.pop("time_budget"), kw.pop("max_evaluations")
        cv, name = kw.pop("cross_validate"), kw.pop("name")
        plugin_optin.set_given(kw.pop("allow_plugins"))
        given = given_flags(F.REPLAY, kw)
        setup_logging(given.get("--log"))
        run_fit(runs, str(scenario) if scenario else None, given, str(output), budget, max_eval, cv, name,
                ["fit", *sys.argv[2:]] if len(sys.argv) > 1 and sys.argv[1] == "fit" else ["fit", *runs])

    cmd.__signature__ = inspect.Signature(params)
    cmd.__name__ = "fit"
    cmd.__doc__ = ("Fit a latency backend's coefficients (physics, trained-physics, blackbox) to "
                   "measured runs by least squares with the simulator in the loop; write a "
                   "coefficient-set file and print in-sample and leave-one-out error.")
    app.command("fit")(cmd)
