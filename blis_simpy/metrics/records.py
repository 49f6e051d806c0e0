"""Raw per-instance metrics, written by the engine while it runs (docs/engine.md,
"Per-instance counters").

Latency maps are keyed by request ID and hold integer µs. Per-token inter-token latencies
(``all_itls``) are kept as a histogram ``{value_us: count}``: step durations repeat a lot, so
this is exact and small, where a list of every sample would hold one int per output token.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class InstanceMetrics:
    """Counters, maps and samples of one instance. Times in µs, sizes in KV blocks."""

    instance_id: str
    completed_requests: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    ttft_sum: int = 0
    sim_ended_time: int = 0
    kv_blocks_integral: int = 0
    peak_kv_blocks: int = 0
    preemption_count: int = 0
    kv_allocation_failures: int = 0
    cache_hit_rate: float = 0.0
    kv_thrashing_rate: float = 0.0
    still_queued: int = 0
    still_running: int = 0
    dropped_unservable: int = 0
    length_capped_requests: int = 0
    timed_out_requests: int = 0
    # request ID -> µs (itl: the request's average inter-token latency, a float)
    ttft: dict[str, int] = field(default_factory=dict)
    itl: dict[str, float] = field(default_factory=dict)
    scheduling_delay: dict[str, int] = field(default_factory=dict)
    e2e: dict[str, int] = field(default_factory=dict)
    completion_time: dict[str, int] = field(default_factory=dict)
    #: histogram of every per-token ITL sample of completed requests
    all_itls: Counter = field(default_factory=Counter)
    step_counters_sum: int = 0
    waitq_len_sum: int = 0
    running_len_sum: int = 0
    step_samples: int = 0
    #: request ID -> Request, every request injected and not dropped by an enqueue guard
    registry: dict = field(default_factory=dict)
    #: data parallelism (dp > 1): the engine this instance is a rank of, and its rank
    #: (None without data parallelism, and for aggregates)
    dp_engine: int | None = None
    dp_rank: int | None = None
    #: ``--streaming-metrics``: the streamed distributions
    #: (:class:`~blis_simpy.metrics.streaming.StreamingStats`) that replace the per-request
    #: maps above, emptied as requests leave; None for exact metrics
    streaming: object | None = None

    @property
    def injected_requests(self) -> int:
        return (self.completed_requests + self.still_queued + self.still_running
                + self.dropped_unservable + self.timed_out_requests)

    @property
    def mean_waitq_len(self) -> float:
        return self.waitq_len_sum / self.step_samples if self.step_samples else 0.0
