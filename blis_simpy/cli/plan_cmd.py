"""``blis-simpy plan PLAN.yaml``: the cheapest deployment that meets the SLOs, and the highest
rate a deployment sustains (docs/planning.md, "Plans").

::

    blis-simpy plan PLAN.yaml [--format table|json] [--out FILE.json]
                              [--scheduler tcp://host:8786 | --workers N | --serial]
                              [--parallel K] [--brute-force]

Points run on the sweep's executor (:class:`blis_simpy.planner.executor.Executor`, a Dask
LocalCluster by default) through :func:`blis_simpy.run.point.run_point`; ``--serial`` runs
them in this process. The search itself lives in :mod:`blis_simpy.planner.search`; this module
injects the point runner and prints the result: a rich table (winner, runner-ups, Pareto
fronts, runs used vs the cross product) or ``--format json`` (the document ``--out`` writes).
"""

from __future__ import annotations

import enum
import json
import math
import sys
from pathlib import Path

import typer

from blis_simpy.cli import plugin_optin


class PlanFormat(str, enum.Enum):
    table = "table"
    json = "json"


def _clean(obj):
    """JSON-safe: NaN and infinities become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(doc: dict) -> str:
    return json.dumps(_clean(doc), indent=2, allow_nan=False) + "\n"


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` all-or-nothing (:mod:`blis_simpy.atomic`); errors name
    ``path`` and ``--out``."""
    from blis_simpy.atomic import atomic_write
    with atomic_write(path, field="--out", what="cannot write the plan", binary=False) as fh:
        fh.write(text)


def precheck(plan) -> None:
    """Validate the smallest deployment of every family (and a fixed max-rate deployment)
    before anything runs. A family that cannot be built (the model does not fit) is a failed
    candidate, not a bad plan; but when none can be built the first reason is the error."""
    from blis_simpy.cli.runner import check_point
    from blis_simpy.errors import ConfigError
    from blis_simpy.planner.candidates import families, fixed_deployment, point
    spec = plan.spec
    modules = plan.base.get("plugins")
    if modules and isinstance(modules, list) and not plugin_optin.allowed():
        from blis_simpy.config.loader import load_raw
        _, bsrc = load_raw(plan.base_path)
        raise ConfigError(plugin_optin.refusal([str(m) for m in modules]), file=plan.base_path,
                          line=bsrc.line(("plugins",)), field="plugins")
    seed = spec.search.seeds[0] if spec.search is not None else 42
    if spec.max_rate is not None and spec.max_rate.deployment != "winner":
        dep = fixed_deployment(spec.max_rate.deployment)
        try:
            check_point(point(plan, dep, seed, spec.max_rate.min_rate))
        except ConfigError as exc:
            raise ConfigError(f"{dep.label}: {exc.one_line()}", file=plan.src.path,
                              line=plan.src.line(("max_rate", "deployment")),
                              field="max_rate.deployment") from None
    fams = families(spec)
    problems = []
    for f in fams:
        dep = f.deployment(f.counts[0])
        try:
            check_point(point(plan, dep, seed))
        except ConfigError as exc:
            own = _plan_key(plan, exc)
            if own is not None:         # the plan's own workload key: no deployment helps
                raise plan.src.error(exc.problem, own) from None
            problems.append(f"{dep.label}: {exc.one_line()}")
    if fams and len(problems) == len(fams):
        raise ConfigError(f"no candidate deployment can be built: {problems[0]}", file=plan.src.path)


def _plan_key(plan, exc) -> tuple | None:
    """The plan file's key behind a candidate's error about a ``workload.*`` key the plan
    itself sets (``workload.prompt_tokens.mean``), so the error names that key and line;
    None when the key comes from elsewhere (the base scenario, a deployment)."""
    from blis_simpy.config.loader import undotted
    if exc.file not in (None, plan.src.path) or not (exc.field or "").startswith("workload."):
        return None
    loc = tuple(undotted(exc.field))
    set_keys = plan.spec.workload.model_fields_set
    return loc if len(loc) > 1 and loc[1] in set_keys and plan.src.has(loc[:2]) else None


