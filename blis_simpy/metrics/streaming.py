"""Streaming summary statistics (``--streaming-metrics``; docs/metrics.md, "Streaming metrics").

The exact reports keep every request's TTFT, E2E and scheduling delay until the end of the
run, then sort them. Under ``--streaming-metrics`` each value goes into a :class:`StreamDist`
as its request leaves the instance and the request is forgotten:

* counts, sums (exact integers: every mean is bit-identical to the exact report's), minima
  and maxima are exact;
* percentiles come from a DDSketch (the ``ddsketch`` library) with relative accuracy
  :data:`RELATIVE_ACCURACY`: the reported p-th percentile ``x`` satisfies
  ``(1 − α)·v_lo ≤ x ≤ (1 + α)·v_hi`` where ``v_lo ≤ v_hi`` are the two order statistics the
  exact rule interpolates between (rank ``p/100·(n−1)`` rounded down and up), α = 0.01;
  it is clamped to the exact minimum and maximum;
* inter-token latencies are not sketched: their ``{value_us: count}`` histogram
  (``InstanceMetrics.all_itls``) is already exact and bounded by the number of distinct step
  durations, so ``itl_*`` stay exact.

:class:`StreamingStats` holds one scope's distributions (an instance; the cluster is their
merge): TTFT, E2E and scheduling delay, TTFT/E2E per SLO class and per model, the model
token sums and row counts, and — only for a priority policy other than ``constant`` — the
``(arrival_us, request ID, e2e_us)`` rows the priority-inversion counter orders; with SLO
targets, the met-request counts of :mod:`blis_simpy.metrics.slo` (exact: counts only).
"""

from __future__ import annotations

from blis_simpy.metrics.percentile import Distribution

__all__ = ["RELATIVE_ACCURACY", "StreamDist", "StreamingStats", "accuracy_note"]

#: DDSketch relative accuracy α of every streamed percentile
RELATIVE_ACCURACY = 0.01


def accuracy_note() -> str:
    """One line saying the percentiles are approximate, for the reports."""
    return (f"streaming metrics: TTFT, E2E and scheduling-delay percentiles from DDSketch "
            f"(relative accuracy {RELATIVE_ACCURACY:g}); counts, means, min, max and ITL exact")


class StreamDist:
    """Count, exact integer sum, min, max and a DDSketch of integer µs values."""

    __slots__ = ("count", "total", "lo", "hi", "sketch")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.lo = 0
        self.hi = 0
        from ddsketch import DDSketch  # loaded by --streaming-metrics runs only
        self.sketch = DDSketch(RELATIVE_ACCURACY)

    def add(self, v: int) -> None:
        if self.count == 0:
            self.lo = self.hi = v
        elif v < self.lo:
            self.lo = v
        elif v > self.hi:
            self.hi = v
        self.count += 1
        self.total += v
        self.sketch.add(v)

    def merge(self, other: StreamDist) -> None:
        if other.count == 0:
            return
        if self.count == 0:
            self.lo, self.hi = other.lo, other.hi
        else:
            self.lo = min(self.lo, other.lo)
            self.hi = max(self.hi, other.hi)
        self.count += other.count
        self.total += other.total
        self.sketch.merge(other.sketch)

    @property
    def n(self) -> int:
        """The number of values (as :class:`~blis_simpy.metrics.percentile.SortedHistogram`)."""
        return self.count

    def percentile(self, p: float) -> float:
        """Approximate percentile ``p`` (µs); 0 when empty."""
        if self.count == 0:
            return 0.0
        v = self.sketch.get_quantile_value(p / 100.0)
        return float(min(max(v, self.lo), self.hi))

    def percentile_ms(self, p: float) -> float:
        return self.percentile(p) / 1000

    def mean(self) -> float:
        """Exact mean (µs): the integer sum over the count, as the exact report computes it."""
        return float(self.total) / float(self.count) if self.count else 0.0

    def mean_ms(self) -> float:
        return float(self.total) / float(self.count) / 1000 if self.count else 0.0

    def distribution(self) -> Distribution:
        if self.count == 0:
            return Distribution()
        return Distribution(mean=self.mean(), p50=self.percentile(50), p95=self.percentile(95),
                            p99=self.percentile(99), min=float(self.lo), max=float(self.hi),
                            count=self.count)


