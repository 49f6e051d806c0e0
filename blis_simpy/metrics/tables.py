"""The end-of-run report as rich tables for a terminal (``--format table``)."""

from __future__ import annotations

from blis_simpy.metrics.autoscale import autoscale_tables
from blis_simpy.metrics.report import PDMetrics, Report, is_idle_ratio
from blis_simpy.metrics.slo import SLOReport
from blis_simpy.metrics.summary import SCOPE_STATS, scope_output

__all__ = ["gateway_tables", "pd_table", "render_tables", "sessions_table", "slo_tables"]


def _f(x: float | None, nd: int = 2) -> str:
    """``x`` with ``nd`` decimals and thousands separators; ``-`` for None (no value)."""
    return "-" if x is None else f"{x:,.{nd}f}"


def _ms(x: float | None) -> str:
    """A latency in ms: 2 decimals below 1 s, whole ms above (so 80 columns hold an hour)."""
    return _f(x, 2 if x is None or abs(x) < 1000 else 0)


def render_tables(report: Report, console) -> None:
    """Print the report as rich tables on ``console`` (a :class:`rich.console.Console`)."""
    from rich.table import Table

    c = scope_output(report.cluster)

    summary = Table(title="Summary", title_justify="left")
    summary.add_column("Metric")
    summary.add_column("Value", justify="right")
    summary.add_row("Instances", str(report.num_instances))
    summary.add_row("Completed / injected",
                    f"{c['completed_requests']:,} / {c['injected_requests']:,}")
    summary.add_row("Simulated duration", f"{_f(c['vllm_estimated_duration_s'], 3)} s")
    summary.add_row("Throughput", f"{_f(c['responses_per_sec'])} req/s")
    summary.add_row("Output tokens/s", f"{_f(c['tokens_per_sec'])} tok/s")
    summary.add_row("Input / output tokens",
                    f"{c['total_input_tokens']:,} / {c['total_output_tokens']:,}")
    dep = report.deployment
    if dep is not None:
        summary.add_row("GPUs", f"{dep.total_gpus:,}")
        if dep.priced:
            summary.add_row("Cost", f"${_f(dep.cost_per_hour_usd)}/h "
                                    f"(${_f(dep.gpu_hour_usd, 3)} per GPU-hour)")
            per_m = dep.cost_per_million_output_tokens_usd
            summary.add_row("Cost per 1M output tokens",
                            f"${_f(per_m, 4)}" if per_m is not None else "n/a (no output)")
    sat = report.saturation
    if sat is not None and sat.saturated:     # only when it fires (docs/metrics.md, "Saturation")
        v = sat.fired                         # the whole window's test, or a window's
        where = (f" between {v.window_start_us / 1e6:.1f} and {v.window_end_us / 1e6:.1f} s"
                 if v is not sat else "")
        summary.add_row("Saturated", f"yes{where}: {_f(v.achieved_rps)} of {_f(v.offered_rps)} "
                                     f"req/s completed; backlog +{_f(v.backlog_slope_rps)} req/s")
    console.print(summary)

    lat = Table(title="Latency (ms)", title_justify="left")
    lat.add_column("Metric", no_wrap=True)
    for h in (*SCOPE_STATS, "n"):      # a narrow terminal folds a number, never cuts it
        lat.add_column(h, justify="right", overflow="fold")
    for name, key in (("TTFT", "ttft"), ("E2E", "e2e"), ("ITL", "itl"),
                      ("Sched delay", "scheduling_delay")):
        lat.add_row(name, *(_ms(c[f"{key}_{s}_ms"]) for s in SCOPE_STATS), f"{c[f'{key}_count']:,}")
    console.print(lat)

    if report.slo is not None:
        for t in slo_tables(report.slo):
            console.print(t)

    a = report.anomalies
    cnt = Table(title="Counters", title_justify="left")
    cnt.add_column("Counter")
    cnt.add_column("Value", justify="right")
    rows = [("Still queued", c["still_queued"]), ("Still running", c["still_running"])]
    acc = report.request_accounting
    if acc is not None:     # the rest of the unfinished requests (the balance of the run)
        rows += [("Still in control plane", acc["still_in_control_plane"]),
                 ("Still in queueing delay", acc["still_in_queueing_delay"])]
        if acc["not_arrived"]:
            rows.append(("Not arrived (after the horizon)", acc["not_arrived"]))
    rows += [("Timed out", c["timed_out_requests"]), ("Preemptions", c["preemption_count"]),
             ("KV allocation failures", report.cluster.kv_allocation_failures),
             ("Dropped unservable", a.dropped_unservable),
             ("Length-capped", a.length_capped_requests),
             ("Rejected (admission)", a.rejected_requests_admission)]
    rows += [(f"  shed ({k})", a.shed_by_tier[k]) for k in sorted(a.shed_by_tier)]
    rows += [("Rejected (routing)", a.rejected_requests_routing),
             ("Priority inversions", a.priority_inversions),
             ("HOL blocking events", a.hol_blocking_events)]
    if a.dropped_kv_allocations:
        rows.append(("Dropped KV allocations", a.dropped_kv_allocations))
    for label, v in rows:
        cnt.add_row(label, f"{v:,}")
    console.print(cnt)

    pr, hit, thr = report.kv_rates
    kv = Table(title="KV cache", title_justify="left")
    kv.add_column("Metric")
    kv.add_column("Value", justify="right")
    kv.add_row("Preemption rate", f"{pr:.4f}")
    kv.add_row("Cache hit rate", f"{hit:.2%}")
    kv.add_row("KV thrashing rate", f"{thr:.2%}")
    kv.add_row("Peak KV blocks", f"{report.cluster.peak_kv_blocks:,}")
    console.print(kv)

    if len(report.per_slo) > 1:
        t = Table(title="Per SLO class (ms)", title_justify="left")
        for h in ("Class", "n", "TTFT mean", "TTFT p99", "E2E mean", "E2E p99"):
            t.add_column(h, justify="left" if h == "Class" else "right")
        for cls, s in report.per_slo.items():
            t.add_row(cls, f"{s.e2e.count:,}", _f(s.ttft.mean / 1000, 3), _f(s.ttft.p99 / 1000, 3),
                      _f(s.e2e.mean / 1000, 3), _f(s.e2e.p99 / 1000, 3))
        console.print(t)

    if report.per_model:
        t = Table(title="Per model", title_justify="left")
        for h in ("Model", "n", "TTFT p50 (ms)", "TTFT p99 (ms)", "E2E p50 (ms)", "E2E p99 (ms)",
                  "req/s", "tok/s"):
            t.add_column(h, justify="left" if h == "Model" else "right")
        for mdl, s in report.per_model.items():
            t.add_row(mdl, f"{s.e2e.count:,}", _f(s.ttft.p50 / 1000, 3), _f(s.ttft.p99 / 1000, 3),
                      _f(s.e2e.p50 / 1000, 3), _f(s.e2e.p99 / 1000, 3), _f(s.throughput_rps),
                      _f(s.tokens_per_sec))
        console.print(t)

    if report.pd is not None:
        console.print(pd_table(report.pd))

    if report.trace_summary is not None:
        ts = report.trace_summary
        t = Table(title="Decision trace", title_justify="left")
        t.add_column("Metric")
        t.add_column("Value", justify="right")
        t.add_row("Decisions (admitted / rejected)",
                  f"{ts.total_decisions:,} ({ts.admitted_count:,} / {ts.rejected_count:,})")
        pools = ts.pool_target_distribution      # PD: the pools' routing, apart
        t.add_row("Unique targets", f"{ts.targets_any_routing:,}")
        for k in sorted(ts.target_distribution):
            t.add_row(f"  {k}", f"{ts.target_distribution[k]:,}")
        for pool, dist in pools.items():
            t.add_row(f"{pool.capitalize()} pool targets", f"{len(dist):,}")
            for k in sorted(dist):
                t.add_row(f"  {k}", f"{dist[k]:,}")
        t.add_row("Mean / max regret", f"{ts.mean_regret:.6f} / {ts.max_regret:.6f}")
        console.print(t)

    if report.sessions is not None:
        console.print(sessions_table(report.sessions))

    if report.gateway is not None:
        for t in gateway_tables(report.gateway):
            console.print(t)
    if report.autoscaling is not None:
        for t in autoscale_tables(report.autoscaling):
            console.print(t)

    if report.fitness is not None:
        t = Table(title="Fitness", title_justify="left")
        t.add_column("Component")
        t.add_column("Value", justify="right")
        for k in sorted(report.fitness.components):
            t.add_row(k, f"{report.fitness.components[k]:.6f}")
        t.add_row("score", f"{report.fitness.score:.6f}")
        console.print(t)

    if report.cluster.streaming is not None:     # --streaming-metrics
        from blis_simpy.metrics.streaming import accuracy_note
        console.print(accuracy_note(), highlight=False, soft_wrap=True)


