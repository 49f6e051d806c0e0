"""Scenario variants: one workload, several deployments, side by side.

A scenario may list ``variants:``, each ``{name, description?, overrides}``. ``run`` (and
``replay``) then simulates the base scenario once per variant with the variant's
``overrides`` merged over it, and ``validate`` checks every merged scenario::

    base keys ──merge patch(overrides)──► flags (the user's last word) ──► validate ──► run

* ``overrides`` is an RFC 7386 merge patch: mappings merge key by key, ``null`` removes a
  key (back to its default), anything else — scalars and lists — replaces.
* The workload is the base scenario's: ``seed``, ``workload``, ``horizon_us`` (and
  ``plugins``, ``variants``) cannot be overridden, so every variant serves the identical
  requests (checked after the runs).
* Flags apply to every variant, after its overrides.
* Errors point at the variant: ``FILE:LINE: variants[i].overrides.<key>: problem`` for a
  key the variant writes, or the variant's ``overrides`` line for a base key the merge made
  invalid (``variants[i].overrides: <key>: problem``); flag errors name the variant.

Output: ``table`` — a comparison (one row per variant), a counters comparison and each PD
variant's PD section; ``json`` — ``{command, scenario, comparison, variants: [report...]}``;
``blis`` — each variant's BLIS output after a ``=== Variant: <name> ===`` line.
``--results-path`` writes ``{variant name: results}``; ``--trace-output`` is refused.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from blis_simpy.atomic import Batch
from blis_simpy.cli import runner
from blis_simpy.cli.flags import REPLAY
from blis_simpy.config.loader import Source, dotted, load_raw, undotted
from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import BlisError, ConfigError, SimulationError
from blis_simpy.metrics.autoscale import US_PER_HOUR
from blis_simpy.metrics.report import report_dict, write_results
from blis_simpy.metrics.summary import metrics_output, replay_results, scope_output

#: top-level keys a variant cannot override: they define the (shared) workload
FIXED_KEYS = ("seed", "workload", "horizon_us", "plugins", "variants")


@dataclass
class VariantInvocation:
    index: int
    name: str
    description: str
    overrides: dict
    invocation: runner.Invocation
    file_src: Source      # the scenario file's own lines (the variant's keys included)


def merge_patch(target, patch):
    """RFC 7386: ``patch`` applied to ``target`` (neither is modified)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _source(src: Source, i: int) -> Source:
    """Lines of the merged scenario: the base's, then the variant's override keys over them."""
    pre = ("variants", i, "overrides")
    lines = {loc: n for loc, n in src.lines.items() if loc[:1] != ("variants",)}
    lines.update({loc[3:]: n for loc, n in src.lines.items() if loc[:3] == pre and len(loc) > 3})
    return Source(src.path, lines)


def _relocate(exc: BlisError, vp_index: int, name: str, src: Source) -> BlisError:
    """Point an error of a merged scenario at the variant that caused it."""
    if isinstance(exc, ConfigError):
        pre = ("variants", vp_index, "overrides")
        if exc.file == src.path and exc.field and not exc.field.startswith("--"):
            loc = undotted(exc.field)
            # the deepest written ancestor of the key decides: the variant's, or the base's
            deepest = next((src.has(pre + loc[:k]) for k in range(len(loc), 0, -1)
                            if src.has(pre + loc[:k]) or src.has(loc[:k])), False)
            if deepest:
                return ConfigError(exc.problem, file=src.path, line=src.line(pre + loc),
                                   field=dotted(pre + loc))
            return ConfigError(f"{exc.field}: {exc.problem}", file=src.path, line=src.line(pre),
                               field=dotted(pre))
        return ConfigError(f"{exc.problem} (variant {name!r})", file=exc.file, line=exc.line,
                           field=exc.field)
    exc.args = (f"{exc} (variant {name!r})",)
    return exc


