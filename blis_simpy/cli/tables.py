"""Rich tables that fit the terminal (docs/cli.md, "Tables and the terminal width").

Every table the CLI prints goes through :class:`Fitted`, either explicitly (a table with its
own order of columns to leave out) or through the console of :func:`stdout_console`, whose
render hook wraps every bare :class:`rich.table.Table` it prints (the tables built below the
CLI — ``metrics``, ``calibrate`` — included). At render time, at the width rich offers:

1. **numbers are never cut**: a numeric column (every cell starts with a digit, a sign,
   ``$``, ``≤``, or is ``-``/``n/a``) gets a ``min_width`` of its widest cell, so no cell of it
   ever wraps (so does a column its table marks ``no_wrap``); any other column a ``min_width`` of its longest word (text wraps between
   words; only a word longer than :data:`TEXT_WORD`, a path or an identifier, may fold);
   every column is at least as wide as its header's longest word (headers wrap between
   words, never cut);
2. the table as rich lays it out, when it fits (the check renders it with rich and measures
   the lines);
3. else the same with every numeric column at its minimum (headers wrap);
4. else the columns of ``drop`` are left out one by one, in that order, until it fits; then
   each left-out column that still fits comes back, the last left out first; a line under
   the table names those left out and where they are (``note``, e.g. "--format json has
   them");
5. else a vertical layout: one block of ``header: value`` lines per row.

The width: the terminal's (rich's own detection; ``$COLUMNS`` wins) when stdout is a
terminal or ``$COLUMNS`` is set, else :data:`PIPE_WIDTH` (files and pipes), so piped output
does not depend on the terminal a pipe happens to run in.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import sys
from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, RenderHook, RenderResult
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

__all__ = ["PIPE_WIDTH", "Fitted", "stdout_console"]

#: width of table output when stdout is not a terminal and $COLUMNS is unset (columns)
PIPE_WIDTH = 120

#: a numeric cell: a number first (after a sign, ``$``, ``≤``, ``~``, an opening bracket)
_NUMERIC = re.compile(r"^[\s$≤<>~+\-−(\[]*\d")
#: a word of a text column is kept whole up to this width (columns); a longer one (a path,
#: an identifier) may fold
TEXT_WORD = 20
#: cells that stand for "no number" in a numeric column
_BLANKS = {"", "-", "n/a", "–"}


def stdout_console() -> Console:
    """The console of a command's tables on stdout (width: the module docstring)."""
    columns = os.environ.get("COLUMNS", "")
    width = None if sys.stdout.isatty() or columns.isdigit() else PIPE_WIDTH
    console = Console(file=sys.stdout, width=width)
    console.push_render_hook(_FitEveryTable())
    return console


class _FitEveryTable(RenderHook):
    """Wraps every bare table printed on the console in :class:`Fitted`."""

    def process_renderables(self, renderables):
        return [Fitted(r) if isinstance(r, Table) else r for r in renderables]


class Fitted:
    """``table`` laid out for the width it is rendered at (the module docstring).

    ``drop``: headers (as given to ``add_column``) of the columns that may be left out,
    first left out first; ``note``: where the left-out columns are (ends the note line)."""

    def __init__(self, table: Table, drop: Sequence[str] = (), note: str = "") -> None:
        self.table = table
        self.drop = tuple(drop)
        self.note = note

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        for compact in (False, True):
            table = _prepared(console, self.table, compact)
            if _fits(console, options, table):
                yield table
                return
        headers = [_plain(console, c.header) for c in table.columns]
        left_out: list[str] = []
        for name in self.drop:
            if name not in headers:
                continue
            left_out.append(name)
            narrower = _without(table, left_out, headers)
            if _fits(console, options, narrower):
                for back in left_out[-2::-1]:   # what still fits comes back, the most needed first
                    wider = _without(table, [n for n in left_out if n != back], headers)
                    if _fits(console, options, wider):
                        left_out.remove(back)
                        narrower = wider
                yield narrower
                names = ", ".join(_one_line(n) for n in left_out)
                yield Text(f"left out to fit {width} columns: {names}"
                           + (f"; {self.note}" if self.note else ""), style="dim")
                return
        yield _prepared(console, _vertical(console, self.table))


# ---------------------------------------------------------------------------- internals
def _plain(console: Console, cell) -> str:
    """The text a cell shows (markup rendered as rich renders it in a table)."""
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return console.render_str(cell).plain
    return ""


def _prepared(console: Console, table: Table, compact: bool = False) -> Table:
    """A copy of ``table`` whose columns cannot cut a number (rule 1 of the module); with
    ``compact``, every numeric column is at its minimum (its header wraps at its words)."""
    out = _copy(table, table.columns)
    for col in out.columns:
        cells = [_plain(console, c) for c in col._cells]
        head = max((Text(w).cell_len for w in _plain(console, col.header).split()), default=0)
        shown = [c.strip() for c in cells if c.strip() not in _BLANKS]
        numeric = bool(shown) and all(_NUMERIC.match(c) for c in shown)
        if numeric or col.no_wrap:  # as wide as its widest cell: a number never wraps
            need = max((Text(c).cell_len for c in cells), default=0)
        else:           # whole words, up to TEXT_WORD
            need = max((_word_width(w) for c in cells for w in c.split()), default=0)
        col.overflow = "fold"
        col.no_wrap = False
        col.min_width = max(col.min_width or 0, need, head) or None
        if compact and numeric:
            col.max_width = col.min_width
    return out


def _word_width(word: str) -> int:
    return min(Text(word).cell_len, TEXT_WORD)


def _copy(table: Table, columns) -> Table:
    """A shallow copy of ``table`` with copies of ``columns`` (renumbered: rich pads a
    column by its position)."""
    out = copy.copy(table)
    out.columns = [dataclasses.replace(c, _index=i, _cells=list(c._cells)) for i, c in enumerate(columns)]
    return out


def _without(table: Table, names: list[str], headers: list[str]) -> Table:
    return _copy(table, [c for c, h in zip(table.columns, headers, strict=True) if h not in names])


def _fits(console: Console, options: ConsoleOptions, table: Table) -> bool:
    """Whether rich renders ``table`` within the width (rich draws a table wider than the
    width when its columns' minimums add up to more; the console would crop it)."""
    lines = Segment.split_lines(console.render(table, options))
    return all(Segment.get_line_length(line) <= options.max_width for line in lines)


def _one_line(header: str) -> str:
    """A header of several lines on one (``Preemp-\\ntions`` → ``Preemptions``)."""
    return header.replace("-\n", "").replace("\n", " ")


def _vertical(console: Console, table: Table) -> Table:
    """One block of ``header: value`` lines per row of ``table`` (rows split by a rule)."""
    out = Table(title=table.title, title_justify=table.title_justify, caption=table.caption,
                show_header=False, box=table.box)
    out.add_column("")
    out.add_column("")
    headers = [_one_line(_plain(console, c.header)) for c in table.columns]
    for r in range(table.row_count):
        cells = [c._cells[r] for c in table.columns]
        for k, (head, cell) in enumerate(zip(headers, cells, strict=True)):
            out.add_row(f"{head}:" if head else "", cell, end_section=k == len(cells) - 1)
    return out
