"""The ``blis-simpy`` command line (typer): ``run``, ``replay`` and ``validate``.

``run`` and ``replay`` take BLIS's flags (built from the table in :mod:`blis_simpy.cli.flags`)
plus ``--scenario FILE.yaml`` (flags override its keys) and ``--format table|json|blis``.
Errors are handled in exactly one place, :class:`_Guarded`: a :class:`BlisError` prints
``error: <one line>`` on stderr and exits 2 (bad input) or 1 (simulation failure); never a
traceback, and a results file is only written after a successful run.

Start-up is kept small (docs/performance.md, "Start-up"): this module imports only typer and
the flag table; the simulator, numpy, pydantic and YAML load inside the commands that use them.
"""

from __future__ import annotations

import copy
import enum
import errno
import inspect
import io
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperGroup

from blis_simpy.cli import flags as F
from blis_simpy.cli import plugin_optin, startup_gc, usage
from blis_simpy.cli.calibrate_cmd import register as _register_calibrate
from blis_simpy.cli.catalog_cmd import register as _register_catalog
from blis_simpy.cli.convert_cmd import register as _register_convert
from blis_simpy.cli.fit_cmd import register as _register_fit
from blis_simpy.cli.logs import setup_logging
from blis_simpy.cli.observe_cmd import register as _register_observe
from blis_simpy.cli.options import flag_parameters, given_flags
from blis_simpy.cli.plan_cmd import register as _register_plan
from blis_simpy.cli.report_cmd import register as _register_report
from blis_simpy.cli.sweep_cmd import register as _register_sweep
from blis_simpy.errors import BlisError, ConfigError, validation_problem

if TYPE_CHECKING:   # the simulator stack loads when a command runs, not for --help
    from blis_simpy.cli import runner

log = logging.getLogger("blis_simpy")

class _Guarded(TyperGroup):
    """The one place that turns errors into ``error: <one line>`` and an exit status."""

    def parse_args(self, ctx, args):
        """Go bool flags also accept ``--name=true|false`` (click flags take no value)."""
        bools = {f.name for f in F.FLAGS if f.boolean}
        out = []
        for a in args:
            name, eq, value = a.partition("=")
            if eq and name in bools:
                v = value.strip().lower()
                if v in ("true", "t", "1"):
                    a = name
                elif v in ("false", "f", "0"):
                    a = "--no-" + name[2:]
            out.append(a)
        return super().parse_args(ctx, out)

    def make_context(self, info_name, args, parent=None, **extra):
        """The group's own usage errors (``blis-simpy --bogus``) as one line, exit 2."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as exc:
            _usage_failure(exc)

    def resolve_command(self, ctx, args):
        """An unknown sub-command names the commands; a command's help gets ready (usage.py)."""
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            raise usage.UnknownCommand(args[0], self.list_commands(ctx), ctx)
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and "--help" in rest:
            usage.prepare_help(cmd)
        return name, cmd, rest

    def format_help(self, ctx, formatter):
        usage.prepare_help(self)
        return super().format_help(ctx, formatter)

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except UsageError as exc:   # a sub-command's unknown flag, bad --format value, ...
            _usage_failure(exc)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except BlisError as exc:
            _fail(exc.one_line(), exc.exit_code)
        except FileNotFoundError as exc:
            _fail(ConfigError("no such file", file=exc.filename).one_line(), 2)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except SystemExit as exc:   # rich's console exits 1 on a closed pipe
            _write_failure(exc)
            raise
        except Exception as exc:
            _write_failure(exc)     # a closed or full stdout, a full disk: no bug
            problem = _input_problem(exc)
            if problem is not None:
                _fail(problem, 2)
            # a bug: still one line, the traceback only at --log debug
            log.debug("internal error", exc_info=True)
            _fail(f"internal error: {type(exc).__name__}: {exc}".replace("\n", " "), 1)


def _input_problem(exc: Exception) -> str | None:
    """The one line for a YAML syntax error or a pydantic validation error, else None.

    yaml and pydantic are looked up in ``sys.modules`` rather than imported: an exception of
    their type can only exist once the module is loaded, and ``--help`` must not load them."""
    yaml = sys.modules.get("yaml")
    if yaml is not None and isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        return ConfigError(f"invalid YAML: {exc}".replace("\n", " "), file=getattr(mark, "name", None),
                           line=mark.line + 1 if mark else None).one_line()
    core = sys.modules.get("pydantic_core")   # pydantic.ValidationError is pydantic_core's
    if core is not None and isinstance(exc, core.ValidationError):
        first = exc.errors(include_url=False)[0]
        fld = ".".join(str(p) for p in first["loc"]) or None
        return ConfigError(validation_problem(first), field=fld).one_line()
    return None


