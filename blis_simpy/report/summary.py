"""The summary tables at the top of the report page (docs/planning.md, "Reports").

From what the inputs already hold, no new run:

* a ``plan --out`` document: **the answer** (winner and runner-ups: GPUs, cost, p99
  latencies, goodput; the SLOs, runs and the max-rate result under it) and **why each
  deployment failed** (every failing run: deployment, rate, seed, the planner's reason);
* a plain list of deployments: the deployments, those meeting the SLOs first, cheapest first;
* a sweep dataset: **the sweep summary**, one row per configuration, each metric the mean
  over the seeds ± half its 95 % confidence interval (Student's t, as ``sweep --summary``,
  :func:`blis_simpy.planner.dataset.summarize`).

Each table is a :class:`Table` of strings; :mod:`blis_simpy.report.html` renders it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blis_simpy.planner import dataset
from blis_simpy.report.inputs import Input
from blis_simpy.report.sweep_figures import num

__all__ = ["SWEEP_METRICS", "Table", "fmt", "summary_tables"]

#: the sweep summary's metric columns (those the dataset has) and their headers
SWEEP_METRICS = (("m.ttft_p99_ms", "TTFT p99 ms"), ("m.itl_p99_ms", "ITL p99 ms"),
                 ("m.e2e_p99_ms", "E2E p99 ms"), ("m.responses_per_sec", "req/s"),
                 ("slo.attainment_pct.all", "SLO met %"), ("slo.goodput_rps", "goodput req/s"))
MAX_TABLE_ROWS = 500     # rows of one table: the rest are counted in its note


@dataclass
class Table:
    """One summary table: ``anchor`` (HTML id), ``title``, ``header``, ``rows`` (strings;
    the columns listed in ``text_cols`` are text, the others numbers) and a ``note`` under
    it."""

    anchor: str
    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""
    text_cols: tuple[int, ...] = (0,)


def fmt(x, digits: int = 4) -> str:
    """A number for a table with at most ``digits`` significant digits below 1,000:
    ``12,345``, ``140.6``, ``0.0123``; ``-`` when absent."""
    f = num(x)
    if f is None:
        return "-"
    if abs(f) >= 1000:
        return f"{f:,.0f}"
    return f"{f:.{digits}g}"


def _d(x) -> dict:
    """``x`` when it is a mapping, else an empty one (a hand-edited document may hold
    anything where a mapping is expected)."""
    return x if isinstance(x, dict) else {}


def _l(x) -> list:
    return x if isinstance(x, list) else []


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").lower()


# ---------------------------------------------------------------------------- plans
def _cost(cost, unit: str) -> str:
    f = num(cost)
    if f is None:
        return "-"
    return f"{f:g} GPUs" if unit == "gpus" else f"{f:,.2f} USD/h"


def _slo_text(slo: dict) -> str:
    parts = [f"{k} <= {v:g}" for k, v in slo.items() if k != "min_completed_fraction"
             and num(v) is not None]
    frac = num(slo.get("min_completed_fraction"))
    if frac is not None:
        parts.append(f"completed >= {100 * frac:g}% of offered")
    return ", ".join(parts)


def _answer(inp: Input, doc: dict) -> Table:
    plan, cheapest = _d(doc.get("plan")), _d(doc.get("cheapest"))
    unit = plan.get("cost_unit", "gpus")
    picks = ([("winner", _d(cheapest["winner"]))] if cheapest.get("winner") else []) + [
        (f"runner-up {k}", _d(r)) for k, r in enumerate(_l(cheapest.get("runner_ups")), 1)]
    rows = []
    for rank, p in picks:
        m = _d(p.get("metrics"))
        rows.append([rank, str(_d(p.get("deployment")).get("label", "")), fmt(p.get("gpus")),
                     _cost(p.get("cost"), unit), fmt(m.get("ttft_p99_ms")),
                     fmt(m.get("itl_p99_ms")), fmt(m.get("e2e_p99_ms")), fmt(p.get("goodput_rps"))])
    note = [f"{plan.get('model', '')} at {fmt(_d(plan.get('workload')).get('rate'))} req/s; "
            f"SLO: {_slo_text(_d(plan.get('slo')))}; seeds {plan.get('seeds', [])}."]
    if not rows:
        note.append("No deployment met the SLOs.")
    if cheapest.get("runs") is not None:
        note.append(f"{cheapest['runs']} runs of {cheapest.get('cross_product_runs', '?')} in the "
                    f"full cross product ({cheapest.get('method', '')}).")
    mr = _d(doc.get("max_rate"))
    if _d(mr.get("deployment")):
        note.append(f"Max rate of {mr['deployment'].get('label', '')}: sustains "
                    f"{fmt(mr.get('sustained_rate'))} req/s within the SLOs (fails at "
                    f"{fmt(mr.get('failing_rate'))}).")
    return Table(f"plan-{_slug(inp.label)}", f"Plan {inp.label}: the cheapest deployments "
                 "meeting the SLOs", ["", "deployment", "GPUs", "cost", "TTFT p99 ms",
                                      "ITL p99 ms", "E2E p99 ms", "goodput req/s"],
                 rows, " ".join(note), text_cols=(0, 1))


def _failures(inp: Input, doc: dict) -> Table | None:
    rows, seen = [], set()
    for p in _l(doc.get("points")):
        if not isinstance(p, dict) or p.get("meets"):
            continue
        why = str(p.get("why_not") or p.get("error") or p.get("status") or "")
        label = str(_d(p.get("deployment")).get("label", ""))
        key = (label, str(p.get("rate")), str(p.get("seed")), why)
        if key not in seen:
            seen.add(key)
            rows.append([label, fmt(p.get("gpus")), fmt(p.get("rate")), str(p.get("seed", "")),
                         str(p.get("phase", "")), why])
    if not rows:
        return None
    n = len(rows)
    return Table(f"failed-{_slug(inp.label)}", f"Plan {inp.label}: why each deployment failed",
                 ["deployment", "GPUs", "rate req/s", "seed", "phase", "why"],
                 rows[:MAX_TABLE_ROWS], f"{n} failing run(s)" + (
                     f", the first {MAX_TABLE_ROWS} shown." if n > MAX_TABLE_ROWS else "."),
                 text_cols=(0, 4, 5))


def _deployments(inp: Input) -> Table:
    deps = sorted(inp.deployments, key=lambda d: (not d.get("meets_slo", True),
                                                  num(d.get("cost_per_hour_usd")) or math.inf,
                                                  num(d.get("gpus")) or math.inf))
    rows = [[str(d.get("label", "")), fmt(d.get("gpus")), fmt(d.get("cost_per_hour_usd")),
             fmt(d.get("ttft_p99_ms")), fmt(d.get("goodput_rps")),
             "yes" if d.get("meets_slo", True) else "no"] for d in deps[:MAX_TABLE_ROWS]]
    return Table(f"plan-{_slug(inp.label)}", f"Plan {inp.label}: deployments",
                 ["deployment", "GPUs", "cost USD/h", "TTFT p99 ms", "goodput req/s", "meets SLOs"],
                 rows, "Those meeting the SLOs first, cheapest first.", text_cols=(0, 5))


# ---------------------------------------------------------------------------- sweeps
def _cell(m: dict | None) -> str:
    if not m:
        return "-"
    lo, hi = m.get("ci95_low"), m.get("ci95_high")
    if lo is None or hi is None or hi <= lo:
        return fmt(m["mean"])
    return f"{fmt(m['mean'])} ± {fmt((hi - lo) / 2, 3)}"


def _short(axes: list[str]) -> list[str]:
    """Axis names without their dotted prefix (``workload.rate`` -> ``rate``) when that
    leaves them distinct, as ``sweep --summary`` heads its columns."""
    short = [a.rsplit(".", 1)[-1] for a in axes]
    return short if len(set(short)) == len(short) else list(axes)


def _sweep(inp: Input) -> Table | None:
    t = inp.table
    if t is None or not t.num_rows or not {"config_key", "status"} <= set(t.column_names):
        return None
    s = dataset.summarize(t)
    shown = [(c, h) for c, h in SWEEP_METRICS if c in s["metrics"]]
    rows = [[str(c["axes"].get(a)) for a in s["axes"]] + [str(c["n"])]
            + [_cell(c["metrics"].get(col)) for col, _ in shown]
            for c in s["configs"][:MAX_TABLE_ROWS]]
    return Table(f"sweep-{_slug(inp.label)}", f"Sweep {inp.label}: summary",
                 _short(s["axes"]) + ["seeds"] + [h for _, h in shown], rows,
                 f"{s['ok']} ok point(s) in {len(s['configs'])} configuration(s); cells: mean "
                 "over the seeds ± half the 95 % confidence interval (Student's t); a cell "
                 "without ± had one seed.", text_cols=tuple(range(len(s["axes"]))))


def summary_tables(inputs: list[Input]) -> list[Table]:
    """The summary tables of ``inputs`` (see the module docstring): the plans' first, then
    the sweeps', each in input order."""
    out: list[Table] = []
    for inp in sorted(inputs, key=lambda i: i.kind != "plan"):
        if inp.kind == "plan" and isinstance(inp.doc.get("cheapest"), dict):
            out.append(_answer(inp, inp.doc))
            fail = _failures(inp, inp.doc)
            if fail is not None:
                out.append(fail)
        elif inp.kind == "plan":
            out.append(_deployments(inp))
        elif inp.kind == "sweep":
            t = _sweep(inp)
            if t is not None:
                out.append(t)
    return out