class StreamingStats:
    """The streamed distributions of one scope (see the module docstring). ``keep_order``:
    also keep the rows the priority-inversion counter needs (3 values per request with an
    E2E)."""

    __slots__ = ("ttft", "e2e", "sched", "slo", "model", "model_tokens", "model_rows",
                 "order_rows", "slo_tally")

    def __init__(self, keep_order: bool = False) -> None:
        self.ttft = StreamDist()
        self.e2e = StreamDist()
        self.sched = StreamDist()
        #: SLO class -> (TTFT, E2E); model -> (TTFT, E2E)
        self.slo: dict[str, tuple[StreamDist, StreamDist]] = {}
        self.model: dict[str, tuple[StreamDist, StreamDist]] = {}
        #: model -> Σ output_len of its requests with an E2E; model -> registry rows
        self.model_tokens: dict[str, int] = {}
        self.model_rows: dict[str, int] = {}
        #: SLO class -> [(arrival_us, request ID, e2e_us)], or None when not kept
        self.order_rows: dict[str, list] | None = {} if keep_order else None
        #: SLO targets set: the met-request counts per class
        #: (:class:`~blis_simpy.metrics.slo.SLOTally`, filled by the collector); else None
        self.slo_tally = None

    def add_request(self, req, slo_class: str, ttft, e2e, sched, counted_row: bool) -> None:
        """One request's values (None = absent). ``req`` is its registry row (None if it has
        none); ``slo_class`` its class (``default`` when empty or without a row);
        ``counted_row``: the request had a registry row (it counts in the model's rows)."""
        if ttft is not None:
            self.ttft.add(ttft)
        if e2e is not None:
            self.e2e.add(e2e)
        if sched is not None:
            self.sched.add(sched)
        model = req.model if req is not None else ""
        if counted_row and model:
            self.model_rows[model] = self.model_rows.get(model, 0) + 1
        if ttft is None and e2e is None:
            return
        pair = self.slo.get(slo_class)
        if pair is None:
            pair = self.slo[slo_class] = (StreamDist(), StreamDist())
        if ttft is not None:
            pair[0].add(ttft)
        if e2e is not None:
            pair[1].add(e2e)
        if model:
            pair = self.model.get(model)
            if pair is None:
                pair = self.model[model] = (StreamDist(), StreamDist())
                self.model_tokens.setdefault(model, 0)
            if ttft is not None:
                pair[0].add(ttft)
            if e2e is not None:
                pair[1].add(e2e)
                self.model_tokens[model] += req.output_len
        if e2e is not None and req is not None and self.order_rows is not None:
            self.order_rows.setdefault(slo_class, []).append((req.arrival_us, req.id, e2e))

    def merge(self, other: StreamingStats) -> None:
        self.ttft.merge(other.ttft)
        self.e2e.merge(other.e2e)
        self.sched.merge(other.sched)
        for mine, theirs in ((self.slo, other.slo), (self.model, other.model)):
            for key, (t, e) in theirs.items():
                pair = mine.setdefault(key, (StreamDist(), StreamDist()))
                pair[0].merge(t)
                pair[1].merge(e)
        for mine, theirs in ((self.model_tokens, other.model_tokens),
                             (self.model_rows, other.model_rows)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        if other.slo_tally is not None:
            if self.slo_tally is None:
                self.slo_tally = type(other.slo_tally)()
            self.slo_tally.merge(other.slo_tally)
        if other.order_rows is not None:
            if self.order_rows is None:
                self.order_rows = {}
            for cls, rows in other.order_rows.items():
                self.order_rows.setdefault(cls, []).extend(rows)