def _usage_failure(exc: UsageError):
    """``error: --flag: problem`` and exit 2; "no arguments = help" stays help."""
    if isinstance(exc, NoArgsIsHelpError):   # rich printed it already; click's plain layout not
        text = exc.format_message()
        if text.strip():
            print(text)
        raise typer.Exit(2)
    _fail(usage.usage_line(exc), exc.exit_code)


#: errno values of a failed write (a full disk or device, a quota, an I/O error, a closed fd)
_WRITE_ERRORS = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF))


def _write_failure(exc: BaseException) -> None:
    """The one place for output that cannot be written (used by every command through
    :class:`_Guarded` and by :func:`main` for the top level: ``--version``, ``--help``,
    completion, the final flush). Exits, or returns when ``exc`` is not such a failure.

    The reader of stdout went away (``| head -1``; click's own handler turns that into
    ``SystemExit(1)``, seen by its context): exit quietly with 141 (128 + SIGPIPE, the status a
    Unix tool killed by SIGPIPE gives). A full device, quota or I/O error: one line
    ``error: stdout: cannot write: <reason>`` (or the file's name instead of ``stdout``: every
    output file goes through :mod:`blis_simpy.atomic`, which names its path itself), exit 2.
    Either way stdout then points at /dev/null so the final flush cannot fail again."""
    if isinstance(exc, SystemExit):
        exc = exc.__context__
    if isinstance(exc, BrokenPipeError):
        _discard_stdout()
        raise typer.Exit(141) from None
    if isinstance(exc, OSError) and exc.errno in _WRITE_ERRORS:
        if not exc.filename:
            _discard_stdout()
        _fail(f"{exc.filename or 'stdout'}: cannot write: {exc.strerror or exc}", 2)


def _whole_writes() -> None:
    """Under ``PYTHONUNBUFFERED=1`` (``python -u``) stdout's binary layer is the raw file,
    and Python's text layer drops the rest of a short write (a file reaching its size limit,
    a full disk) without an error: the output was cut and the exit status 0. Put a buffered
    writer between them, which writes every byte or raises, flushed at each newline as
    ``-u`` would."""
    out = sys.stdout
    if isinstance(getattr(out, "buffer", None), io.FileIO):
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(out.buffer), encoding=out.encoding,
                                      errors=out.errors, line_buffering=True)


def _discard_stdout() -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
    except (OSError, ValueError, AttributeError):   # no real stdout to point elsewhere
        pass


def _fail(message: str, code: int):
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


app = typer.Typer(cls=_Guarded, add_completion=True, pretty_exceptions_enable=False,
                  no_args_is_help=True,
                  help="BLIS (Blackbox Inference Simulator) on SimPy.")


def _print_version(value: bool) -> None:
    if value:
        from blis_simpy import __version__
        print(f"blis-simpy {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")) -> None:
    # no docstring: the app's help above stays the group's help text
    pass


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    blis = "blis"


# ---------------------------------------------------------------------------- run / replay
def _simulate(command: str, scenario: Path | None, fmt: Format, raw: dict) -> None:
    from blis_simpy.cli import runner
    given = given_flags(command, raw)
    setup_logging(given.get("--log"))
    inv = runner.prepare(command, given, str(scenario) if scenario is not None else None)
    show_progress = fmt is Format.table and sys.stderr.isatty()
    if inv.scenario.variants:       # one run per variant, side by side (docs/disaggregation.md)
        from blis_simpy.cli import variants
        variants.simulate(inv, given, fmt.value, _with_progress if show_progress else runner.execute)
        return
    from blis_simpy.atomic import Batch
    outputs = Batch()     # every output file commits together, or none (docs/cli.md)
    try:
        run = _with_progress if show_progress else runner.execute
        out = run(inv, outputs=outputs, interruptible=True)
        if out.interrupted:     # Ctrl-C: the summary so far, no file, exit 130
            outputs.abort()
            _print(out, fmt)
            _fail(f"interrupted at simulated time {out.result.horizon_us / 1e6:.3f} s: the "
                  "summary covers the run until then; no output file written", 130)
        trace_output = inv.given.get("--trace-output")
        if trace_output:
            runner.export_trace(out, trace_output, outputs)
        results_path = inv.given.get("--results-path")
        if results_path:
            runner.write_results_file(out, results_path, outputs)
        decisions = inv.given.get("--trace-output-decisions")
        if decisions:
            from blis_simpy.trace.jsonl import write_jsonl
            write_jsonl(out.result.trace, decisions, outputs)
        summary = _render_summary(out, fmt)   # a summary that cannot be rendered: no file
        outputs.commit()
    finally:
        outputs.abort()
    sys.stdout.write(summary)
    sys.stdout.flush()


