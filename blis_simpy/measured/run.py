"""What a real serving run was measured to do: :class:`MeasuredRun` and its parts.

A run comes from a raw vLLM log (:mod:`blis_simpy.measured.vllm_log`), from the result file of
``vllm bench serve`` (:mod:`blis_simpy.measured.vllm_bench`) or from the files ``blis-simpy
convert`` wrote (:mod:`blis_simpy.measured.converted`). Every time is on one origin: the
earliest arrival of the run is 0.

Units: ``*_us`` integer µs, ``*_ms`` milliseconds, ``*_s`` seconds, token counts in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blis_simpy.workload.tracev2 import TraceHeader, TraceRecord


@dataclass(frozen=True)
class RealRequest:
    """One measured request. ``arrival_us``: its arrival minus the run's earliest one (µs);
    latencies in ms (``tpot_ms`` is None for a single output token); ``first_token_s`` and
    ``last_token_s`` on the log's own clock (s; for a converted run: the trace origin).
    ``trace_id`` is its ``request_id`` in the TraceV2 rows, so the replay names it
    ``request_<trace_id>``. ``sched_ms``: the scheduling delay, its first scheduling by the
    engine minus its arrival at the server (ms), and ``scheduled_s`` that scheduling time on
    the same clock as ``first_token_s``; both None when the source does not record it."""

    id: str
    arrival_us: int
    input_toks: int
    output_toks: int
    first_token_s: float
    last_token_s: float
    ttft_ms: float
    e2e_ms: float
    tpot_ms: float | None
    trace_id: int = -1
    sched_ms: float | None = None
    scheduled_s: float | None = None


@dataclass(frozen=True)
class Tick:
    """One row of a 1 s timeseries: throughputs in tokens/s over the tick, gauges (running,
    waiting requests; KV cache use in %) at its end. ``t_s``: end of the tick, s."""

    t_s: float
    prompt_tps: float
    gen_tps: float
    running: int
    waiting: int
    kv_cache_pct: float | None = None


@dataclass
class Settings:
    """The engine settings of a run, as the simulator takes them; ``*_from`` say where each
    value came from."""

    model: str
    model_from: str
    hardware: str
    hardware_from: str
    tp: int
    dp: int
    expert_parallel: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int            # 0 = the model's own
    block_size: int
    kv_blocks: int | None         # None = the simulator's capacity model
    gpu_memory_utilization: float
    prefix_caching: bool
    seed: int
    model_config_folder: str = ""  # a HuggingFace config.json folder of the run ("" = the catalog's)


@dataclass
class MeasuredRun:
    """A measured run, ready to compare with a replay.

    Fields:

    * ``name`` — the run's name (its folder, or the prefix of converted files);
    * ``settings`` — :class:`Settings` (None when the source records none, e.g. a ``vllm
      bench`` result);
    * ``requests`` — :class:`RealRequest` per measured request, in the log's order;
    * ``prompts`` — per request (same order) the prompt token IDs, or None when unknown;
    * ``outputs`` — per request the output token IDs, or None when the source has none;
    * ``ticks`` — the 1 s timeseries (:class:`Tick`), empty when the log has none; ``t_s``
      is on the log's own axis, which the converter takes as seconds after the earliest
      arrival (docs/workloads.md explains the check);
    * ``q0_s`` — the earliest arrival on the log's clock (s; 0 for converted runs);
    * ``header`` / ``records`` — the run as TraceV2 (mode ``real``), rows sorted by arrival;
      replaying them with ``blis-simpy replay`` gives the simulated twin;
    * ``notes`` — what was assumed or filled in while reading;
    * ``source`` — the file or folder it was read from;
    * ``logged_as`` — for converted files, the name of the logged run they were converted
      from (the name of ``PREFIX.scenario.yaml``, which ``convert vllm-log`` writes), else
      empty: a coefficient set's ``fit.runs`` may name the run either way.
    """

    name: str
    settings: Settings | None
    requests: list[RealRequest]
    prompts: list | None
    outputs: list | None
    ticks: list[Tick]
    q0_s: float
    notes: list[str] = field(default_factory=list)
    header: TraceHeader | None = None
    records: list[TraceRecord] = field(default_factory=list)
    source: str = ""
    logged_as: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        """The names the run goes by: its own, and the logged run's it was converted from."""
        return (self.name, self.logged_as) if self.logged_as else (self.name,)