def execute(plan, *, scheduler: str | None, workers: int | None, serial: bool,
            parallel: int | None, brute: bool, progress: bool, keep_saturated: bool = False) -> dict:
    """Run the plan on the executor (or serially); the plan output document."""
    from functools import partial

    from blis_simpy.planner import DEFAULT_PARALLEL
    from blis_simpy.planner.plan_runner import quiet_simulator_logs, run_plan
    from blis_simpy.run.point import run_point
    run_point = partial(run_point, allow_plugins=plugin_optin.allowed())   # (to the workers too)
    status = _Status(progress)
    k = parallel or DEFAULT_PARALLEL
    drop = False if keep_saturated else None      # None: the plan's slo.drop_saturated
    try:
        if serial:
            old = quiet_simulator_logs()
            try:
                return run_plan(plan, lambda pts: [run_point(p) for p in pts], parallel=k,
                                brute=brute, on_batch=status.advance, drop_saturated=drop)
            finally:
                quiet_simulator_logs(old)
        from blis_simpy.planner.executor import Executor
        with Executor(scheduler=scheduler, n_workers=workers) as ex:
            if scheduler is None:     # our own local workers (a shared cluster keeps its logging)
                ex.client.run(quiet_simulator_logs)
            return run_plan(plan, lambda pts: ex.map(run_point, pts, progress=False), parallel=k,
                            brute=brute, on_batch=status.advance, drop_saturated=drop)
    finally:
        status.stop()


class _Status:
    """``plan: N runs`` on stderr while the plan runs (only on a terminal)."""

    def __init__(self, enabled: bool):
        self.live = None
        self.runs = 0
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.status import Status
            self.live = Status("plan: starting", console=Console(stderr=True))
            self.live.start()

    def advance(self, n: int) -> None:
        self.runs += n
        if self.live is not None:
            self.live.update(f"plan: {self.runs} runs")

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


# ---------------------------------------------------------------------------- tables
def _ms(v) -> str:
    return f"{v:,.1f}" if isinstance(v, (int, float)) else "-"


def _cost(doc: dict, v) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    if doc["plan"]["cost_unit"] == "usd_per_hour":
        return f"${v:,.2f}/h"
    return f"{v:g} GPU{'s' if v != 1 else ''}"


def render(doc: dict, console) -> None:
    from rich.table import Table

    from blis_simpy.cli.tables import Fitted
    p = doc["plan"]
    slo = ", ".join(f"{k} <= {v:g}" for k, v in p["slo"].items() if k != "min_completed_fraction")
    console.print(f"[bold]plan[/bold] {p['name'] or p['file']}: {p['model']} on "
                  f"{', '.join(p['gpus'])}" + (f" (at most {p['max_gpus']} GPUs)" if p["max_gpus"] else "")
                  + (f" at {p['workload']['rate']:g} req/s" if p["workload"]["rate"] else ""))
    console.print(f"SLO: {slo}, completed >= {p['slo']['min_completed_fraction']:.0%} of offered; "
                  f"seeds {p['seeds']}", highlight=False)
    c = doc["cheapest"]
    if c is not None:
        t = Table(title="Cheapest deployments meeting the SLOs", title_justify="left")
        for col in ("", "deployment", "GPUs", "cost", "TTFT p99 ms", "ITL p99 ms", "E2E p99 ms",
                    "goodput req/s"):
            t.add_column(col, justify="left" if col in ("", "deployment") else "right")
        rows = ([("winner", c["winner"])] if c["winner"] else []) + \
               [(f"runner-up {i}", r) for i, r in enumerate(c["runner_ups"], 1)]
        for name, r in rows:
            m = r["metrics"]
            t.add_row(name, r["deployment"]["label"], str(r["gpus"]), _cost(doc, r["cost"]),
                      _ms(m.get("ttft_p99_ms")), _ms(m.get("itl_p99_ms")), _ms(m.get("e2e_p99_ms")),
                      _ms(r["goodput_rps"]))
        if rows:        # a narrow terminal leaves out the latencies the SLOs do not name first
            named = {f"{k.split('_')[0].upper()} p99 ms" for k in p["slo"]}
            drop = sorted(("E2E p99 ms", "ITL p99 ms", "TTFT p99 ms", "goodput req/s", "GPUs"),
                          key=lambda h: h in named)
            console.print(Fitted(t, drop=drop, note="--format json or --out FILE.json has them"))
        else:
            console.print("[bold red]no deployment in the search space meets the SLOs[/bold red]")
        console.print(f"runs: {c['runs']} of {c['cross_product_runs']} in the full cross product "
                      f"({c['deployments_judged']} of {c['cross_product_deployments']} deployments; "
                      f"{c['families_searched']} of {c['families']} families searched, "
                      f"{c['families_skipped']} skipped by the cost bound; {c['method']})",
                      highlight=False)
        sat = doc.get("saturation")
        if sat and sat["deployments_dropped"]:
            console.print(f"saturated deployments dropped early: {sat['deployments_dropped']} "
                          f"({sat['runs_stopped_early']} runs ended early, "
                          f"{sat['seed_runs_skipped']} runs of other seeds skipped)",
                          highlight=False)
        # wall-clock times go to stderr: stdout is then the same for the same plan
        print(f"plan: the search took {c['wall_s']:.1f} s", file=sys.stderr)
        if c["non_monotone_families"]:
            console.print(f"[yellow]not monotone in the instance count:[/yellow] "
                          f"{', '.join(c['non_monotone_families'])}")
        for key, title, col in (("cost_vs_ttft_p99", "Pareto front: cost vs p99 TTFT", "TTFT p99 ms"),
                                ("cost_vs_goodput", "Pareto front: cost vs goodput", "goodput req/s")):
            front = doc["pareto"][key]
            if not front:
                continue
            t = Table(title=title + " (deployments evaluated)", title_justify="left")
            for name in ("deployment", "cost", col, "meets SLOs"):
                t.add_column(name, justify="left" if name == "deployment" else "right")
            for f in front:
                v = f["ttft_p99_ms"] if key == "cost_vs_ttft_p99" else f["goodput_rps"]
                t.add_row(f["deployment"]["label"], _cost(doc, f["cost"]), _ms(v),
                          "yes" if f["meets"] else "no")
            console.print(t)
    m = doc["max_rate"]
    if m is not None:
        if m["deployment"] is None:
            console.print(f"max rate: {m['why_not']}")
        else:
            label = m["deployment"]["label"]
            if m["sustained_rate"] is None:
                text = f"fails the SLOs already at {m['min_rate']:g} req/s"
            elif m["failing_rate"] is None:
                text = f"meets the SLOs up to at least {m['max_rate']:g} req/s (the top of the range)"
            else:
                text = (f"sustains {m['sustained_rate']:g} req/s within the SLOs "
                        f"(fails at {m['failing_rate']:g}; tolerance {m['tolerance']:g})")
            console.print(f"[bold]max rate[/bold] of {label}: {text}; {m['runs']} runs",
                          highlight=False)
            print(f"plan: the max-rate bisection took {m['wall_s']:.1f} s", file=sys.stderr)


