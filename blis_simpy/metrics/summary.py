"""From raw instance records to BLIS's summary objects (docs/metrics.md).

* :func:`aggregate` — the cluster record, before any PD correction (docs/disaggregation.md,
  "End-of-run accounting", done by the PD code on the returned record).
* :func:`metrics_output` — the ``MetricsOutput`` JSON object, keys in BLIS's order;
  :func:`request_rows` — its per-request rows.
* :func:`scope_output` — our own ``--format json`` object for one scope: every latency in ms
  with p50, its count, ``null`` where no request has it (docs/metrics.md, "JSON document").
* :func:`replay_results` — the ``blis replay --results-path`` array.

Raw metrics live in :mod:`blis_simpy.metrics.raw` and fitness in
:mod:`blis_simpy.metrics.fitness`.

Every value is computed the way Go evaluates it (``float64(x)/1000`` for ms,
``float64(t)/1e6`` for seconds, left-to-right float sums) so results agree with BLIS to the
last bit wherever the inputs agree.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence

from blis_simpy.metrics.percentile import SortedHistogram, mean_ms, percentile_ms
from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.metrics.streaming import StreamingStats

__all__ = [
    "aggregate",
    "metrics_output",
    "replay_results",
    "request_row",
    "request_rows",
    "scope_output",
]

log = logging.getLogger("blis_simpy.metrics")

_SUMMED = (
    "completed_requests", "total_input_tokens", "total_output_tokens", "ttft_sum",
    "kv_blocks_integral", "preemption_count", "kv_allocation_failures", "still_queued",
    "still_running", "dropped_unservable", "length_capped_requests", "timed_out_requests",
    "step_counters_sum", "waitq_len_sum", "running_len_sum", "step_samples",
)
_MAXED = ("sim_ended_time", "peak_kv_blocks")
_MERGED = ("ttft", "itl", "scheduling_delay", "e2e", "completion_time", "registry")


# ------------------------------------------------------------------------ aggregation
def aggregate(instances: Sequence[InstanceMetrics], *,
              instance_id: str = "cluster") -> InstanceMetrics:
    """Combine per-instance records into one (docs/metrics.md, "Aggregation over instances").

    Counters are summed; ``sim_ended_time`` and ``peak_kv_blocks`` take the maximum;
    ``all_itls`` histograms and per-step sample sums are added; the per-request maps and the
    registry are merged (a request ID present on two instances logs a warning and the later
    instance wins, as Go's map assignment does); cache-hit and thrashing rates are the mean
    over instances (0 for no instance). The inputs are not modified.
    """
    agg = InstanceMetrics(instance_id=instance_id)
    for name in _SUMMED:
        setattr(agg, name, sum(getattr(m, name) for m in instances))
    for name in _MAXED:
        setattr(agg, name, max((getattr(m, name) for m in instances), default=0))
    n = len(instances)
    if n:
        hit = 0.0
        thr = 0.0
        for m in instances:
            hit += m.cache_hit_rate
            thr += m.kv_thrashing_rate
        agg.cache_hit_rate = hit / n
        agg.kv_thrashing_rate = thr / n
    itls: Counter = Counter()
    for m in instances:
        itls.update(m.all_itls)
    agg.all_itls = itls
    duplicates: dict[str, list[str]] = {}
    for name in _MERGED:
        merged: dict = {}
        for m in instances:
            src = getattr(m, name)
            for k, v in src.items():
                if k in merged:
                    duplicates.setdefault(k, []).append(f"{name}@{m.instance_id}")
                merged[k] = v
        setattr(agg, name, merged)
    if any(m.streaming is not None for m in instances):   # --streaming-metrics
        agg.streaming = StreamingStats()
        for m in instances:
            if m.streaming is not None:
                agg.streaming.merge(m.streaming)
    for k, where in duplicates.items():
        log.warning("aggregate: duplicate request ID %r across instances (%s); "
                    "the later instance's value is kept", k, ", ".join(where))
    return agg


# ---------------------------------------------------------------------- MetricsOutput
def _ms(x) -> float | None:
    return None if x is None else float(x) / 1000


def request_rows(m: InstanceMetrics, *, absent: int | None = 0) -> list[dict]:
    """Per-request rows of the results file, in BLIS's order.

    One row per registry entry. A latency the request does not have is ``absent``: 0 in
    BLIS's results file, ``None`` (null) in our ``--requests-out`` file; ``slo_class``, ``tenant_id``,
    ``handled_by`` and ``model`` are omitted when empty, ``length_capped`` when false.
    Sorted by request ID (string order), then stably by ``arrived_at``.
    """
    ttft, itl, e2e, sched = m.ttft, m.itl, m.e2e, m.scheduling_delay
    rows = [request_row(rid, m.registry[rid], ttft.get(rid, absent), itl.get(rid, absent),
                        e2e.get(rid, absent), sched.get(rid, absent))
            for rid in sorted(m.registry)]
    rows.sort(key=lambda r: r["arrived_at"])  # stable: ties keep ID order
    return rows


def request_row(rid: str, req, ttft_us, itl_us, e2e_us, sched_us) -> dict:
    """One results-file row: ``req`` is the registry row, the latencies are µs (0, or None for
    null, when the request does not have them)."""
    row = {
        "arrived_at": float(req.origin_us) / 1e6,
        "requestID": rid,
        "num_prefill_tokens": req.input_len,
        "num_decode_tokens": req.output_len,
        "ttft_ms": _ms(ttft_us),
        "itl_ms": _ms(itl_us),
        "e2e_ms": _ms(e2e_us),
        "scheduling_delay_ms": _ms(sched_us),
    }
    if req.slo_class:
        row["slo_class"] = req.slo_class
    if req.tenant_id:
        row["tenant_id"] = req.tenant_id
    if req.assigned_instance:
        row["handled_by"] = req.assigned_instance
    if req.model:
        row["model"] = req.model
    if req.length_capped:
        row["length_capped"] = True
    return row


def metrics_output(m: InstanceMetrics, *, include_requests: bool, sources: dict | None = None) -> dict:
    """BLIS's ``MetricsOutput`` object for one scope (an instance or the cluster).

    Keys are in BLIS's order. Latency and throughput fields are 0 when nothing completed;
    ``vllm_estimated_duration_s`` is always ``sim_ended_time / 1e6``.
    ``kv_allocation_failures`` is omitted when 0; ``requests`` (only with
    ``include_requests``, i.e. for the results file) is omitted when there is no row.
    A data-parallel rank (``dp > 1``) also has ``engine`` and ``dp_rank`` after
    ``instance_id``. ``sources``: the scope's :func:`_latency_sources`, when the caller has
    them already (else made here when something completed).
    """
    duration = float(m.sim_ended_time) / 1e6
    out: dict = {"instance_id": m.instance_id}
    if m.dp_rank is not None:         # a data-parallel rank: which engine, which rank
        out["engine"] = m.dp_engine
        out["dp_rank"] = m.dp_rank
    out |= {
        "completed_requests": m.completed_requests,
        "still_queued": m.still_queued,
        "still_running": m.still_running,
        "injected_requests": m.injected_requests,
        "total_input_tokens": m.total_input_tokens,
        "total_output_tokens": m.total_output_tokens,
        "vllm_estimated_duration_s": duration,
    }
    names = ("responses_per_sec", "tokens_per_sec",
             "e2e_mean_ms", "e2e_p90_ms", "e2e_p95_ms", "e2e_p99_ms",
             "ttft_mean_ms", "ttft_p90_ms", "ttft_p95_ms", "ttft_p99_ms",
             "itl_mean_ms", "itl_p90_ms", "itl_p95_ms", "itl_p99_ms",
             "scheduling_delay_p99_ms")
    vals = dict.fromkeys(names, 0.0)
    if m.completed_requests > 0:
        if duration > 0:
            vals["responses_per_sec"] = float(m.completed_requests) / duration
            vals["tokens_per_sec"] = float(m.total_output_tokens) / duration
        if sources is None:
            sources = _latency_sources(m)
        for lat in ("e2e", "ttft", "itl"):
            src = sources[lat]
            vals[f"{lat}_mean_ms"] = src.mean_ms()
            for p in (90, 95, 99):
                vals[f"{lat}_p{p}_ms"] = src.percentile_ms(p)
        vals["scheduling_delay_p99_ms"] = sources["scheduling_delay"].percentile_ms(99)
    out.update(vals)
    if m.kv_allocation_failures:
        out["kv_allocation_failures"] = m.kv_allocation_failures
    out["preemption_count"] = m.preemption_count
    out["dropped_unservable"] = m.dropped_unservable
    out["length_capped_requests"] = m.length_capped_requests
    out["timed_out_requests"] = m.timed_out_requests
    if include_requests:
        rows = request_rows(m)
        if rows:
            out["requests"] = rows
    return out


#: the latencies of a scope object, in its key order
SCOPE_LATENCIES = ("e2e", "ttft", "itl", "scheduling_delay")
#: the statistics of each latency, ms (``<latency>_<stat>_ms``), then ``<latency>_count``
SCOPE_STATS = ("mean", "p50", "p90", "p95", "p99")
_BLIS_LATENCY = re.compile(r"(e2e|ttft|itl|scheduling_delay)_(mean|p\d+)_ms")


def _latency_sources(m: InstanceMetrics) -> dict:
    """``{latency: source}``: a source has ``n`` values (µs), ``mean_ms()`` and
    ``percentile_ms(p)`` by BLIS's JSON-summary rule (:mod:`blis_simpy.metrics.percentile`):
    the sorted values, the ITL histogram, or under ``--streaming-metrics`` the sketches (exact
    counts and means, sketched percentiles)."""
    st = m.streaming
    itl = SortedHistogram(m.all_itls)
    if st is not None:
        return {"e2e": st.e2e, "ttft": st.ttft, "itl": itl, "scheduling_delay": st.sched}
    return {"e2e": _Sorted(m.e2e.values()), "ttft": _Sorted(m.ttft.values()), "itl": itl,
            "scheduling_delay": _Sorted(m.scheduling_delay.values())}


class _Sorted:
    __slots__ = ("v", "n")

    def __init__(self, values) -> None:
        self.v = sorted(values)
        self.n = len(self.v)

    def mean_ms(self) -> float:
        return mean_ms(self.v)

    def percentile_ms(self, p: float) -> float:
        return percentile_ms(self.v, p)


def scope_output(m: InstanceMetrics) -> dict:
    """Our ``--format json`` object for one scope (an instance or the cluster).

    BLIS's :func:`metrics_output` counters, throughputs and key order, with
    ``unfinished_requests`` (``injected_requests − completed_requests``) after
    ``injected_requests``, and for each latency of :data:`SCOPE_LATENCIES` the statistics
    ``<latency>_{mean,p50,p90,p95,p99}_ms`` and ``<latency>_count`` (how many requests have
    it). A latency no request has is ``null``, never 0: an unfinished request has no TTFT or
    E2E and is left out of the statistics, not counted as 0 ms. Values equal BLIS's fields
    wherever BLIS reports them (same arithmetic).
    """
    sources = _latency_sources(m)
    blis = metrics_output(m, include_requests=False, sources=sources)
    out: dict = {}
    for key, value in blis.items():
        if _BLIS_LATENCY.fullmatch(key):
            continue
        out[key] = value
        if key == "injected_requests":
            out["unfinished_requests"] = m.injected_requests - m.completed_requests
        elif key == "tokens_per_sec":
            for lat in SCOPE_LATENCIES:
                src = sources[lat]
                for stat in SCOPE_STATS:
                    out[f"{lat}_{stat}_ms"] = (None if src.n == 0 else src.mean_ms() if stat == "mean"
                                               else src.percentile_ms(float(stat[1:])))
                out[f"{lat}_count"] = src.n
    return out


_REPLAY_ID = re.compile(r"request_([+-]?[0-9]+)")


def replay_results(m: InstanceMetrics) -> list[dict]:
    """The ``blis replay`` results array: the input of ``blis calibrate``.

    One ``{request_id, ttft_us, e2e_us, input_tokens, output_tokens}`` per request that has
    both a TTFT and an E2E and an ID ``request_<int>``; sorted by ``request_id``. Token counts
    come from the registry (prompt length, pre-sampled output length; 0 without a row).
    """
    out = []
    for rid, e2e in m.e2e.items():
        if rid not in m.ttft:
            continue
        mt = _REPLAY_ID.fullmatch(rid)
        if mt is None:
            continue
        req = m.registry.get(rid)
        out.append((int(mt.group(1)), rid, {
            "request_id": int(mt.group(1)),
            "ttft_us": int(m.ttft[rid]),
            "e2e_us": int(e2e),
            "input_tokens": req.input_len if req is not None else 0,
            "output_tokens": req.output_len if req is not None else 0,
        }))
    out.sort(key=lambda t: (t[0], t[1]))
    return [t[2] for t in out]
