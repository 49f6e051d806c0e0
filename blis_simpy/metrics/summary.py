"""From raw instance records to BLIS's summary objects (spec/08 §2–§8).

* :func:`aggregate` — the cluster record (§2), before any PD correction (06 §8, done by the
  PD code on the returned record).
* :func:`metrics_output` — the ``MetricsOutput`` JSON object (§4), keys in BLIS's order;
  :func:`request_rows` — its per-request rows.
* :func:`replay_results` — the ``blis replay --results-path`` array (§8).
* Raw metrics (§7): :func:`slo_distributions`, :func:`per_model_metrics`,
  :func:`priority_inversions`, :func:`hol_blocking_events`, :func:`preemption_rate`,
  :func:`raw_throughput`, :func:`compute_fitness`.

Every value is computed the way Go evaluates it (``float64(x)/1000`` for ms,
``float64(t)/1e6`` for seconds, left-to-right float sums) so results agree with BLIS to the
last bit wherever the inputs agree.
"""

from __future__ import annotations

import logging
import math
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from blis_simpy.metrics.percentile import Distribution, SortedHistogram, mean_ms, percentile_ms
from blis_simpy.metrics.records import InstanceMetrics

__all__ = [
    "FITNESS_KEYS",
    "FitnessResult",
    "ModelMetrics",
    "SLOMetrics",
    "aggregate",
    "compute_fitness",
    "hol_blocking_events",
    "metrics_output",
    "per_model_metrics",
    "preemption_rate",
    "priority_inversions",
    "raw_throughput",
    "replay_results",
    "request_rows",
    "slo_distributions",
]

log = logging.getLogger("blis_simpy.metrics")

DEFAULT_SLO_CLASS = "default"

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
    """Combine per-instance records into one (spec/08 §2).

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
    for k, where in duplicates.items():
        log.warning("aggregate: duplicate request ID %r across instances (%s); "
                    "the later instance's value is kept", k, ", ".join(where))
    return agg


# ---------------------------------------------------------------------- MetricsOutput
def _ms(x) -> float:
    return float(x) / 1000


def request_rows(m: InstanceMetrics) -> list[dict]:
    """Per-request rows of the results file (spec/08 §4), in BLIS's order.

    One row per registry entry. Missing map entries give 0; ``slo_class``, ``tenant_id``,
    ``handled_by`` and ``model`` are omitted when empty, ``length_capped`` when false.
    Sorted by request ID (string order), then stably by ``arrived_at``.
    """
    rows = []
    ttft, itl, e2e, sched = m.ttft, m.itl, m.e2e, m.scheduling_delay
    for rid in sorted(m.registry):
        req = m.registry[rid]
        row = {
            "arrived_at": float(req.arrival_us) / 1e6,
            "requestID": rid,
            "num_prefill_tokens": req.input_len,
            "num_decode_tokens": req.output_len,
            "ttft_ms": _ms(ttft.get(rid, 0)),
            "itl_ms": _ms(itl.get(rid, 0)),
            "e2e_ms": _ms(e2e.get(rid, 0)),
            "scheduling_delay_ms": _ms(sched.get(rid, 0)),
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
        rows.append(row)
    rows.sort(key=lambda r: r["arrived_at"])  # stable: ties keep ID order
    return rows


def metrics_output(m: InstanceMetrics, *, include_requests: bool) -> dict:
    """BLIS's ``MetricsOutput`` object for one scope (an instance or the cluster), spec/08 §4.

    Keys are in BLIS's order. Latency and throughput fields are 0 when nothing completed;
    ``vllm_estimated_duration_s`` is always ``sim_ended_time / 1e6``.
    ``kv_allocation_failures`` is omitted when 0; ``requests`` (only with
    ``include_requests``, i.e. for the results file) is omitted when there is no row.
    """
    duration = float(m.sim_ended_time) / 1e6
    out: dict = {
        "instance_id": m.instance_id,
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
        for prefix, mp in (("e2e", m.e2e), ("ttft", m.ttft)):
            sv = sorted(mp.values())
            vals[f"{prefix}_mean_ms"] = mean_ms(sv)
            for p in (90, 95, 99):
                vals[f"{prefix}_p{p}_ms"] = percentile_ms(sv, p)
        h = SortedHistogram(m.all_itls)
        vals["itl_mean_ms"] = h.mean_ms()
        for p in (90, 95, 99):
            vals[f"itl_p{p}_ms"] = h.percentile_ms(p)
        vals["scheduling_delay_p99_ms"] = percentile_ms(sorted(m.scheduling_delay.values()), 99)
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


_REPLAY_ID = re.compile(r"request_([+-]?[0-9]+)")


def replay_results(m: InstanceMetrics) -> list[dict]:
    """The ``blis replay`` results array (spec/08 §8): the input of ``blis calibrate``.

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


