"""The report page: one self-contained HTML file next to its PNG figures.

Layout of ``--out DIR``::

    DIR/index.html           # the page
    DIR/figures/<name>.png   # every figure, also usable on its own

The page references the figures by *relative* paths (``<img src="figures/latency_cdf.png">``),
so it opens straight from disk (``file://``) with no server, and the PNGs are written once
instead of twice (base64 in the page would double the bytes and hide the files). Move the
folder as a whole. No script, no external style sheet, no font download; no timestamp, so
the same inputs give the same bytes. Every file is written to a temporary name and renamed.
The page opens with the summary tables (:mod:`blis_simpy.report.summary`: a plan's answer and
why deployments failed, a sweep's summary), then the inputs, then the figures.
"""

from __future__ import annotations

import contextlib
import os
from html import escape

from blis_simpy.atomic import Batch, atomic_write
from blis_simpy.report.figures import FigureSpec, save_png
from blis_simpy.report.inputs import Input
from blis_simpy.report.summary import Table, summary_tables

__all__ = ["PAGE", "write_report"]

PAGE = "index.html"
FIGURES = "figures"
_CSS = """body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;
text-align:left;font-size:.9em}img{max-width:100%;border:1px solid #eee}
.note{color:#555;font-size:.9em}h3{font-size:1em;margin-top:1.5em}
th.num,td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.wide{overflow-x:auto}table.summary td,table.summary th{font-size:.85em;padding:.25em .45em}code{background:#f4f4f4;padding:0 .2em}"""


def _table(t: Table) -> str:
    """One summary table: text columns left, numbers right-aligned."""
    def cell(tag: str, i: int, text: str) -> str:
        cls = "" if i in t.text_cols else ' class="num"'
        return f"<{tag}{cls}>{escape(text)}</{tag}>"
    rows = ["<tr>" + "".join(cell("th", i, h) for i, h in enumerate(t.header)) + "</tr>"]
    rows += ["<tr>" + "".join(cell("td", i, c) for i, c in enumerate(r)) + "</tr>" for r in t.rows]
    note = f'<p class="note">{escape(t.note)}</p>' if t.note else ""
    return (f'<h3 id="{escape(t.anchor)}">{escape(t.title)}</h3>\n'
            f'<div class="wide"><table class="summary">{"".join(rows)}</table></div>{note}')


def _page(inputs: list[Input], specs: list[FigureSpec]) -> str:
    made: dict[str, list[str]] = {i.path: [] for i in inputs}
    for s in specs:
        for src in s.sources:
            made.setdefault(src, []).append(s.name)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>blis-simpy report</title>", f"<style>{_CSS}</style></head><body>",
           "<h1>blis-simpy report</h1>"]
    tables = summary_tables(inputs)
    if tables:
        out.append('<h2 id="summary">Summary</h2>')
    for t in tables:
        out.append(_table(t))
    out += ["<h2>Inputs</h2>",
           "<table><tr><th>input</th><th>recognised as</th><th>figures</th></tr>"]
    for i in inputs:
        figs = ", ".join(f'<a href="#{escape(n)}">{escape(n)}</a>' for n in made[i.path]) or "none"
        out.append(f"<tr><td><code>{escape(i.path)}</code></td><td>{escape(i.describe())}</td>"
                   f"<td>{figs}</td></tr>")
    out.append("</table>")
    if not specs:
        out.append('<p class="note">These inputs have no data for any figure.</p>')
    for s in specs:
        out.append(f'<h2 id="{escape(s.name)}">{escape(s.title)}</h2>')
        out.append(f'<img src="{FIGURES}/{escape(s.name)}.png" alt="{escape(s.title)}">')
        if s.caption:
            out.append(f'<p class="note">{escape(s.caption)}</p>')
        if s.notes:
            out.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in s.notes) + "</ul>")
        out.append('<p class="note">From: ' + ", ".join(f"<code>{escape(p)}</code>"
                                                       for p in s.sources) + "</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(out_dir: str, inputs: list[Input], specs: list[FigureSpec]) -> str:
    """Write the figures and the page into ``out_dir`` (created); returns the page's path."""
    fig_dir = os.path.join(out_dir, FIGURES)
    made = [d for d in (fig_dir, out_dir) if not os.path.isdir(d)]
    os.makedirs(fig_dir, exist_ok=True)
    page = os.path.join(out_dir, PAGE)
    files = Batch()          # the page and its figures land together, or none
    try:
        for s in specs:
            save_png(s.fig, os.path.join(fig_dir, f"{s.name}.png"), batch=files)
        with atomic_write(page, batch=files, field="--out", what="cannot write the report",
                          binary=False, newline="\n") as fh:
            fh.write(_page(inputs, specs))
        files.commit()
    except BaseException:
        files.abort()
        for d in made:       # the folders this call created, left empty by the failure
            with contextlib.suppress(OSError):
                os.rmdir(d)
        raise
    return page