def latencies(first_s: float, last_s: float, start_s: float, n_out: int) -> tuple[float, float, float | None]:
    """TTFT, E2E and TPOT in ms from the start, first-token and last-token times (s):
    TTFT = first − start, E2E = last − start, TPOT = (last − first)/(n_out − 1), None for a
    single output token."""
    return ((first_s - start_s) * 1000.0, (last_s - start_s) * 1000.0,
            (last_s - first_s) * 1000.0 / (n_out - 1) if n_out > 1 else None)


# ----------------------------------------------------------------------- aggregate runs
#: latency metrics an aggregate run reports, in this order: time to first token, inter-token
#: latency (every gap between streamed chunks, pooled), time per output token (per request),
#: request latency (E2E)
AGG_METRICS = ("ttft", "itl", "tpot", "e2e")
#: the statistics compared for each metric
AGG_STATS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class StageWindow:
    """One load stage of an aggregate run on the rebuilt clock: ``start_us`` is when its load
    timer started (its sends fall in ``(start_us, end_us]``, ``end_us`` = start + duration),
    ``rate_rps`` its rate (requests/s), and its requests are ``records[first : first + count]``."""

    index: int
    start_us: int
    end_us: int
    rate_rps: float
    first: int
    count: int


@dataclass(frozen=True)
class AggregateStats:
    """What a results file says about a set of requests (one stage, or the whole run):
    success and failure counts; per latency metric of :data:`AGG_METRICS` its
    ``{mean, p50, p90, p99}`` in ms over the successes (a metric the file leaves null is
    absent); the mean prompt and output lengths of the successes (tokens, as the client
    counted them; None without successes); the longest latency of any request, success or
    failure (ms: how long the stage took to drain after its last send, at most)."""

    successes: int
    failures: int
    latency_ms: dict[str, dict[str, float]]
    prompt_len_mean: float | None
    output_len_mean: float | None
    max_latency_ms: float


@dataclass
class AggregateRun:
    """A measured run known only by its aggregate metrics (an inference-perf results folder),
    with the workload rebuilt as the tool generated it.

    Fields: ``name``; ``source`` (the folder read); ``settings`` (:class:`Settings` when the
    run records its engine, else None); ``header``/``records`` the rebuilt workload as
    TraceV2 (client send times as arrivals, ``deadline_us`` from the client timeout, prompt
    token IDs that realise the shared prefixes), sorted by send time, stage after stage;
    ``stages`` (:class:`StageWindow`); ``real_stages`` per stage and ``real_total`` for the
    whole run (None when the folder has no summary) the measured :class:`AggregateStats`;
    ``timeout_us`` the client's request timeout (None: none); ``pause_us`` the client's pause
    between one stage draining and the next one's timer starting; ``decoded_output_len``
    the mean number of tokens the server decoded per successful request (the three-number
    score's ITL divides by it minus 1); ``seed`` the seed of the rebuild; ``measured_at``
    where the latencies were measured (``"client"``); ``notes`` what was assumed;
    ``spec`` the parsed configuration (to rebuild with another seed)."""

    name: str
    source: str
    settings: Settings | None
    header: TraceHeader
    records: list[TraceRecord]
    stages: list[StageWindow]
    real_stages: list[AggregateStats]
    real_total: AggregateStats | None
    timeout_us: int | None
    pause_us: int
    decoded_output_len: float
    seed: int
    measured_at: str = "client"
    notes: list[str] = field(default_factory=list)
    spec: object = None

    @property
    def names(self) -> tuple[str, ...]:
        """The names the run goes by (:attr:`MeasuredRun.names`)."""
        return (self.name,)
