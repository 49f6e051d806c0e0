"""The ``"autoscaling"`` section of a run with an autoscaler (docs/metrics.md, "Autoscaling").

* ``instance_count``: ``{t_us, pool, serving, loading, draining}`` after every change (the
  first at 0);
* ``gpu_hours``: Σ over the instances of TP × DP × the time each was loading, serving or
  draining (from the decision that started it, or 0, to when it turned off or the run ended),
  in hours; ``cost_usd`` = ``gpu_hours`` × USD per GPU-hour (``cost.gpu_hour_usd``, else the
  GPU catalog's price; None when unknown);
* ``mean_instances``: GPU-hours over the run's length in GPU-hours of one instance;
* ``intervals``: one row per decision interval ``[start_us, end_us)`` — ``instances`` chosen
  at its start, requests ``arrived`` in it, those of them ``completed`` and ``met`` (every SLO
  target), ``attainment_pct`` = 100 · met / arrived (None without an SLO target, or when no
  per-request data is kept: ``--streaming-metrics``).

With prefill/decode pools (more than one pool) the counts are summed over the pools, and
``instance_count`` has one row per pool (``pool``: ``prefill``, ``decode``) after every change
of that pool; ``pools`` lists each pool's set-up, ``gpu_hours`` and ``peak_instances``; each
interval adds ``instances_by_pool``; ``gpus_per_instance`` is 0 when the pools' differ (then
``mean_instances`` is the instance-time over the run's length), and ``loading_delay_us`` is 0
when the pools' loading delays differ. Without pools neither
``pools`` nor ``instances_by_pool`` is present.

Times in µs. Built from the autoscaler's record
(:class:`~blis_simpy.cluster.autoscaler.AutoscaleRecord`, duck-typed here).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields

__all__ = ["TABLE_INTERVALS", "US_PER_HOUR", "AutoscaleReport", "AutoscaleSetup", "autoscale_report", "autoscale_tables"]

US_PER_HOUR = 3_600_000_000


@dataclass
class AutoscaleSetup:
    """How the autoscaler was set up: its policy's name, the decision interval and loading
    delay (µs), the bounds, and the GPUs of one instance (TP × DP)."""

    policy: str
    interval_us: int
    loading_delay_us: int
    min_instances: int
    max_instances: int
    gpus_per_instance: int

    def setup(self) -> dict:
        """The set-up fields, by name."""
        return {f.name: getattr(self, f.name) for f in fields(AutoscaleSetup)}


@dataclass
class AutoscaleReport(AutoscaleSetup):
    gpu_hours: float
    gpu_hour_usd: float | None
    cost_usd: float | None
    scale_ups: int
    scale_downs: int
    peak_instances: int
    mean_instances: float
    instance_count: list[dict] = field(default_factory=list)
    intervals: list[dict] = field(default_factory=list)
    #: with several pools: each pool's set-up, GPU-hours and peak (absent from the JSON otherwise)
    pools: list[dict] | None = None

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.pools is None:
            del out["pools"]
        return out


def autoscale_report(record, arrived_total: int, done: Iterable[tuple[int, bool]] | None, *,
                     judged: bool, gpu_hour_usd: float | None,
                     pool_prices: dict[str, float | None] | None = None) -> AutoscaleReport:
    """The section from the autoscaler's ``record``, the requests ``arrived_total`` by the end,
    and ``done``: ``(arrival_us, met every SLO target)`` of each completed request (None: not
    kept). ``judged``: an SLO target is set. ``gpu_hour_usd``: the price, or None;
    ``pool_prices``: with several pools and no single price, each pool's (None: unknown) —
    the cost is then their sum (None if one is unknown) and ``gpu_hour_usd`` the common price
    (None when they differ)."""
    iv = record.interval_us
    end = record.end_us
    gpu_us = record.gpu_us
    gpu_hours = gpu_us / US_PER_HOUR
    pooled = bool(record.pools)
    if pooled:
        counts = [{"t_us": t, "pool": name, "serving": s, "loading": lo, "draining": dr}
                  for t, name, s, lo, dr in record.pool_changes]
    else:
        counts = [{"t_us": t, "pool": "", "serving": s, "loading": lo, "draining": dr}
                  for t, s, lo, dr in record.changes]
    peak = max((s + lo + dr for _, s, lo, dr in record.changes), default=0)
    if record.gpus_per_instance:
        per_instance_us = end * record.gpus_per_instance
        mean = gpu_us / per_instance_us if per_instance_us > 0 else 0.0
    else:      # pools of different GPUs per instance: instance-time over the run's length
        mean = (sum(e - s for _, s, _, e in record.spans) / end) if end > 0 else 0.0
    # the intervals: [0, I), [I, 2I), ... up to the last decision, then [K·I, end]
    initial = record.changes[0][1] + record.changes[0][2] if record.changes else 0
    starts = [(0, initial, 0)] + list(record.decisions)
    by_pool = ([{p["name"]: p["initial_instances"] for p in record.pools}]
               + [chosen for _, chosen in record.pool_decisions]) if pooled else None
    n = len(starts)
    completed = [0] * n
    met = [0] * n
    if done is not None:
        for arrival_us, ok in done:
            k = min(arrival_us // iv, n - 1) if iv > 0 else 0
            completed[k] += 1
            met[k] += ok
    rows = []
    for k, (t, chosen, arrived_before) in enumerate(starts):
        nxt_arrived = starts[k + 1][2] if k + 1 < n else arrived_total
        arrived = nxt_arrived - arrived_before
        row = {
            "start_us": t, "end_us": starts[k + 1][0] if k + 1 < n else max(end, t),
            "instances": chosen, "arrived": arrived,
            "completed": completed[k] if done is not None else None,
            "met": met[k] if done is not None and judged else None,
            "attainment_pct": (100.0 * met[k] / arrived if arrived else None)
            if done is not None and judged else None,
        }
        if by_pool is not None:
            row["instances_by_pool"] = dict(by_pool[k])
        rows.append(row)
    pools = None
    if pooled:
        pools = []
        for p in record.pools:
            rows_p = [c for c in counts if c["pool"] == p["name"]]
            hours = record.pool_gpu_us(p["name"]) / US_PER_HOUR
            usd = pool_prices.get(p["name"]) if pool_prices is not None else gpu_hour_usd
            pools.append({k: v for k, v in p.items() if k != "units"} | {
                "gpu_hours": hours, "gpu_hour_usd": usd,
                "cost_usd": hours * usd if usd is not None else None,
                "peak_instances": max((c["serving"] + c["loading"] + c["draining"]
                                       for c in rows_p), default=0)})
    cost_usd = gpu_hours * gpu_hour_usd if gpu_hour_usd is not None else None
    if pools is not None and pool_prices is not None:
        costs = [p["cost_usd"] for p in pools]
        cost_usd = sum(costs) if None not in costs else None
        distinct = {p["gpu_hour_usd"] for p in pools}
        gpu_hour_usd = distinct.pop() if len(distinct) == 1 else None
    return AutoscaleReport(**record.setup(), gpu_hours=gpu_hours, gpu_hour_usd=gpu_hour_usd,
                           cost_usd=cost_usd,
                           scale_ups=record.scale_ups, scale_downs=record.scale_downs,
                           peak_instances=peak, mean_instances=mean, instance_count=counts,
                           intervals=rows, pools=pools)


#: intervals the table shows (the JSON has them all)
TABLE_INTERVALS = 48


def autoscale_tables(a: AutoscaleReport) -> list:
    """The ``--format table`` view of the section: the totals, then the intervals (the first
    :data:`TABLE_INTERVALS`) with the instances chosen, arrivals and SLO attainment."""
    from rich.table import Table

    t = Table(title="Autoscaling", title_justify="left")
    t.add_column("Metric")
    t.add_column("Value", justify="right")
    cost = "-" if a.cost_usd is None else f"${a.cost_usd:,.4f}" + (
        f" (${a.gpu_hour_usd:,.3f} per GPU-hour)" if a.gpu_hour_usd is not None else " (by pool)")
    by_pool = bool(a.pools) and len({p["loading_delay_us"] for p in a.pools}) > 1
    for label, v in (("Policy", a.policy), ("Interval", f"{a.interval_us / 1e6:g} s"),
                     ("Loading delay", "by pool" if by_pool else f"{a.loading_delay_us / 1e6:,.3f} s"),
                     ("Instances (min / max)", f"{a.min_instances} / {a.max_instances}"),
                     ("Instances (peak / mean)", f"{a.peak_instances} / {a.mean_instances:,.2f}"),
                     ("Scale-ups / scale-downs", f"{a.scale_ups:,} / {a.scale_downs:,}"),
                     ("GPUs per instance", f"{a.gpus_per_instance}" if a.gpus_per_instance
                      else "by pool"),
                     ("GPU-hours", f"{a.gpu_hours:,.4f}"), ("Cost", cost)):
        t.add_row(label, v)
    names = [p["name"] for p in a.pools or ()]
    for p in a.pools or ():
        t.add_row(f"{p['name']}: instances (min / max / peak)",
                  f"{p['min_instances']} / {p['max_instances']} / {p['peak_instances']}")
        t.add_row(f"{p['name']}: GPUs per instance, GPU-hours",
                  f"{p['gpus_per_instance']}, {p['gpu_hours']:,.4f}")
        if by_pool:
            t.add_row(f"{p['name']}: loading delay", f"{p['loading_delay_us'] / 1e6:,.3f} s")
    iv = Table(title="Autoscaling intervals", title_justify="left")
    for h in ("start (s)", "instances", *names, "arrived", "completed", "SLO attainment"):
        iv.add_column(h, justify="right")
    for r in a.intervals[:TABLE_INTERVALS]:
        pct = r["attainment_pct"]
        per_pool = [str(r["instances_by_pool"][k]) for k in names]
        iv.add_row(f"{r['start_us'] / 1e6:,.3f}", str(r["instances"]), *per_pool,
                   f"{r['arrived']:,}", "-" if r["completed"] is None else f"{r['completed']:,}",
                   "-" if pct is None else f"{pct:.2f}%")
    more = len(a.intervals) - TABLE_INTERVALS
    if more > 0:
        iv.caption = f"{more:,} more intervals in --format json"
    return [t, iv]