def register(app: typer.Typer) -> None:
    from blis_simpy.planner import DEFAULT_PARALLEL  # (the package only: no planner module)
    @app.command("plan")
    def plan_cmd(
        path: Path = typer.Argument(..., metavar="PLAN.yaml", help="plan file (docs/planning.md)"),
        fmt: PlanFormat = typer.Option(PlanFormat.table, "--format", case_sensitive=False,
                                       help="rich tables or the plan's JSON document"),
        out: str = typer.Option(None, "--out", metavar="FILE.json",
                                help="write the JSON document (front and every evaluated point)"),
        scheduler: str = typer.Option(None, "--scheduler", metavar="ADDRESS",
                                      help="run points on this Dask scheduler (tcp://host:8786)"),
        workers: int = typer.Option(None, "--workers", help="local cluster worker processes "
                                                          "(default: the machine's cores)"),
        serial: bool = typer.Option(False, "--serial", help="run points in this process, no Dask"),
        parallel: int = typer.Option(None, "--parallel", min=1, max=256,
                                     help=f"families bisected side by side (default {DEFAULT_PARALLEL}, "
                                          "whatever the executor: the points run depend on it)"),
        brute_force: bool = typer.Option(False, "--brute-force",
                                         help="run the whole cross product instead of the search"),
        keep_saturated: bool = typer.Option(False, "--keep-saturated",
                                            help="judge saturated runs by their SLOs only: run them "
                                                 "to the end and every seed (slo.drop_saturated: false)"),
        allow_plugins: bool = plugin_optin.option(),
    ) -> None:
        """Find the cheapest deployment meeting the SLOs (instances x TP x DP/EP x PD split,
        pruned), and the highest rate a deployment sustains (bisection)."""
        from blis_simpy.cli.logs import setup_logging
        from blis_simpy.errors import ConfigError
        from blis_simpy.planner.plan_file import load_plan
        setup_logging(None)
        plugin_optin.set_given(allow_plugins)
        if serial and scheduler:
            raise ConfigError("give --serial or --scheduler, not both", field="--serial")
        plan = load_plan(str(path))
        if out:                     # before the search's minutes of runs
            from blis_simpy.atomic import check_target
            check_target(out, field="--out")
        precheck(plan)
        doc = execute(plan, scheduler=scheduler, workers=workers, serial=serial, parallel=parallel,
                      brute=brute_force, progress=fmt is PlanFormat.table,
                      keep_saturated=keep_saturated)
        text = to_json(doc)
        if out:
            write_atomic(out, text)
        if fmt is PlanFormat.json:
            sys.stdout.write(text)
        else:
            from blis_simpy.cli.tables import stdout_console
            console = stdout_console()
            render(doc, console)
            if out:
                console.print(f"wrote {out}", highlight=False)
        sys.stdout.flush()
