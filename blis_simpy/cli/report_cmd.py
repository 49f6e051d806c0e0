"""``blis-simpy report INPUT... --out DIR``: figures and one HTML page (docs/planning.md,
"Reports").

Inputs are recognised by what they hold (:mod:`blis_simpy.report.inputs`): ``--results-path``
files, ``--requests-out`` rows, ``--timeline`` files, sweep dataset directories and plan
results. Writes ``DIR/index.html`` and ``DIR/figures/*.png`` and prints one line per figure.
Bad input: ``error: <one line>``, exit 2 (the CLI's ``_Guarded`` group).
"""

from __future__ import annotations

import math
import os

import typer

from blis_simpy.errors import ConfigError


def report(inputs: list[str], out_dir: str, knee_factor: float) -> None:
    """Read ``inputs``, make every figure they allow, write the page into ``out_dir``."""
    from blis_simpy.atomic import check_out_dir
    from blis_simpy.report.figures import build_figures
    from blis_simpy.report.html import FIGURES, write_report
    from blis_simpy.report.inputs import load_inputs
    if not (math.isfinite(knee_factor) and 1 < knee_factor <= 100):
        raise ConfigError(f"must be in (1, 100], got {knee_factor:g}", field="--knee-factor")
    check_out_dir(out_dir, field="--out", subdirs=(FIGURES,))
    loaded = load_inputs(inputs)
    specs = build_figures(loaded, knee_factor)
    if not specs:       # an empty page said nothing, with exit 0
        raise ConfigError("nothing to show: no figure can be made from "
                          + "; ".join(f"{i.path} ({i.describe()})" for i in loaded), field="INPUT")
    try:
        page = write_report(out_dir, loaded, specs)
    except OSError as exc:
        raise ConfigError(f"cannot write the report: {exc.strerror or exc}", file=out_dir,
                          field="--out") from None
    for s in specs:
        print(f"{os.path.join(out_dir, 'figures', s.name + '.png')}  {s.title}")
    print(f"{page}  ({len(specs)} figure{'s' if len(specs) != 1 else ''} from "
          f"{len(loaded)} input{'s' if len(loaded) != 1 else ''})")


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        inputs: list[str] = typer.Argument(..., metavar="INPUT...",
                                           help="--results-path / --requests-out files, --timeline "
                                                "files, sweep dataset directories, plan results"),
        out: str = typer.Option(..., "--out", metavar="DIR",
                                help="write DIR/index.html and DIR/figures/*.png"),
        knee_factor: float = typer.Option(2.0, "--knee-factor",
                                          help="the knee: the lowest rate whose p99 latency "
                                               "exceeds this many times the lowest-rate value"),
    ) -> None:
        """Plots and one HTML page (readable without a server) from runs, timelines, sweeps
        and plans: latency CDFs, per-instance timelines, latency vs rate with the knee, SLO
        attainment heat map, PD transfers, Pareto front."""
        from blis_simpy.cli.logs import setup_logging
        setup_logging(None)
        report(inputs, out, knee_factor)