# ------------------------------------------------------------------------ raw metrics
@dataclass(frozen=True, slots=True)
class SLOMetrics:
    """TTFT and E2E distributions (µs) of one SLO class."""

    ttft: Distribution
    e2e: Distribution

    def to_dict(self) -> dict:
        return {"ttft": self.ttft.to_dict(), "e2e": self.e2e.to_dict()}


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    """Per-model metrics (spec/08 §5 item 7). Latencies in µs."""

    model: str
    ttft: Distribution
    e2e: Distribution
    #: completed requests (with an E2E) per second of ``sim_ended_time``
    throughput_rps: float
    #: Σ pre-sampled output tokens of those requests per second
    tokens_per_sec: float
    #: registry rows carrying this model tag
    total_requests: int

    def to_dict(self) -> dict:
        return {"model": self.model, "ttft": self.ttft.to_dict(), "e2e": self.e2e.to_dict(),
                "throughput_rps": self.throughput_rps, "tokens_per_sec": self.tokens_per_sec,
                "total_requests": self.total_requests}


def slo_distributions(m: InstanceMetrics) -> dict[str, SLOMetrics]:
    """TTFT and E2E distributions per SLO class (empty class ⇒ ``default``), classes sorted.

    Values are gathered in sorted request-ID order. A class is present when at least one of
    its requests has a TTFT or an E2E. An ID without a registry row counts as ``default``.
    """
    ttfts: dict[str, list] = {}
    e2es: dict[str, list] = {}
    reg = m.registry
    for rid in sorted(set(m.ttft) | set(m.e2e)):
        req = reg.get(rid)
        cls = (req.slo_class if req is not None else "") or DEFAULT_SLO_CLASS
        ttfts.setdefault(cls, [])
        e2es.setdefault(cls, [])
        if rid in m.ttft:
            ttfts[cls].append(m.ttft[rid])
        if rid in m.e2e:
            e2es[cls].append(m.e2e[rid])
    return {cls: SLOMetrics(Distribution.from_values(ttfts[cls]),
                            Distribution.from_values(e2es[cls]))
            for cls in sorted(ttfts)}


def per_model_metrics(m: InstanceMetrics) -> dict[str, ModelMetrics]:
    """Per-model metrics over requests with a TTFT or E2E and a non-empty model tag.

    Models sorted. Throughput counts the model's requests that have an E2E (completed) and
    the sum of their pre-sampled output lengths, over ``sim_ended_time`` seconds (0 when the
    duration is 0).
    """
    ttfts: dict[str, list] = {}
    e2es: dict[str, list] = {}
    tokens: dict[str, int] = {}
    rows: Counter = Counter()
    for req in m.registry.values():
        if req.model:
            rows[req.model] += 1
    for rid in sorted(set(m.ttft) | set(m.e2e)):
        req = m.registry.get(rid)
        if req is None or not req.model:
            continue
        mdl = req.model
        ttfts.setdefault(mdl, [])
        e2es.setdefault(mdl, [])
        tokens.setdefault(mdl, 0)
        if rid in m.ttft:
            ttfts[mdl].append(m.ttft[rid])
        if rid in m.e2e:
            e2es[mdl].append(m.e2e[rid])
            tokens[mdl] += req.output_len
    dur = float(m.sim_ended_time) / 1e6
    out = {}
    for mdl in sorted(ttfts):
        n_done = len(e2es[mdl])
        out[mdl] = ModelMetrics(
            model=mdl,
            ttft=Distribution.from_values(ttfts[mdl]),
            e2e=Distribution.from_values(e2es[mdl]),
            throughput_rps=float(n_done) / dur if dur > 0 else 0.0,
            tokens_per_sec=float(tokens[mdl]) / dur if dur > 0 else 0.0,
            total_requests=rows[mdl],
        )
    return out


def _count_pairs_over_double(values: Sequence) -> int:
    """Number of pairs i < j with ``values[i] > 2 × values[j]`` in O(n log n)."""
    uniq = sorted(set(values))
    size = len(uniq)
    tree = [0] * (size + 1)  # Fenwick tree of counts over the sorted distinct values
    count = 0
    seen = 0
    for v in values:
        # earlier values <= 2v
        k = bisect_right(uniq, 2 * v)
        le = 0
        while k > 0:
            le += tree[k]
            k -= k & -k
        count += seen - le
        i = bisect_right(uniq, v)  # 1-based position of v
        while i <= size:
            tree[i] += 1
            i += i & -i
        seen += 1
    return count


