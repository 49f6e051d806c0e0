"""Typer options built from the flag table (:mod:`blis_simpy.cli.flags`), shared by every
command that takes BLIS's simulation flags (``run``, ``replay``, ``calibrate``, ``fit``)."""

from __future__ import annotations

import inspect

import typer

from blis_simpy.cli import flags as F


def flag_parameters(command: str, skip: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """One keyword-only parameter per flag of ``command`` (booleans as ``--x/--no-x``), in
    table order, leaving out the flag names in ``skip``. Every default is None (= not given)."""
    params = []
    for f in F.flags_for(command):
        if f.name in skip:
            continue
        if f.boolean:
            opt = typer.Option(None, f"{f.name}/--no-{f.name[2:]}", help=f.help, show_default=False,
                               rich_help_panel=f.panel)
            params.append(inspect.Parameter(f.dest, inspect.Parameter.KEYWORD_ONLY,
                                            annotation=bool | None, default=opt))
            continue
        opt = typer.Option(None, f.name, help=f.help, metavar=f.metavar, show_default=False,
                           rich_help_panel=f.panel)
        params.append(inspect.Parameter(f.dest, inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                                        default=opt))
    return params


def given_flags(command: str, raw: dict) -> dict:
    """Flag name → value for the flags of ``command`` the user gave (``raw``: by dest)."""
    return {f.name: raw[f.dest] for f in F.flags_for(command) if raw.get(f.dest) is not None}