def sessions_table(s, title: str = "Closed-loop sessions"):
    """How the sessions ended (:class:`~blis_simpy.workload.sessions.SessionCounters`)."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    t.add_column("Sessions")
    t.add_column("n", justify="right")
    for label, v in (("Total", s.sessions), ("Completed", s.completed),
                     ("Cancelled (timeout)", s.cancelled_timeout), ("Cancelled (dropped)", s.cancelled_dropped),
                     ("Cancelled (rejected)", s.cancelled_rejected),
                     ("Cut by the horizon (next round)", s.horizon_interrupted),
                     ("Cut by the horizon (round in flight)", s.in_flight_at_horizon),
                     ("Follow-up requests", s.followups)):
        t.add_row(label, f"{v:,}")
    return t


def gateway_tables(g) -> list:
    """The gateway queue (:class:`~blis_simpy.metrics.gateway.GatewayReport`): counts, wait and
    depth; then one row per flow with Jain's fairness index (docs/metrics.md, "Gateway queue")."""
    from rich.table import Table

    t = Table(title="Gateway queue", title_justify="left")
    t.add_column("Metric")
    t.add_column("Value", justify="right")
    t.add_row("Entered / sent on", f"{g.entered:,} / {g.dispatched:,}")
    t.add_row("Shed", f"{g.shed:,}")
    for k in sorted(g.shed_by_reason):
        t.add_row(f"  {k.replace('_', ' ')}", f"{g.shed_by_reason[k]:,}")
    t.add_row("Still queued", f"{g.still_queued:,}")
    t.add_row("Peak depth", f"{g.peak_depth:,}")
    w = g.wait
    t.add_row("Queue wait mean / p99", "-" if not w.count else
              f"{_ms(w.mean / 1000)} / {_ms(w.p99 / 1000)} ms")
    t.add_row("Jain's fairness index", "-" if g.jain_index is None else f"{g.jain_index:.4f}")
    f = Table(title=f"Gateway queue per {g.flow_key.replace('_', ' ')}", title_justify="left")
    for h in ("Flow", "weight", "arrived", "shed", "completed", "req/s", "req/s / weight",
              "wait mean (ms)", "SLO attainment"):
        f.add_column(h, justify="left" if h == "Flow" else "right")
    for name, r in g.flows.items():
        f.add_row(name, f"{r.weight:g}", f"{r.arrived:,}", f"{r.shed:,}", f"{r.completed:,}",
                  _f(r.throughput_rps, 3), _f(r.normalised_throughput, 3), _ms(r.mean_wait_us / 1000),
                  _pct(r.slo_attainment_pct))
    return [t, f]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}%"


