"""Raw metrics of a finished run (docs/metrics.md): per-SLO and per-model distributions, the
anomaly detectors and the simple rates.

* :func:`slo_distributions` — TTFT/E2E distributions per SLO class (:class:`SLOMetrics`).
* :func:`per_model_metrics` — per-model latencies and throughput (:class:`ModelMetrics`).
* :func:`priority_inversions`, :func:`hol_blocking_events` — BLIS's anomaly counters.
* :func:`preemption_rate`, :func:`raw_throughput` — RawMetrics' rates.

Values are computed the way Go evaluates them (see :mod:`blis_simpy.metrics.summary`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from blis_simpy.metrics.percentile import Distribution
from blis_simpy.metrics.records import InstanceMetrics

__all__ = [
    "DEFAULT_SLO_CLASS",
    "ModelMetrics",
    "SLOMetrics",
    "hol_blocking_events",
    "per_model_metrics",
    "preemption_rate",
    "priority_inversions",
    "raw_throughput",
    "slo_distributions",
]

DEFAULT_SLO_CLASS = "default"


@dataclass(frozen=True, slots=True)
class SLOMetrics:
    """TTFT and E2E distributions (µs) of one SLO class."""

    ttft: Distribution
    e2e: Distribution

    def to_dict(self) -> dict:
        """Our JSON form (ms, :meth:`Distribution.to_dict_ms`)."""
        return {"ttft": self.ttft.to_dict_ms(), "e2e": self.e2e.to_dict_ms()}


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    """Per-model metrics (``=== Per-Model Metrics ===``). Latencies in µs."""

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
        """Our JSON form (latencies in ms, :meth:`Distribution.to_dict_ms`)."""
        return {"model": self.model, "ttft": self.ttft.to_dict_ms(), "e2e": self.e2e.to_dict_ms(),
                "throughput_rps": self.throughput_rps, "tokens_per_sec": self.tokens_per_sec,
                "total_requests": self.total_requests}


def slo_distributions(m: InstanceMetrics) -> dict[str, SLOMetrics]:
    """TTFT and E2E distributions per SLO class (empty class ⇒ ``default``), classes sorted.

    Values are gathered in sorted request-ID order. A class is present when at least one of
    its requests has a TTFT or an E2E. An ID without a registry row counts as ``default``.
    Under ``--streaming-metrics`` the distributions are the streamed ones.
    """
    if m.streaming is not None:
        return {cls: SLOMetrics(t.distribution(), e.distribution())
                for cls, (t, e) in sorted(m.streaming.slo.items())}
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
    duration is 0). Under ``--streaming-metrics`` the distributions are the streamed ones.
    """
    if m.streaming is not None:
        return _streamed_models(m)
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


def _streamed_models(m: InstanceMetrics) -> dict[str, ModelMetrics]:
    st = m.streaming
    dur = float(m.sim_ended_time) / 1e6
    out = {}
    for mdl in sorted(st.model):
        t, e = st.model[mdl]
        out[mdl] = ModelMetrics(
            model=mdl, ttft=t.distribution(), e2e=e.distribution(),
            throughput_rps=float(e.count) / dur if dur > 0 else 0.0,
            tokens_per_sec=float(st.model_tokens[mdl]) / dur if dur > 0 else 0.0,
            total_requests=st.model_rows.get(mdl, 0))
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
    """BLIS's priority-inversion counter (docs/metrics.md, "Anomaly counters").

    0 for the ``constant`` (or empty) priority policy. Otherwise, per instance and per SLO
    class, the requests having an E2E ordered by arrival (ties: request ID) and the pairs
    ``i < j`` with ``e2e_i > 2 × e2e_j`` counted.
    """
    if priority_policy in ("", "constant"):
        return 0
    total = 0
    for m in instances:
        groups: dict[str, list[tuple[int, str, int]]] = {}
        if m.streaming is not None and m.streaming.order_rows is not None:
            for cls, rows in m.streaming.order_rows.items():
                groups.setdefault(cls, []).extend(rows)
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
    """BLIS's head-of-line blocking counter (docs/metrics.md, "Anomaly counters").

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