def _with_progress(inv: runner.Invocation, **kw) -> runner.Outcome:
    """Run with a rich progress bar on stderr, shown only once the run has taken 0.5 s."""
    import time

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from blis_simpy.cli import runner

    bar = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    task = bar.add_task("sim", total=None)
    t0 = time.monotonic()
    shown = False

    def progress(done: int, offered: int) -> None:
        nonlocal shown
        if not shown and time.monotonic() - t0 > 0.5:
            bar.start()
            shown = True
        bar.update(task, completed=done, total=offered or None)

    try:
        return runner.execute(inv, progress, **kw)
    finally:
        if shown:
            bar.stop()


def _deployment_text(n: int, tp: int, dp: int, gpus: int, autoscaled: str = "") -> str:
    """``2 instances x TP 2 x DP 2 = 8 GPUs`` for the run header (TP omitted when the
    pools' TPs differ, i.e. ``tp == 0``; DP when it is 1). ``autoscaled``: the autoscaler's
    bounds (``1-3`` or ``prefill 1-2 + decode 1-3``); ``gpus`` is then the most it uses."""
    text = f"{autoscaled} instances autoscaled" if autoscaled else f"{n} instance{'s' if n != 1 else ''}"
    if tp > 0:
        text += f" x TP {tp}"
    if dp > 1:
        text += f" x DP {dp}"
    return f"{text} {'<=' if autoscaled else '='} {gpus} GPU{'s' if gpus != 1 else ''}"


def _render_summary(out: runner.Outcome, fmt: Format) -> str:
    """The run's summary as the text :func:`_print` writes: rendered before any output file
    is committed, so a report that cannot be rendered leaves no file behind. Rich tables are
    captured with the console of stdout (its width, its colours)."""
    from blis_simpy.metrics.blis_text import render_blis
    from blis_simpy.metrics.report import render_json
    from blis_simpy.metrics.tables import render_tables
    if fmt is Format.blis:
        return render_blis(out.report)
    if fmt is Format.json:
        return render_json(out.report)
    from blis_simpy.cli import runner
    from blis_simpy.cli.capacity_cmd import run_header_line
    from blis_simpy.cli.tables import stdout_console
    from blis_simpy.cli.variants import autoscaled_bounds
    s = out.description.scenario
    console = stdout_console()
    n = s.cluster.num_instances
    with console.capture() as captured:
        console.print(f"[bold]{out.description.mode}[/bold]: {runner.offered_text(out)}, "
                      f"{_deployment_text(n, out.result.tp, s.dp, out.result.gpus, autoscaled_bounds(out.result.scenario))}, {s.latency.model}, "
                      f"horizon {runner.horizon_text(out.horizon_us)}")
        console.print(run_header_line(out.pools), highlight=False, soft_wrap=True)
        render_tables(out.report, console)
    return captured.get()


def _print(out: runner.Outcome, fmt: Format) -> None:
    """The run's summary on stdout; a write error (a full disk, ``> /dev/full``) is one line
    naming stdout, exit 2 (:func:`_write_failure`)."""
    sys.stdout.write(_render_summary(out, fmt))
    sys.stdout.flush()