def variant_invocations(base: runner.Invocation, given: dict[str, str]) -> list[VariantInvocation]:
    """Validate every variant of ``base`` (the prepared invocation of a scenario file); ``given``
    are the flags as typed (what :func:`runner.prepare` took), applied to every variant."""
    data, src = load_raw(base.src.path)
    data.pop("variants", None)
    out: list[VariantInvocation] = []
    seen: dict[str, int] = {}
    paths: dict[str, str] = {}
    for i, v in enumerate(base.scenario.variants):
        if v.name in seen:
            raise src.error(f"duplicate variant name (variants[{seen[v.name]}] has it)",
                            ("variants", i, "name"))
        seen[v.name] = i
        for key in v.overrides:
            if key in FIXED_KEYS:
                raise src.error("cannot vary: every variant runs the base scenario's workload "
                                "(seed, workload, horizon_us) and plugins",
                                ("variants", i, "overrides", key))
        vsrc = _source(src, i)
        vdata, vgiven = merge_patch(data, v.overrides), given
        if base.scenario.output.timeline:        # each variant its own timeline file
            path = variant_path(base.scenario.output.timeline, v.name)
            if path in paths:
                raise src.error(f"its timeline file would be {path}, as variant "
                                f"{paths[path]!r}'s: rename one", ("variants", i, "name"))
            paths[path] = v.name
            vdata = merge_patch(vdata, {"output": {"timeline": path}})
            if "--timeline" in given:
                vgiven = dict(given) | {"--timeline": path}
        with _named(v.name):
            try:
                inv = _prepare(base.command, vgiven, vdata, vsrc,
                                base.unchecked if base.pending_plugins else None)
            except BlisError as exc:
                raise _relocate(exc, i, v.name, src) from None
        out.append(VariantInvocation(i, v.name, v.description, v.overrides, inv, src))
    return out


def variant_path(path: str, name: str) -> str:
    """A variant's own output file: ``day.csv`` -> ``day.autoscaled.csv`` (the name's
    characters other than letters, digits, ``.``, ``-`` and ``_`` become ``_``)."""
    stem, suffix = os.path.splitext(path)
    return f"{stem}.{re.sub(r'[^A-Za-z0-9._-]', '_', name)}{suffix}"


def _prepare(command: str, given: dict, data: dict, src: Source,
             unchecked: list[str] | None = None) -> runner.Invocation:
    """:func:`runner.prepare` for an already-loaded (merged) scenario dict (``unchecked``:
    as :func:`blis_simpy.run.describe.check_components`', while the plugins are not imported)."""
    return runner.prepare_data(command, dict(given), data, src, unchecked=unchecked)


@contextmanager
def _named(name: str):
    """Prefix the log lines emitted meanwhile with ``[variant NAME]``."""
    def tag(record: logging.LogRecord) -> bool:
        if not getattr(record, "blis_variant", False):
            label = name.replace("%", "%%") if record.args else name
            record.msg = f"[variant {label}] {record.msg}"
            record.blis_variant = True
        return True
    handlers = logging.getLogger("blis_simpy").handlers
    for h in handlers:
        h.addFilter(tag)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(tag)


def execute(vps: list[VariantInvocation], run: Callable = runner.execute,
            outputs: Batch | None = None) -> list[runner.Outcome]:
    """Run every variant; check they served the same requests. With ``outputs``, each run's
    files (its timeline) are staged in that batch, to commit together."""
    outs = []
    for vp in vps:
        with _named(vp.name):
            try:
                outs.append(run(vp.invocation) if outputs is None else run(vp.invocation, outputs=outputs))
            except BlisError as exc:
                raise _relocate(exc, vp.index, vp.name, vp.file_src) from None
    sig = [_signature(o.requests) for o in outs]
    for vp, s in zip(vps, sig, strict=True):
        if s != sig[0]:
            raise SimulationError(f"variant {vp.name!r} served other requests than "
                                  f"{vps[0].name!r} (the workload must be identical)")
    return outs


def _signature(requests) -> list[tuple]:
    return [(r.id, r.arrival_us, r.input_len, r.output_len, r.prefix_group, r.prefix_length)
            for r in requests]


