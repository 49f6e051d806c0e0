"""Usage errors as one line, and help that reads well in a narrow terminal (docs/cli.md).

* :func:`usage_line` turns click's usage errors (an unknown flag, a bad ``--format`` value,
  a flag without its value, an unknown sub-command, a missing argument) into the one line
  every bad input prints: ``--flag: problem`` (the caller adds ``error: ``).
* :func:`prepare_help` runs when a command's help is about to be shown: the flags that name a
  registered policy (``--latency-model``, ``--routing-policy``, ``--scheduler``,
  ``--priority-policy``, ``--admission-policy``, ``--pd-decider``, ...) get the names
  registered now appended to their help (plugins loaded by a scenario's ``plugins:`` or
  the entry points register more, so the value is still checked by the flag table's
  rule, not by click); and below :data:`NARROW_COLUMNS` columns the help is click's plain
  layout, grouped by the same panels, instead of rich's boxed tables.

Only typer (and, for a simulation command's help, the policy registries) is loaded here.
"""

from __future__ import annotations

import re
import shutil
import textwrap

from typer._click import exceptions as click_exc
from typer.core import TyperArgument

from blis_simpy.cli import flags as F
from blis_simpy.errors import did_you_mean

#: below this terminal width, help is click's plain layout (rich's boxes leave the flag
#: descriptions a dozen characters wide at 80 columns)
NARROW_COLUMNS = 100


# ---------------------------------------------------------------------------- errors
def _param_name(param) -> str | None:
    if param is None:
        return None
    opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
    if isinstance(param, TyperArgument) or not opts:
        return param.metavar or param.name
    return max(opts, key=len)


def _clean(message: str) -> str:
    """Click's message without its capital, final period and pydantic's prefix."""
    m = " ".join(message.split())
    m = m.removeprefix("Value error, ")
    return m[:1].lower() + m[1:].rstrip(".") if m else m


def usage_line(exc: click_exc.UsageError, command_path: str | None = None) -> str:
    """``--flag: problem`` for a click usage error (the ``error: `` prefix is the caller's)."""
    ctx = getattr(exc, "ctx", None)
    path = command_path or (ctx.command_path if ctx is not None else "blis-simpy")
    hint = f"; see '{path} --help'"
    if isinstance(exc, UnknownCommand):
        return f"{exc.name}: no such command; commands: {', '.join(exc.choices)}"
    if isinstance(exc, click_exc.NoSuchOption):
        did = did_you_mean(exc.option_name, exc.possibilities or (), cutoff=0.75)
        return f"{exc.option_name}: no such option{did}{hint}"
    if isinstance(exc, click_exc.BadOptionUsage):
        problem = _clean(exc.message)
        if "requires an argument" in problem:
            problem = "needs a value"
        return f"{exc.option_name}: {problem}"
    if isinstance(exc, click_exc.MissingParameter):
        name = _param_name(exc.param) or "argument"
        return f"{name}: missing{hint}"
    if isinstance(exc, click_exc.BadParameter):
        name = _param_name(exc.param)
        if name is None and exc.param_hint:
            name = exc.param_hint if isinstance(exc.param_hint, str) else exc.param_hint[0]
        problem = _clean(exc.message)
        return f"{name}: {problem}" if name else problem
    problem = _clean(exc.format_message())
    extra = re.fullmatch(r"got unexpected extra argument(?:s|\(s\))? \((.*)\)", problem)
    if extra:
        return f"{extra[1]}: unexpected argument{hint}"
    return f"{problem}{hint}"


class UnknownCommand(click_exc.UsageError):
    """``blis-simpy frob``: the name and the commands there are."""

    def __init__(self, name: str, choices: list[str], ctx=None):
        super().__init__(f"no such command {name!r}", ctx)
        self.name = name
        self.choices = choices


# ---------------------------------------------------------------------------- help
def registry_names(family: str) -> list[str]:
    """The names registered now in a policy family (``latency``, ``routing``, ``decider``, ...)."""
    from blis_simpy.cli.flag_values import families
    return families()[family].names()


def prepare_help(cmd) -> None:
    """Before ``cmd``'s help is shown: registered names into the choice flags' help, and the
    plain layout in a narrow terminal."""
    for p in getattr(cmd, "params", ()):
        flag = next((F.BY_NAME[o] for o in getattr(p, "opts", ()) if o in F.BY_NAME), None)
        if flag is not None and p.help != flag.help and not getattr(p, "_blis_names", False):
            flag = None     # a command's own flag of the same name (sweep/plan --scheduler: Dask)
        family = getattr(flag.rule, "family", None) if flag is not None else None
        if family and not getattr(p, "_blis_names", False):
            names = registry_names(family)
            p.help = f"{flag.help}; one of: {', '.join(names)}, or a plugin's name"
            p._blis_names = True
    if shutil.get_terminal_size().columns < NARROW_COLUMNS:
        cmd.rich_markup_mode = None
        if getattr(cmd, "params", None) and any(getattr(p, "rich_help_panel", None) for p in cmd.params):
            cmd.format_options = _panelled_options.__get__(cmd)


class _Wrapper(textwrap.TextWrapper):
    """Lines break at spaces and after a comma (``a:3,b:2`` as ``a:3,`` / ``b:2``), never
    inside a word nor at a hyphen (``round-robin``, ``kv-utilization:2`` stay whole)."""

    def __init__(self, width: int):
        super().__init__(width, break_long_words=False, break_on_hyphens=False)

    def _split(self, text: str) -> list[str]:
        return [piece for chunk in super()._split(text) for piece in re.split(r"(?<=,)(?=\S)", chunk)
                if piece]


def _panelled_options(cmd, ctx, formatter) -> None:
    """Click's plain option list, one section per rich help panel (in first-seen order),
    one column width for all; lines break only between words or after a comma (_Wrapper)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    for p in cmd.get_params(ctx):
        rec = p.get_help_record(ctx)
        if rec is None:
            continue
        panel = getattr(p, "rich_help_panel", None) or ("Arguments" if p.param_type_name == "argument"
                                                        else "Options")
        sections.setdefault(panel, []).append(rec)
    rows = [r for rs in sections.values() for r in rs]
    first = min(max(len(r[0]) for r in rows), 30) if rows else 0
    wrap = _Wrapper(max(formatter.width - first - 4, 30)).wrap
    for name, recs in sections.items():
        with formatter.section(name):
            for opt, text in recs:
                lines = wrap(text) or [""]
                if len(opt) <= first:
                    formatter.write(f"{'':>{formatter.current_indent}}{opt:<{first}}  {lines[0]}\n")
                    lines = lines[1:]
                else:
                    formatter.write(f"{'':>{formatter.current_indent}}{opt}\n")
                for line in lines:
                    formatter.write(f"{'':>{formatter.current_indent + first + 2}}{line}\n")
