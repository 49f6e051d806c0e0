"""The files ``blis-simpy convert vllm-log|vllm-bench`` writes, and reading them back.

For an output ``PREFIX``:

* ``PREFIX.header.yaml`` + ``PREFIX.csv`` — the run as TraceV2, mode ``real``
  (:mod:`blis_simpy.workload.tracev2`; vllm-log rows carry ``input_token_ids`` and, when
  the log has ``scheduled_ts``, ``scheduled_time_us``);
* ``PREFIX.scenario.yaml`` — (vllm-log) a scenario with the run's model, GPU, parallelism and
  engine settings whose workload is that trace: ``blis-simpy replay --scenario`` runs it;
* ``PREFIX.timeseries.csv`` — (vllm-log, when the log has ticks) ``t_s, running, waiting,
  kv_cache_pct, prompt_throughput, gen_throughput``.

Every file is written to a temporary name first and renamed into place only when all are
written (:func:`write_files`). :func:`load_measured` reads a raw vLLM run folder, a ``vllm
bench`` result JSON or a converted ``PREFIX`` into a :class:`MeasuredRun`; :func:`load_run`
also an inference-perf results folder (an :class:`AggregateRun`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import yaml

from blis_simpy.atomic import Batch, atomic_write
from blis_simpy.config.loader import load_scenario
from blis_simpy.errors import ConfigError
from blis_simpy.measured.files import read_ticks
from blis_simpy.measured.inference_perf import is_inference_perf, load_inference_perf
from blis_simpy.measured.run import AggregateRun, MeasuredRun, RealRequest, Settings, Tick, latencies
from blis_simpy.measured.vllm_bench import load_vllm_bench
from blis_simpy.measured.vllm_log import load_vllm_log
from blis_simpy.units import MAX_INT64
from blis_simpy.workload.tracev2_read import read_trace_header, read_trace_records
from blis_simpy.workload.tracev2_write import header_to_yaml, trace_csv_text

SUFFIXES = {"header": ".header.yaml", "data": ".csv", "scenario": ".scenario.yaml",
            "timeseries": ".timeseries.csv"}
TIMESERIES_COLUMNS = ("t_s", "running", "waiting", "kv_cache_pct", "prompt_throughput", "gen_throughput")


def paths(prefix: str | os.PathLike, field: str | None = None) -> dict[str, Path]:
    """``{"header": PREFIX.header.yaml, "data": PREFIX.csv, ...}``. A prefix with no name of
    its own (empty, ``.``, ``..``, ``/``, ``DIR/.``) is a ConfigError naming it (and
    ``field``, the flag that gave it)."""
    p = Path(prefix)
    if p.name in ("", ".."):
        raise ConfigError(f"{str(prefix)!r} is not a file PREFIX (it names a directory): give "
                          "DIR/NAME for DIR/NAME.header.yaml, DIR/NAME.csv, ...", field=field)
    return {k: p.with_name(p.name + s) for k, s in SUFFIXES.items()}


# ---------------------------------------------------------------------------- writing
def _scalar(v) -> str:
    return yaml.safe_dump({"k": v}, width=10_000, allow_unicode=True)[3:].strip()


def _num(v: float) -> str:
    return np.format_float_positional(float(v), trim="-")


def timeseries_csv(ticks: list[Tick]) -> str:
    """The ticks as CSV (:data:`TIMESERIES_COLUMNS`; an unknown KV use is an empty cell)."""
    rows = [",".join(TIMESERIES_COLUMNS)]
    for t in ticks:
        kv = "" if t.kv_cache_pct is None else _num(t.kv_cache_pct)
        rows.append(f"{_num(t.t_s)},{t.running},{t.waiting},{kv},{_num(t.prompt_tps)},{_num(t.gen_tps)}")
    return "\n".join(rows) + "\n"


def scenario_yaml(run: MeasuredRun, header_name: str, data_name: str) -> str:
    """A scenario replaying ``run`` with its logged settings (``header_name``/``data_name``:
    the trace files, relative to the scenario file). ``horizon_us`` is MAX_INT64 so that
    every request runs to completion (replay's default, 2x the last arrival, can cut a real
    run short)."""
    st = run.settings
    n = len(run.records)
    span_s = max((r.arrival_time_us for r in run.records), default=0) / 1e6
    lines = [
        f"# The logged vLLM run {run.name}, written by `blis-simpy convert vllm-log`.",
        f"# model: {st.model_from}; hardware: {st.hardware_from}.",
        "# KV blocks: " + ("meta.json kv_cache.num_gpu_blocks" if st.kv_blocks is not None
                           else "not logged: the simulator's capacity model decides"),
    ]
    if not st.prefix_caching:
        lines.append("# The run had prefix caching OFF; the simulator always caches.")
    lines += [
        f"name: {_scalar(run.name)}",
        f"description: {_scalar(f'replay of a logged vLLM run ({n} requests arriving over {span_s:.2f} s)')}",
        f"seed: {st.seed}",
        f"horizon_us: {MAX_INT64}   # run every request to completion",
        f"model: {_scalar(st.model)}",
        f"hardware: {_scalar(st.hardware)}",
        f"tp: {st.tp}",
        f"dp: {st.dp}",
        f"enable_expert_parallel: {_scalar(st.expert_parallel)}",
        "latency:",
        "  model: physics                        # the command line's default backend",
        "engine:",
        f"{f'  max_num_running_reqs: {st.max_num_seqs}':<40}# vLLM max_num_seqs",
        f"{f'  max_num_scheduled_tokens: {st.max_num_batched_tokens}':<40}# vLLM max_num_batched_tokens",
        f"  block_size: {st.block_size}",
    ]
    if st.kv_blocks is not None:
        lines.append(f"  total_kv_blocks: {st.kv_blocks}")
    lines.append(f"  gpu_memory_utilization: {_scalar(st.gpu_memory_utilization)}")
    if st.max_model_len:
        lines.append(f"  max_model_len: {st.max_model_len}")
    lines += ["workload:", "  kind: trace", f"  header: {_scalar(header_name)}", f"  data: {_scalar(data_name)}"]
    return "\n".join(lines) + "\n"


def converted_files(run: MeasuredRun, prefix: str | os.PathLike) -> dict[Path, str]:
    """Every file of the conversion of ``run`` to ``prefix`` and its text (module docstring)."""
    p = paths(prefix)
    files = {p["header"]: header_to_yaml(run.header), p["data"]: trace_csv_text(run.records)}
    if run.settings is not None:
        files[p["scenario"]] = scenario_yaml(run, p["header"].name, p["data"].name)
    if run.ticks:
        files[p["timeseries"]] = timeseries_csv(run.ticks)
    return files


def write_files(files: dict[Path, str]) -> list[Path]:
    """Write every file all-or-nothing: temporary siblings first, renamed into place only
    when all are written. A failure is a ConfigError naming the file; nothing is left."""
    for final in files:                 # a rename that would fail: refuse before writing
        if final.is_dir():
            raise ConfigError("is a directory, expected a file path", file=str(final))
    batch = Batch()
    try:
        for final, text in files.items():
            with atomic_write(final, batch=batch, what="cannot write", binary=False) as f:
                f.write(text)
        batch.commit()
    finally:
        batch.abort()
    return list(files)


# ---------------------------------------------------------------------------- reading
def _settings(path: Path, s) -> Settings:
    e = s.engine
    return Settings(
        model=s.model, model_from=f"{path.name} model", hardware=s.hardware,
        hardware_from=f"{path.name} hardware", tp=s.tp or 1, dp=s.dp,
        expert_parallel=s.enable_expert_parallel, max_num_seqs=e.max_num_running_reqs,
        max_num_batched_tokens=e.max_num_scheduled_tokens, max_model_len=e.max_model_len,
        block_size=e.block_size, kv_blocks=e.total_kv_blocks,
        gpu_memory_utilization=e.gpu_memory_utilization, prefix_caching=True, seed=s.seed)


def load_converted(prefix: str | os.PathLike) -> MeasuredRun:
    """Read ``PREFIX.header.yaml`` + ``PREFIX.csv`` (and ``PREFIX.scenario.yaml``,
    ``PREFIX.timeseries.csv`` when present). ``requests`` are the rows with status ``ok``,
    at least one output token and chunk times (latencies from ``send_time_us``), named
    ``request_<request_id>`` like the replay names them; ``prompts`` the rows'
    ``input_token_ids`` (None when no row has them); ``outputs`` None; ``q0_s`` 0. A row's
    ``scheduled_time_us`` > 0 gives its scheduling delay ``sched_ms`` = (scheduled_time_us −
    send_time_us)/1000 (left unknown when not within send_time_us … first_chunk_time_us)."""
    p = paths(prefix)
    header = read_trace_header(p["header"])
    records = read_trace_records(p["data"])
    reqs, prompts = [], []
    for r in records:
        if r.status != "ok" or r.output_tokens < 1 or not r.send_time_us <= r.first_chunk_time_us \
                <= r.last_chunk_time_us or r.last_chunk_time_us == 0:
            continue
        first, last = r.first_chunk_time_us / 1e6, r.last_chunk_time_us / 1e6
        ttft, e2e, tpot = latencies(first, last, r.send_time_us / 1e6, r.output_tokens)
        sched = r.scheduled_time_us
        known = sched > 0 and r.send_time_us <= sched <= r.first_chunk_time_us
        reqs.append(RealRequest(
            id=f"request_{r.request_id}", arrival_us=r.arrival_time_us,
            input_toks=r.prefix_length + r.input_tokens, output_toks=r.output_tokens,
            first_token_s=first, last_token_s=last, ttft_ms=ttft, e2e_ms=e2e, tpot_ms=tpot,
            trace_id=r.request_id, sched_ms=(sched - r.send_time_us) / 1000.0 if known else None,
            scheduled_s=sched / 1e6 if known else None))
        prompts.append(r.input_token_ids)
    scenario = load_scenario(str(p["scenario"])) if p["scenario"].is_file() else None
    settings = _settings(p["scenario"], scenario) if scenario is not None else None
    ticks = read_ticks(p["timeseries"]) if p["timeseries"].is_file() else []
    has_ids = any(x is not None for x in prompts)
    return MeasuredRun(Path(prefix).name, settings, reqs, prompts if has_ids else None, None, ticks,
                       0.0, [], header, records, source=str(prefix),
                       logged_as=scenario.name if scenario is not None else "")


def load_run(path: str | os.PathLike, workload: str | os.PathLike | None = None) -> MeasuredRun | AggregateRun:
    """Any measured run :func:`load_measured` reads, or an inference-perf results folder
    (an :class:`AggregateRun`: aggregate metrics only, the workload rebuilt)."""
    if is_inference_perf(path):
        return load_inference_perf(path)
    return load_measured(path, workload)


def load_measured(path: str | os.PathLike, workload: str | os.PathLike | None = None) -> MeasuredRun:
    """Any measured run: a raw vLLM run folder (with ``meta.json``), a ``vllm bench`` result
    (``*.json``), or the ``PREFIX`` of converted files (``PREFIX.scenario.yaml`` or
    ``PREFIX.header.yaml`` also name it)."""
    p = Path(path)
    if p.is_dir():
        return load_vllm_log(p, workload)
    for s in (".scenario.yaml", ".header.yaml", ".csv"):
        if p.name.endswith(s) and p.name != s:
            return load_converted(p.with_name(p.name[: -len(s)]))
    if p.suffix == ".json":
        return load_vllm_bench(p)
    if paths(p)["header"].is_file():
        return load_converted(p)
    raise ConfigError("not a vLLM run folder, an inference-perf results folder, a vllm bench result "
                      "(.json) or the prefix of converted files (PREFIX.header.yaml + PREFIX.csv)", file=str(p))