def _target(x: float | None) -> str:
    return "-" if x is None else f"≤ {x:g} ms"


def slo_tables(slo: SLOReport) -> list:
    """The SLO section (docs/metrics.md, "SLOs and goodput"): each target, the requests meeting
    it and the attainment over the offered requests, and goodput; then one row per SLO class
    when there are several classes or a class has its own targets."""
    from rich.table import Table

    o = slo.overall
    t = Table(title=f"SLOs (attainment over {o.offered:,} offered requests)", title_justify="left")
    for h in ("Metric", "Target", "Met", "Attainment"):
        t.add_column(h, justify="left" if h == "Metric" else "right")
    att = o.attainment_pct()
    for k, (name, key) in enumerate((("TTFT", "ttft"), ("ITL (request mean)", "itl"),
                                     ("E2E", "e2e"), ("All targets", "all"))):
        target = _target(o.targets.as_tuple()[k]) if k < 3 else ""
        t.add_row(name, target, "-" if att[key] is None else f"{o.met[k]:,}", _pct(att[key]))
    t.add_row("Goodput", "", "", f"{_f(o.goodput_rps, 3)} req/s")
    out = [t]
    if len(slo.per_class) > 1 or any(s.targets != o.targets for s in slo.per_class.values()):
        c = Table(title="SLOs per class (attainment %)", title_justify="left")
        for h in ("Class", "offered", "TTFT", "ITL", "E2E", "all", "goodput req/s"):
            c.add_column(h, justify="left" if h == "Class" else "right")
        for name, s in slo.per_class.items():
            a = s.attainment_pct()
            c.add_row(name, f"{s.offered:,}", *(_pct(a[k]) for k in ("ttft", "itl", "e2e", "all")),
                      _f(s.goodput_rps, 3))
        out.append(c)
    return out


def pd_table(pd: PDMetrics, title: str = "Prefill/decode disaggregation"):
    """The PD section (docs/disaggregation.md, "PD metrics") as a rich table."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    t.add_column("Metric")
    t.add_column("Value", justify="right")
    t.add_row("Disaggregated requests", f"{pd.disaggregated_count:,}")
    t.add_row("Dropped at decode KV", f"{pd.dropped_at_decode_kv:,}")
    t.add_row("Prefill throughput", f"{pd.prefill_throughput:.4f} sub-req/s")
    t.add_row("Decode throughput", f"{pd.decode_throughput:.4f} sub-req/s")
    r = pd.load_imbalance_ratio
    t.add_row("Load imbalance ratio", "inf (one pool idle)" if is_idle_ratio(r) else f"{r:.4f}")
    if pd.parent_ttft.count:
        t.add_row("Parent TTFT p50 / p99", f"{_f(pd.parent_ttft.p50 / 1000, 3)} / "
                  f"{_f(pd.parent_ttft.p99 / 1000, 3)} ms")
    if pd.transfer_duration.count:
        t.add_row("KV transfer p50 / p99", f"{_f(pd.transfer_duration.p50 / 1000, 3)} / "
                  f"{_f(pd.transfer_duration.p99 / 1000, 3)} ms")
    if pd.contention:
        t.add_row("Peak concurrent transfers", f"{pd.peak_concurrent_transfers:,}")
        t.add_row("Mean transfer queue depth", f"{pd.mean_transfer_queue_depth:.4f}")
    return t
