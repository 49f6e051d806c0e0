"""Rendering a :class:`~blis_simpy.calibrate.compare.Comparison` or an
:class:`~blis_simpy.calibrate.aggregate.AggregateComparison`: rich tables, the three-number
score, a JSON document, and the running/waiting/KV timelines side by side."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from blis_simpy.calibrate.aggregate import AggregateComparison
from blis_simpy.calibrate.compare import LABELS, STATS, Comparison, Score
from blis_simpy.calibrate.twin import Sample
from blis_simpy.measured.run import AGG_STATS, Tick


def _e(v: float) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{v:+.1f}%"


def _ms(v: float) -> str:
    return f"{v:,.1f}"


def render(console: Console, c: Comparison, title: str = "") -> None:
    """Two rows per metric: the real values, then the sim values with their signed errors."""
    t = Table(title=title or f"calibrate: {c.run} (ms)", title_justify="left")
    t.add_column("metric")
    t.add_column("", justify="left")
    t.add_column("n", justify="right")
    for s in STATS:
        t.add_column(s, justify="right")
    t.add_column("MAPE", justify="right")
    for r in c.rows:
        t.add_row(LABELS[r.metric], "real", str(r.n), *(_ms(r.real[s]) for s in STATS), "")
        t.add_row("", "sim", "", *(f"{_ms(r.sim[s])} ({_e(r.err_pct[s])})" for s in STATS),
                  f"{r.mape_pct:.1f}%", end_section=True)
    console.print(t)
    d = c.to_dict()["throughput_tps"]
    skipped = (f" ({c.not_replayed} request(s) without a measured latency, e.g. failed, not replayed)"
               if c.not_replayed else "")
    console.print(f"completed: real {c.completed_real}/{c.offered}, sim {c.completed_sim}/{c.offered}{skipped}; "
                  f"output throughput: real {d['real']:,.1f} tok/s, sim {d['sim']:,.1f} tok/s "
                  f"({_e(d['error_pct'])}); sim KV hit rate {c.cache_hit_rate_sim:.3f}, "
                  f"sim preemptions {c.preemptions_sim}", highlight=False)
    if c.score is not None:
        console.print(score_line(c.score), highlight=False)


def score_line(sc: Score) -> str:
    """The three-number score on one line."""
    parts = [f"{label} {sc.real[m]:,.2f} → {sc.sim[m]:,.2f} ms ({sc.err_pct[m]:.1f}%)"
             for m, label in (("e2e", "E2E"), ("ttft", "TTFT"), ("itl", "ITL"))]
    return f"score (mean, real → sim, |error|): {', '.join(parts)}; avg3 {sc.avg3_pct:.1f}%"


def render_aggregate(console: Console, c: AggregateComparison) -> None:
    """Per stage, then the whole run: two rows per metric (real, then sim with its signed
    error), the success/failure counts, and the three-number score."""
    t = Table(title=f"calibrate: {c.run} (ms, measured at the client; per stage and whole run)",
              title_justify="left")
    for col, just in (("scope", "left"), ("metric", "left"), ("", "left")) + tuple((s, "right") for s in AGG_STATS):
        t.add_column(col, justify=just)
    scopes = list(zip(c.stages, c.sim.stages, strict=True)) + [(c.total, None)]
    for sc, win in scopes:
        name = f"stage {sc.stage} ({win.rate_rps:g} req/s)" if win is not None else "whole run"
        counts = f"ok {sc.real_ok}/{sc.sim_ok}, failed {sc.real_failed}/{sc.sim_failed} (real/sim)"
        for i, r in enumerate(sc.rows):
            real = [_ms(r.real[s]) if r.real and not math.isnan(r.real[s]) else "-" for s in AGG_STATS]
            sim = [f"{_ms(r.sim[s])} ({_e(r.err_pct[s])})" if r.sim else "-" for s in AGG_STATS]
            t.add_row(name if i == 0 else "", LABELS[r.metric], "real", *real)
            t.add_row(counts if i == 0 else "", "", "sim", *sim, end_section=i == len(sc.rows) - 1)
        if not sc.rows:
            t.add_row(name, counts, "", *("-" for _ in AGG_STATS), end_section=True)
    console.print(t)
    for sc, win in scopes:
        if sc.score is not None:
            where = f"stage {sc.stage}" if win is not None else "whole run"
            console.print(f"{where}: {score_line(sc.score)}", highlight=False)


def paired_timeline(ticks: list[Tick], samples: list[Sample]) -> list[dict]:
    """Per real tick, the sim sample at the same instant (the latest at or before it). A KV
    column that reads 0 at every tick although requests ran is taken as not recorded (the
    RTX PRO 6000 log's gauge is all zeros): its real values become None."""
    kv_recorded = any(tk.kv_cache_pct for tk in ticks) or not any(tk.running for tk in ticks)
    rows = []
    j = 0
    for tk in ticks:
        while j + 1 < len(samples) and samples[j + 1].t_s <= tk.t_s:
            j += 1
        s = samples[j] if samples and samples[j].t_s <= tk.t_s else None
        rows.append({"t_s": tk.t_s, "real_running": tk.running, "real_waiting": tk.waiting,
                     "real_kv_pct": tk.kv_cache_pct if kv_recorded else None,
                     "sim_running": s.running if s else None, "sim_waiting": s.waiting if s else None,
                     "sim_kv_pct": round(s.kv_cache_pct, 2) if s else None})
    return rows


def render_timeline(console: Console, rows: list[dict], every: int = 0) -> None:
    """The timelines side by side, one row per ``every`` ticks (default: ~20 rows)."""
    if not rows:
        return
    every = every or max(1, len(rows) // 20)
    t = Table(title="timeline (real vs sim)", title_justify="left")
    for col in ("t (s)", "running real", "sim", "waiting real", "sim", "KV % real", "sim"):
        t.add_column(col, justify="right")
    f = lambda v: "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))  # noqa: E731
    for r in rows[::every]:
        t.add_row(f(r["t_s"]), f(r["real_running"]), f(r["sim_running"]), f(r["real_waiting"]),
                  f(r["sim_waiting"]), f(r["real_kv_pct"]), f(r["sim_kv_pct"]))
    console.print(t)


def timeline_errors(rows: list[dict]) -> dict[str, float]:
    """Mean absolute difference sim − real over the paired ticks (requests; KV in points)."""
    out = {}
    for key in ("running", "waiting", "kv_pct"):
        d = [abs(r[f"sim_{key}"] - r[f"real_{key}"]) for r in rows
             if r[f"sim_{key}"] is not None and r[f"real_{key}"] is not None]
        out[f"{key}_mean_abs_diff"] = sum(d) / len(d) if d else float("nan")
    return out


def clean(o):
    """JSON-safe: NaN/inf → None (json.dumps would write invalid JSON)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [clean(v) for v in o]
    return o