# ---------------------------------------------------------------------------- output
def autoscaled_bounds(s: Scenario) -> str:
    """The autoscaler's bounds: ``1 to 3``, or with prefill/decode pools ``prefill 1 to 2 +
    decode 1 to 3`` (a pool not scaled shows its size); "" without an autoscaler."""
    a, d = s.cluster.autoscaler, s.disaggregation
    if a is None:
        return ""
    if d.enabled and a.pools:
        bounds = a.pool_bounds({"prefill": d.prefill_instances, "decode": d.decode_instances})
        return " + ".join(f"{name} {b.min_instances} to {b.max_instances}"
                          if b.min_instances != b.max_instances else f"{name} {b.max_instances}"
                          for name, b in bounds.items())
    return f"{a.min_instances} to {a.max_instances}"


def deployment(s: Scenario) -> str:
    """``4 co-located``, ``2P + 2D``, ``2P + 1D + 1 idle``, with a non-``always`` decider;
    ``1 to 3 autoscaled`` with an autoscaler."""
    n, d, a = s.cluster.num_instances, s.disaggregation, s.cluster.autoscaler
    if a is not None:
        return f"{autoscaled_bounds(s)} autoscaled"
    if not d.enabled:
        return f"{n} co-located"
    text = f"{d.prefill_instances}P + {d.decode_instances}D"
    rest = n - d.prefill_instances - d.decode_instances
    if rest:
        text += f" + {rest} {'shared' if d.compat == 'checkout' else 'idle'}"
    if d.decider.policy != "always":
        text += f" ({d.decider.policy})"
    return text


def gpu_hours(out: runner.Outcome) -> float:
    """GPU-hours of a variant's run: the autoscaler's (GPUs of the instances loading, serving
    or draining, over time), else its GPUs over the run's simulated duration."""
    a = out.report.autoscaling
    if a is not None:
        return a.gpu_hours
    return out.result.gpus * out.report.cluster.sim_ended_time / US_PER_HOUR


def comparison_row(vp: VariantInvocation, out: runner.Outcome, *, with_gpu_hours: bool = False) -> dict:
    """The comparison-table values of one variant (times in ms; ``None`` where no request has
    the latency, as in the JSON document's scope objects); ``gpu_hours`` too when
    ``with_gpu_hours`` (a comparison with an autoscaled variant)."""
    r = out.report
    c = scope_output(r.cluster)
    xfer = r.pd.transfer_duration.mean / 1000 if r.pd is not None and r.pd.transfer_duration.count else None
    return {"variant": vp.name, "deployment": deployment(vp.invocation.scenario),
            "instances": vp.invocation.scenario.cluster.num_instances, "gpus": out.result.gpus,
            "completed": c["completed_requests"], "injected": c["injected_requests"],
            "throughput_rps": c["responses_per_sec"], "tokens_per_sec": c["tokens_per_sec"],
            "ttft_mean_ms": c["ttft_mean_ms"], "ttft_p50_ms": c["ttft_p50_ms"], "ttft_p99_ms": c["ttft_p99_ms"],
            "itl_mean_ms": c["itl_mean_ms"], "itl_p99_ms": c["itl_p99_ms"],
            "e2e_mean_ms": c["e2e_mean_ms"], "e2e_p99_ms": c["e2e_p99_ms"],
            "transfer_mean_ms": xfer, "cache_hit_rate": r.kv_rates[1]} | (
                {"gpu_hours": gpu_hours(out)} if with_gpu_hours else {})


def autoscaled(outs: list[runner.Outcome]) -> bool:
    """Does any variant run with an autoscaler? (Its cost is then GPU-hours, not GPUs.)"""
    return any(o.report.autoscaling is not None for o in outs)