def priority_inversions(instances: Iterable[InstanceMetrics], priority_policy: str) -> int:
    """BLIS's priority-inversion counter (spec/08 §7).

    0 for the ``constant`` (or empty) priority policy. Otherwise, per instance and per SLO
    class, the requests having an E2E ordered by arrival (ties: request ID) and the pairs
    ``i < j`` with ``e2e_i > 2 × e2e_j`` counted.
    """
    if priority_policy in ("", "constant"):
        return 0
    total = 0
    for m in instances:
        groups: dict[str, list[tuple[int, str, int]]] = {}
        for rid, e2e in m.e2e.items():
            req = m.registry.get(rid)
            if req is None:
                continue
            cls = req.slo_class or DEFAULT_SLO_CLASS
            groups.setdefault(cls, []).append((req.arrival_us, rid, e2e))
        for cls in sorted(groups):
            grp = sorted(groups[cls])
            total += _count_pairs_over_double([t[2] for t in grp])
    return total


def hol_blocking_events(instances: Sequence[InstanceMetrics]) -> int:
    """BLIS's head-of-line blocking counter (spec/08 §7).

    With ≥ 2 instances: each instance's mean wait-queue length over its step samples (0 if
    none); count the instances whose mean exceeds twice the mean over instances (0 when that
    mean is 0).
    """
    if len(instances) < 2:
        return 0
    avgs = [m.mean_waitq_len for m in instances]
    s = 0.0
    for a in avgs:
        s += a
    overall = s / len(avgs)
    if overall == 0:
        return 0
    return sum(1 for a in avgs if a > 2 * overall)


def preemption_rate(m: InstanceMetrics) -> float:
    """Total preemptions / completed requests (0 when nothing completed)."""
    if m.completed_requests <= 0:
        return 0.0
    return float(m.preemption_count) / float(m.completed_requests)


def raw_throughput(m: InstanceMetrics) -> tuple[float, float]:
    """``(requests_per_sec, tokens_per_sec)`` of RawMetrics: completed requests and output
    tokens over ``sim_ended_time`` seconds; each 0 if its count or the duration is 0."""
    dur = float(m.sim_ended_time) / 1e6
    rps = float(m.completed_requests) / dur if m.completed_requests > 0 and dur > 0 else 0.0
    tps = float(m.total_output_tokens) / dur if m.total_output_tokens > 0 and dur > 0 else 0.0
    return rps, tps


# ---------------------------------------------------------------------------- fitness
FITNESS_KEYS = ("throughput", "tokens_per_sec", "p99_ttft", "p50_ttft", "mean_ttft",
                "p99_e2e", "p50_e2e", "mean_e2e")


@dataclass(frozen=True, slots=True)
class FitnessResult:
    """``=== Fitness Evaluation ===``: the weighted score and each weighted component."""

    score: float
    components: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"score": self.score, "components": {k: self.components[k]
                                                    for k in sorted(self.components)}}


def compute_fitness(m: InstanceMetrics, weights: Mapping[str, float]) -> FitnessResult:
    """Fitness of the cluster record ``m`` for ``weights`` (spec/08 §7).

    Components are normalised to [0, 1]: ``rps/(rps+100)``, ``tps/(tps+10000)`` and
    ``1/(1 + µs/1000)`` for the latency keys (TTFT/E2E distributions over the maps in
    sorted-ID order). Score = Σ weight × component over the keys in sorted order. Raises
    :class:`ValueError` for an unknown key or a weight that is negative or not finite.
    """
    for k, w in weights.items():
        if k not in FITNESS_KEYS:
            raise ValueError(f"unknown fitness key {k!r}; valid keys: {', '.join(sorted(FITNESS_KEYS))}")
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"fitness weight for {k!r} must be finite and >= 0, got {w!r}")
    rps, tps = raw_throughput(m)
    ttft = Distribution.from_map(m.ttft)
    e2e = Distribution.from_map(m.e2e)

    def lat(v: float) -> float:
        return 1.0 / (1.0 + v / 1000.0)

    extract = {
        "throughput": lambda: rps / (rps + 100.0),
        "tokens_per_sec": lambda: tps / (tps + 10000.0),
        "p99_ttft": lambda: lat(ttft.p99),
        "p50_ttft": lambda: lat(ttft.p50),
        "mean_ttft": lambda: lat(ttft.mean),
        "p99_e2e": lambda: lat(e2e.p99),
        "p50_e2e": lambda: lat(e2e.p50),
        "mean_e2e": lambda: lat(e2e.mean),
    }
    score = 0.0
    comps = {}
    for k in sorted(weights):
        c = extract[k]()
        comps[k] = c
        score += c * weights[k]
    return FitnessResult(score=score, components=comps)
