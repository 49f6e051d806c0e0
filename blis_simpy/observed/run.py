"""What a real serving run was measured to do: :class:`ObservedRun` and its parts.

A run comes from a raw vLLM log (:mod:`blis_simpy.observed.vllm_log`), from the result file of
``vllm bench serve`` (:mod:`blis_simpy.observed.vllm_bench`) or from the files ``blis-simpy
convert`` wrote (:mod:`blis_simpy.observed.converted`). Every time is on one origin: the
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


@dataclass
class ObservedRun:
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
    * ``source`` — the file or folder it was read from.
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


def latencies(first_s: float, last_s: float, start_s: float, n_out: int) -> tuple[float, float, float | None]:
    """TTFT, E2E and TPOT in ms from the start, first-token and last-token times (s):
    TTFT = first − start, E2E = last − start, TPOT = (last − first)/(n_out − 1), None for a
    single output token."""
    return ((first_s - start_s) * 1000.0, (last_s - start_s) * 1000.0,
            (last_s - first_s) * 1000.0 / (n_out - 1) if n_out > 1 else None)