def render(base: runner.Invocation, vps: list[VariantInvocation], outs: list[runner.Outcome], fmt: str) -> str:
    """The summary text of ``fmt`` (``table``: rich tables captured with stdout's console)."""
    if fmt == "blis":
        from blis_simpy.metrics.blis_text import render_blis
        return "".join(f"=== Variant: {vp.name} ===\n" + render_blis(o.report)
                       for vp, o in zip(vps, outs, strict=True))
    if fmt == "json":
        from blis_simpy.metrics import gojson
        doc = {"command": base.command, "scenario": base.scenario.name,
               "comparison": [comparison_row(vp, o, with_gpu_hours=autoscaled(outs))
                              for vp, o in zip(vps, outs, strict=True)],
               "variants": [{"variant": vp.name, "description": vp.description,
                             "overrides": vp.overrides, **report_dict(o.report)}
                            for vp, o in zip(vps, outs, strict=True)]}
        return gojson.dumps(doc) + "\n"
    return _tables(base, vps, outs)


#: columns of the variants table a narrow terminal leaves out, first left out first (the
#: SLO, cost and p99 columns stay longest)
DROP_ORDER = ("KV hit\nrate", "KV xfer\nmean", "tok/s", "TTFT\np50", "ITL\nmean", "E2E\nmean",
              "TTFT\nmean", "Done", "req/s", "GPUs", "Instances", "E2E\np99", "ITL\np99")
#: the same for the counters table (what went wrong stays longest)
COUNTERS_DROP_ORDER = ("Duration\n(s)", "Peak KV\nblocks", "Preemp-\ntions", "Still\nrunning",
                       "Still\nqueued", "Injected")


def slo_cells(out: runner.Outcome) -> tuple[float | None, float | None, float | None]:
    """``(attainment % of all targets, goodput req/s, cost USD/h)`` of a variant, as the run
    computed them (run/slo_cost.py; None where unknown: no SLO, no GPU price)."""
    slo, dep = out.report.slo, out.report.deployment
    cost = dep.cost_per_hour_usd if dep is not None else None
    if slo is None:
        return None, None, cost
    return slo.overall.attainment_pct()["all"], slo.overall.goodput_rps, cost


def cost_text(usd_per_hour: float | None, gpus: int) -> str:
    """``$12.00/h``, or the GPU count when the deployment has no price (as ``plan`` shows)."""
    return f"${usd_per_hour:,.2f}/h" if usd_per_hour is not None else runner.count_text(gpus, "GPU")


def verdict(vps: list[VariantInvocation], outs: list[runner.Outcome]) -> str:
    """One line: the variant meeting the SLOs (every offered request met every target) at the
    lowest cost — USD/h when every variant is priced, else GPUs (GPU-hours over the run when
    a variant is autoscaled); ties: higher goodput, then the first listed — or, when none
    meets them, the one with the highest attainment. With autoscaled variants, one more line
    each: its GPU-hours against the smallest fixed variant with at least its attainment."""
    rows = []
    by_hours = autoscaled(outs)
    for k, (vp, o) in enumerate(zip(vps, outs, strict=True)):
        att, good, cost = slo_cells(o)
        size = gpu_hours(o) if by_hours else o.result.gpus
        rows.append((vp.name, att or 0.0, good or 0.0, None if by_hours else cost, size, k))
    priced = all(r[3] is not None for r in rows)
    cost = ((lambda r: f"{r[4]:,.3f} GPU-h") if by_hours  # noqa: E731
            else (lambda r: cost_text(r[3] if priced else None, r[4])))  # noqa: E731
    line = _verdict_line(rows, priced, cost, by_hours)
    if by_hours:
        line += "".join("\n" + _against_fixed(r, rows, outs) for r in rows
                        if outs[r[5]].report.autoscaling is not None)
    return line


def _against_fixed(r: tuple, rows: list[tuple], outs: list[runner.Outcome]) -> str:
    """``autoscaled: 0.31 GPU-h at 99.6 % attainment; the smallest fixed variant with at least
    that: fixed-2, 0.53 GPU-h (1.71x)``."""
    fixed = [f for f in rows if outs[f[5]].report.autoscaling is None and f[1] >= r[1]]
    head = f"{r[0]}: {r[4]:,.3f} GPU-h at {r[1]:.1f} % attainment; "
    if not fixed:
        return head + "no fixed variant reaches that attainment."
    f = min(fixed, key=lambda x: (x[4], x[5]))
    ratio = f"{f[4] / r[4]:.2f}x" if r[4] > 0 else "-"
    return head + f"the smallest fixed variant with at least that: {f[0]}, {f[4]:,.3f} GPU-h ({ratio})."