def _command(command: str, doc: str):
    """A typer command whose options are the flag table's rows for ``command``."""
    params = [
        inspect.Parameter("scenario", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                          default=typer.Option(None, "--scenario", metavar="FILE.yaml",
                                               help="scenario YAML; given flags override its keys")),
        inspect.Parameter("format", inspect.Parameter.KEYWORD_ONLY, annotation=Format,
                          default=typer.Option(Format.table, "--format", case_sensitive=False,
                                               help="output: rich tables, one JSON document, "
                                                    "or BLIS's stdout layout",
                                               rich_help_panel=F.OUTPUT)),
    ]
    params.append(inspect.Parameter("allow_plugins", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                    default=plugin_optin.option()))
    params += flag_parameters(command)

    def cmd(**kw) -> None:
        plugin_optin.set_given(kw.pop("allow_plugins"))
        _simulate(command, kw.pop("scenario"), kw.pop("format"), kw)

    cmd.__signature__ = inspect.Signature(params)
    cmd.__name__ = command
    cmd.__doc__ = doc
    app.command(command)(cmd)


_command(F.RUN, "Simulate a scenario: a generated workload (distribution flags or a preset) "
                "or a scenario file; BLIS's `run` flags override the scenario.")
_command(F.REPLAY, "Replay a TraceV2 trace (--trace-header/--trace-data, or a scenario whose "
                   "workload is a trace) through the simulated cluster.")


@app.command("validate")
def validate_cmd(path: Path = typer.Argument(..., metavar="FILE.yaml", help="scenario to check"),
                 allow_plugins: bool = plugin_optin.option()) -> None:
    """Check a scenario file (keys, types, values, policies, trace files) without running it;
    its plugins: modules are listed, and imported only with --allow-plugins."""
    setup_logging(None)
    plugin_optin.set_given(allow_plugins)
    from blis_simpy.cli import runner
    from blis_simpy.config.loader import summary
    from blis_simpy.config.scenario import SpecWorkload, TraceWorkload
    inv = runner.prepare("validate", {}, str(path))
    if isinstance(inv.scenario.workload, SpecWorkload):   # the spec as `run` reads it
        runner.spec_workload(inv, check_only=True)
    lines = []
    if inv.scenario.variants:       # every merged variant must be valid too
        from blis_simpy.cli import variants
        lines = variants.validate_lines(inv)
    rows = ""
    if isinstance(inv.scenario.workload, TraceWorkload):
        rows = f" ({len(runner.load_trace(inv).records)} trace rows)"
    print(f"ok: {path}: {summary(inv.scenario)}{rows}")
    for line in lines:
        print(line)
    if inv.pending_plugins:
        names = ", ".join(inv.pending_plugins)
        print(f"plugins not imported: {names} ({plugin_optin.FLAG} or "
              f"{plugin_optin.ENV}=1 imports and checks them)")
        for name in dict.fromkeys(inv.unchecked):
            print(f"  not checked until they are imported: {name}")


_register_catalog(app)
_register_sweep(app)
_register_plan(app)
_register_report(app)
_register_convert(app)
_register_calibrate(app)
_register_fit(app)
_register_observe(app)


def _app_for(args: list[str]) -> typer.Typer:
    """The app to run for the command line ``args``: when they start with a sub-command's
    name, a copy of :data:`app` holding only that sub-command, so that typer builds the click
    command of that one alone (building all eleven, ~430 options, took ~9 ms of every run);
    otherwise (``--help``, ``--version``, no or an unknown command) the whole app."""
    name = args[0] if args else None
    commands = [c for c in app.registered_commands if c.name == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if not commands and not groups:
        return app
    solo = copy.copy(app)
    solo.registered_commands, solo.registered_groups = commands, groups
    return solo


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``blis-simpy`` and ``python -m blis_simpy``). Output left in
    stdout's buffer is flushed here; a write that fails anywhere, a command's or the top
    level's (``--version``, ``--help``, ``--show-completion``, bare ``blis-simpy``), ends in
    :func:`_write_failure` (exit 141 quietly; one ``error: stdout:`` line, exit 2).

    The simulator does no linear algebra, so numpy's BLAS gets one thread unless the user
    set ``OPENBLAS_NUM_THREADS``: starting its thread pool costs more CPU than importing
    numpy itself (docs/performance.md, "Start-up")."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    startup_gc.pause()   # until the scenario is prepared (cli/startup_gc.py)
    try:
        if sys.stdout is None:      # started with stdout closed (``>&-``)
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        _whole_writes()
        try:
            _app_for(sys.argv[1:] if argv is None else argv)(args=argv, prog_name="blis-simpy")
        finally:
            sys.stdout.flush()
    except (SystemExit, OSError) as exc:
        try:
            _write_failure(exc)
        except typer.Exit as stop:
            raise SystemExit(stop.exit_code) from None
        raise
