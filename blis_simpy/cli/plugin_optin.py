"""The opt-in to a scenario's plugin code (docs/extending.md, "Loading plugins").

A scenario's ``plugins:`` list names Python modules that are imported, i.e. run: reading a
scenario must not run code its author chose, unless the user who runs the command says so.
The opt-in is the flag ``--allow-plugins`` (``run``, ``replay``, ``validate``, ``sweep``,
``plan``, ``calibrate``, ``fit``) or the environment variable ``BLIS_SIMPY_ALLOW_PLUGINS=1``.
Without it, ``validate`` imports nothing, lists the modules it would import and checks the
rest; every other command refuses the scenario with one line naming the modules and the
opt-in (exit 2). Entry-point plugins (``blis_simpy.plugins``), installed in the environment
by its user, need no opt-in.

Sweep and plan points run in Dask workers: the opt-in travels with each job
(:func:`blis_simpy.run.point.run_point`'s ``allow_plugins``), never through this process's
state.
"""

from __future__ import annotations

import os

import typer

__all__ = ["ENV", "FLAG", "allowed", "option", "refusal", "set_given"]

#: the flag and the environment variable that allow a scenario's plugin modules to be imported
FLAG = "--allow-plugins"
ENV = "BLIS_SIMPY_ALLOW_PLUGINS"

_given = False


def set_given(flag: bool) -> None:
    """Record whether the running command was given :data:`FLAG` (every command that reads
    a scenario calls this first, so a previous command's choice never carries over)."""
    global _given
    _given = bool(flag)


def allowed() -> bool:
    """The flag was given, or the environment variable is ``1`` (``true``/``yes`` too)."""
    return _given or os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes")


def refusal(modules: list[str]) -> str:
    """The problem text when ``modules`` would be imported without the opt-in."""
    names = ", ".join(repr(m) for m in modules)
    word = "module" if len(modules) == 1 else "modules"
    return (f"would import the plugin {word} {names} (code that runs): pass {FLAG} or set "
            f"{ENV}=1 to allow it")


def option():
    """The ``--allow-plugins`` option of a typer command."""
    return typer.Option(False, FLAG, help=f"import the scenario's plugins: modules (their code runs); "
                                          f"or set {ENV}=1")