def _verdict_line(rows: list[tuple], priced: bool, cost, by_hours: bool) -> str:

    meeting = sorted((r for r in rows if r[1] >= 100.0),
                     key=lambda r: (r[3] if priced else r[4], -r[2], r[5]))
    basis = (". Meeting the SLOs: every offered request met every target"
             + ("; cost: GPU-hours over the run (a variant is autoscaled)" if by_hours
                else "" if priced else "; cost: GPUs (no GPU price: --gpu-hour-cost)") + ".")
    if meeting:
        best = meeting[0]
        also = ", ".join(f"{r[0]} ({cost(r)})" for r in meeting[1:])
        return (f"Verdict: {best[0]} meets the SLOs at the lowest cost, {cost(best)}, goodput "
                f"{best[2]:,.2f} req/s" + (f"; also meeting them: {also}" if also else "") + basis)
    best = max(rows, key=lambda r: (r[1], r[2], -r[5]))
    return (f"Verdict: no variant meets the SLOs; closest: {best[0]}, {best[1]:.1f} % attainment, goodput "
            f"{best[2]:,.2f} req/s, {cost(best)}{basis}")


def _tables(base: runner.Invocation, vps: list[VariantInvocation], outs: list[runner.Outcome]) -> str:
    from rich import box
    from rich.table import Table

    from blis_simpy.cli.tables import Fitted, stdout_console
    from blis_simpy.metrics.tables import pd_table
    console = stdout_console()
    console.begin_capture()
    o0 = outs[0]
    clients = getattr(o0.sessions, "clients", None)
    extra = (f" sent by {runner.count_text(clients, 'closed-loop client')}" if clients is not None
             else " + session follow-ups" if o0.sessions else "")
    title = f"{base.scenario.name}: " if base.scenario.name else ""
    console.print(f"[bold]{base.command}[/bold]: {title}{runner.count_text(len(o0.requests), 'request')}{extra}, "
                  f"the same for each of {runner.count_text(len(vps), 'variant')}, "
                  f"horizon {runner.horizon_text(o0.horizon_us)}")
    f = lambda x, nd=1: "-" if x is None else f"{x:,.{nd}f}"  # noqa: E731

    def table(title: str, heads: tuple[str, ...], left: int) -> Table:
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for k, h in enumerate(heads):
            t.add_column(h, justify="left" if k < left else "right")
        return t

    with_slo = any(o.report.slo is not None for o in outs)
    by_hours = autoscaled(outs)
    slo_heads = ("SLO\nmet %", "goodput\nreq/s", "cost") if with_slo else ()
    t = table("Variants (times in ms)", ("Variant", "Instances", "GPUs", *slo_heads, "Done", "req/s", "tok/s",
              "TTFT\nmean", "TTFT\np50", "TTFT\np99", "ITL\nmean", "ITL\np99", "E2E\nmean", "E2E\np99",
              "KV xfer\nmean", "KV hit\nrate"), 2)
    for vp, o in zip(vps, outs, strict=True):
        r = comparison_row(vp, o)
        att, good, cost = slo_cells(o)
        slo = ((f(att), f(good, 2), f"{gpu_hours(o):,.3f} GPU-h" if by_hours else cost_text(cost, o.result.gpus))
               if with_slo else ())
        gpus = f"{r['gpus']:,}" if o.report.autoscaling is None else f"≤{r['gpus']:,}"
        t.add_row(vp.name, r["deployment"], gpus, *slo, f"{r['completed']:,}",
                  f(r["throughput_rps"], 2), f(r["tokens_per_sec"], 0), f(r["ttft_mean_ms"]), f(r["ttft_p50_ms"]),
                  f(r["ttft_p99_ms"]), f(r["itl_mean_ms"], 2), f(r["itl_p99_ms"], 2),
                  f(r["e2e_mean_ms"]), f(r["e2e_p99_ms"]),
                  f(r["transfer_mean_ms"]),
                  f"{r['cache_hit_rate']:.1%}")
    console.print(Fitted(t, drop=DROP_ORDER, note="--format json has them"))
    if with_slo:
        console.print(verdict(vps, outs), highlight=False)
        console.print()
    t = table("Counters", ("Variant", "Injected", "Still\nqueued", "Still\nrunning", "Timed\nout",
              "Dropped", "Rejected", "Preemp-\ntions", "Peak KV\nblocks", "Duration\n(s)"), 1)
    for vp, o in zip(vps, outs, strict=True):
        c, a = o.report.cluster, o.report.anomalies
        t.add_row(vp.name, f"{c.injected_requests:,}", f"{c.still_queued:,}", f"{c.still_running:,}",
                  f"{c.timed_out_requests:,}", f"{a.dropped_unservable:,}",
                  f"{a.rejected_requests_admission + a.rejected_requests_routing:,}",
                  f"{c.preemption_count:,}", f"{c.peak_kv_blocks:,}", f(c.sim_ended_time / 1e6, 3))
    console.print(Fitted(t, drop=COUNTERS_DROP_ORDER, note="--format json has them"))
    if any(o.report.sessions is not None for o in outs):
        t = table("Closed-loop sessions", ("Variant", "Sessions", "Completed", "Cancelled", "Cut by\nhorizon",
                  "Follow-up\nrequests"), 1)
        for vp, o in zip(vps, outs, strict=True):
            s = o.report.sessions
            if s is not None:
                t.add_row(vp.name, f"{s.sessions:,}", f"{s.completed:,}", f"{s.cancelled:,}",
                          f"{s.horizon_interrupted + s.in_flight_at_horizon:,}", f"{s.followups:,}")
        console.print(t)
    for vp, o in zip(vps, outs, strict=True):
        if o.report.pd is not None:
            console.print(pd_table(o.report.pd, title=f"Prefill/decode disaggregation: {vp.name}"))
        else:
            console.print(f"{vp.name}: no PD section (no prefill/decode pools)\n")
    return console.end_capture()


def write_results_file(vps: list[VariantInvocation], outs: list[runner.Outcome], path: str) -> None:
    """``--results-path``: ``{variant name: the results of a plain run or replay}``."""
    obj = {vp.name: (replay_results(o.report.cluster) if vp.invocation.command == REPLAY
                     else metrics_output(o.report.cluster, include_requests=True))
           for vp, o in zip(vps, outs, strict=True)}
    try:
        write_results(path, obj)
    except OSError as exc:
        raise ConfigError(f"cannot write results: {exc.strerror or exc}", file=path,
                          field="--results-path") from None


def simulate(base: runner.Invocation, given: dict[str, str], fmt: str,
             run: Callable = runner.execute) -> None:
    """``run``/``replay`` of a scenario with variants: validate all, run all, print."""
    if base.given.get("--trace-output"):
        raise ConfigError("not supported with scenario variants (each variant would export its "
                          "own timings); drop the variants or the flag", field="--trace-output")
    if base.given.get("--trace-output-decisions"):
        raise ConfigError("not supported with scenario variants (each variant has its own "
                          "decision trace); drop the variants or the flag",
                          field="--trace-output-decisions")
    vps = variant_invocations(base, given)
    outputs = Batch()      # the variants' timelines land together, or none
    try:
        outs = execute(vps, run, outputs)
        text = render(base, vps, outs, fmt)     # a summary that cannot be rendered: no file
        outputs.commit()
    finally:
        outputs.abort()
    results_path = base.given.get("--results-path")
    if results_path:
        write_results_file(vps, outs, results_path)
    sys.stdout.write(text)
    sys.stdout.flush()


def validate_lines(base: runner.Invocation) -> list[str]:
    """``validate``: one line per variant (raises on the first invalid one)."""
    out = []
    for vp in variant_invocations(base, {}):
        s = vp.invocation.scenario
        out.append(f"  variant {vp.name}: {deployment(s)}, {s.latency.model} latency, "
                   f"{s.cluster.routing.policy} routing")
    return out
