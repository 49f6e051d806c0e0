"""Reading a real vLLM run log: ``requests.jsonl``, ``meta.json``, ``timeseries.csv`` and the
workload JSONL the run was sent.

Layout of a run folder ``DIR`` (docs/workloads.md, "vllm-log"):

* ``DIR/requests.jsonl`` — one measured request a line: ``request_id`` (``bench-<i>`` = line
  ``i`` of the workload), ``input_toks``, ``output_toks`` and monotonic-clock seconds
  ``queued_ts``, ``scheduled_ts``, ``first_token_ts``, ``last_token_ts``;
* ``DIR/meta.json`` — ``model``, ``engine_kwargs`` (tensor/data parallel size, expert
  parallel, max_num_seqs, max_num_batched_tokens, max_model_len, seed), optional
  ``kv_cache`` (num_gpu_blocks, block_size, gpu_memory_utilization, enable_prefix_caching),
  ``hardware.device_name``, ``dataset_path`` and ``dataset_hash`` (SHA-256 of the workload);
* ``DIR/timeseries.csv`` (optional) — 1 s ticks ``t, prompt_throughput, gen_throughput,
  running, waiting, kv_cache_pct``;
* the workload JSONL named by ``dataset_path``, looked for as ``<name>`` and
  ``workload-<name>`` in ``DIR`` and in ``DIR``'s parent, then as ``dataset_path`` itself
  under ``DIR``'s ancestors (or given explicitly): one request a line with ``input_toks``,
  ``output_toks``, ``input_tok_ids`` (the real prompt) and optionally ``output_tok_ids``.

The public LLMServingSim repository's runs are read as they are laid out there
(:func:`run_folder`): ``bench/examples/<hw>/<model>/vllm/`` holds the three files and
``dataset_path`` (``workloads/<name>.jsonl``) is relative to the repository's root, an
ancestor. ``DIR`` may be the ``vllm/`` folder or the ``<hw>/<model>/`` one above it; the run
is named ``vllm-<hw>-<model>``, lower-cased (``vllm-rtx4090-llama-3.1-8b``).

:func:`load_vllm_log` returns a :class:`~blis_simpy.measured.run.MeasuredRun`. Every
malformed input is a :class:`ConfigError` naming the file, line and field. Inputs are capped
(:mod:`blis_simpy.measured.files`: lines, token IDs and bytes a file). meta.json is read into
the simulator's settings by :mod:`blis_simpy.measured.vllm_meta`. Times in the log are
seconds; the trace built from it is in integer µs.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

from blis_simpy.errors import ConfigError
from blis_simpy.measured.files import is_number, read_jsonl, read_ticks
from blis_simpy.measured.run import MeasuredRun, RealRequest, latencies
from blis_simpy.measured.vllm_bench import MAX_SECONDS
from blis_simpy.measured.vllm_meta import engine_settings, read_meta
from blis_simpy.rng import numpy_rng
from blis_simpy.workload.replay import VOCAB_SIZE
from blis_simpy.workload.tracev2 import TraceHeader, TraceRecord, TraceServer


def _index(rid: str, ln: int, file: str) -> int:
    """The workload line of a request: the number ending its id (``bench-12`` → 12), else
    its own line index. A number of more than 18 digits is an error (no workload has that
    many lines; int() would refuse thousands of digits)."""
    m = re.fullmatch(r"[A-Za-z_-]*?(\d+)", rid)
    if m and len(m.group(1).lstrip("0")) > 18:
        raise ConfigError("the number ending the id is too large for a workload line", file=file,
                          line=ln, field="request_id")
    return int(m.group(1)) if m else ln - 1


def _scheduled(r: dict, q: float, first: float, file: str, ln: int) -> float | None:
    """The row's ``scheduled_ts`` (s): None when absent or null, else a finite number with
    queued_ts <= scheduled_ts <= first_token_ts."""
    s = r.get("scheduled_ts")
    if s is None:
        return None
    if not is_number(s):
        raise ConfigError("not a finite number", file=file, line=ln, field="scheduled_ts")
    if not q <= s <= first:
        raise ConfigError("needs queued_ts <= scheduled_ts <= first_token_ts", file=file, line=ln,
                          field="scheduled_ts")
    return float(s)


def real_requests(rows: list[dict], *, file: str = "requests.jsonl") -> list[RealRequest]:
    """Per-request latencies of the log: TTFT = first_token_ts − queued_ts, E2E =
    last_token_ts − queued_ts, TPOT = (last − first)/(output_toks − 1), scheduling delay =
    scheduled_ts − queued_ts (None where the row has no ``scheduled_ts``); arrival =
    queued_ts minus the earliest queued_ts, rounded to the nearest µs. ``trace_id`` is the
    workload line (:func:`_index`)."""
    q0 = min(float(r["queued_ts"]) for r in rows)
    out = []
    for ln, r in enumerate(rows, 1):
        q, first, last = float(r["queued_ts"]), float(r["first_token_ts"]), float(r["last_token_ts"])
        n_out = int(r["output_toks"])
        if not q <= first <= last or n_out < 1 or int(r["input_toks"]) < 1:
            raise ConfigError("needs queued_ts <= first_token_ts <= last_token_ts and at least one "
                              "input and one output token", file=file, line=ln)
        if last - q0 > MAX_SECONDS:     # µs of such times overflow (1e308 s was an OverflowError)
            raise ConfigError(f"more than {MAX_SECONDS:g} s after the earliest queued_ts", file=file,
                              line=ln, field="last_token_ts" if q - q0 <= MAX_SECONDS else "queued_ts")
        sched = _scheduled(r, q, first, file, ln)
        rid = str(r.get("request_id", f"bench-{ln - 1}"))
        ttft, e2e, tpot = latencies(first, last, q, n_out)
        out.append(RealRequest(
            id=rid, arrival_us=round((q - q0) * 1e6), input_toks=int(r["input_toks"]),
            output_toks=n_out, first_token_s=first, last_token_s=last, ttft_ms=ttft, e2e_ms=e2e,
            tpot_ms=tpot, trace_id=_index(rid, ln, file),
            sched_ms=None if sched is None else (sched - q) * 1000.0, scheduled_s=sched))
    return out


#: the folder of an LLMServingSim example that holds the vLLM log (``<hw>/<model>/vllm/``)
LLMSERVINGSIM_LOG = "vllm"


def run_folder(folder: Path) -> tuple[Path, str]:
    """``(the folder holding meta.json, the run's name)``: ``folder`` itself, named by it;
    or an LLMServingSim example — ``<hw>/<model>/vllm/`` given as that folder or as
    ``<hw>/<model>/`` — named ``vllm-<hw>-<model>`` lower-cased (module docstring)."""
    if not (folder / "meta.json").is_file() and (folder / LLMSERVINGSIM_LOG / "meta.json").is_file():
        folder = folder / LLMSERVINGSIM_LOG
    if folder.name == LLMSERVINGSIM_LOG:
        example = folder.resolve().parent
        return folder, f"vllm-{example.parent.name}-{example.name}".lower()
    return folder, folder.name


def workload_path(run_dir: Path, meta: dict, explicit: Path | None = None,
                  meta_path: Path | None = None) -> Path:
    """The workload file: ``explicit`` if given, else the one meta.json ``dataset_path``
    names, as ``<name>`` or ``workload-<name>`` in ``run_dir`` or in its parent, then as the
    relative ``dataset_path`` itself under each ancestor of ``run_dir`` (nearest first: an
    LLMServingSim run's ``workloads/<name>.jsonl`` at the repository's root). Checked
    against ``dataset_hash`` (SHA-256) when meta.json records one."""
    where = str(meta_path or run_dir / "meta.json")
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError("missing file", file=str(explicit), field="--workload")
        cands = [explicit]
    else:
        given = str(meta.get("dataset_path") or "")
        name = os.path.basename(given)
        if not name:
            raise ConfigError("no dataset_path (or pass --workload FILE)", file=where,
                              field="dataset_path")
        cands = [d / n for d in (run_dir, run_dir.parent) for n in (name, f"workload-{name}")]
        rel = Path(given)
        if not rel.is_absolute() and ".." not in rel.parts and len(rel.parts) > 1:
            cands += [d / rel for d in run_dir.resolve().parents]
    for cand in cands:
        if cand.is_file():
            want = meta.get("dataset_hash")
            if isinstance(want, str) and want:
                got = hashlib.sha256(cand.read_bytes()).hexdigest()
                if got != want:
                    raise ConfigError(f"SHA-256 {got} is not the run's dataset_hash {want}", file=str(cand))
            return cand
    above = f", and {given} above it" if len(cands) > 4 else ""
    raise ConfigError(f"missing file: workload {name} (looked for {name} and workload-{name} in "
                      f"{run_dir} and {run_dir.parent}{above}; or pass --workload FILE)", file=where,
                      field="dataset_path")


#: parsed workload files by (path, size, mtime): two runs of one workload read it once
_workloads: dict[tuple[str, int, int], list[dict]] = {}


def read_workload(path: Path) -> list[dict]:
    """The workload JSONL (``input_toks``, ``output_toks``, ``input_tok_ids``), cached."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _workloads:
        _workloads.clear()
        _workloads[key] = read_jsonl(path, integers=("input_toks", "output_toks"),
                                     id_lists=("input_tok_ids",))
    return _workloads[key]


def load_vllm_log(run_dir: str | os.PathLike, workload: str | os.PathLike | None = None, *,
                  require_ticks: bool = False) -> MeasuredRun:
    """Read and check one raw vLLM run folder and its workload (module docstring).

    Returns a :class:`MeasuredRun` whose ``requests`` follow requests.jsonl, ``prompts`` are
    the workload's ``input_tok_ids``, ``outputs`` its ``output_tok_ids`` (drawn uniformly
    from the run's seed where missing, with a note), ``ticks`` the timeseries (empty when
    there is none, an error with ``require_ticks``), and ``header``/``records`` the run as
    TraceV2 (:func:`trace_of`)."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise ConfigError("missing folder", file=str(folder))
    folder, name = run_folder(folder)
    mpath = folder / "meta.json"
    meta = read_meta(mpath)
    st = engine_settings(meta, name, mpath)
    wpath = workload_path(folder, meta, Path(workload) if workload is not None else None, mpath)
    work = read_workload(wpath)
    rpath = folder / "requests.jsonl"
    rows = read_jsonl(rpath, numbers=("queued_ts", "first_token_ts", "last_token_ts"),
                      integers=("input_toks", "output_toks"))
    reqs = real_requests(rows, file=str(rpath))
    prompts, outputs, notes = [], [], []
    synth = 0
    rng = numpy_rng(st.seed)
    seen: dict[int, int] = {}
    for ln, r in enumerate(reqs, 1):
        i = r.trace_id
        if seen.setdefault(i, ln) != ln:
            raise ConfigError(f"request {r.id} maps to workload line {i + 1} like line {seen[i]}",
                              file=str(rpath), line=ln, field="request_id")
        if i >= len(work):
            raise ConfigError(f"request {r.id} has no workload line {i + 1}", file=str(rpath), line=ln)
        w = work[i]
        if (w["input_toks"], w["output_toks"]) != (r.input_toks, r.output_toks) or \
                len(w["input_tok_ids"]) != r.input_toks:
            raise ConfigError(f"token counts differ from workload line {i + 1}", file=str(rpath), line=ln)
        prompts.append(w["input_tok_ids"])
        outs = w.get("output_tok_ids")
        if isinstance(outs, list) and len(outs) == r.output_toks:
            outputs.append(outs)
        else:
            synth += 1
            outputs.append(rng.integers(0, VOCAB_SIZE, size=r.output_toks).tolist())
    if synth:
        notes.append(f"{synth} requests have no output token IDs: drawn uniformly (seed {st.seed})")
    tpath = folder / "timeseries.csv"
    ticks = read_ticks(tpath) if require_ticks or tpath.exists() else []
    q0 = min(float(r["queued_ts"]) for r in rows)
    run = MeasuredRun(name, st, reqs, prompts, outputs, ticks, q0, notes, source=str(folder))
    run.header, run.records = trace_of(run, meta)
    return run


def trace_of(run: MeasuredRun, meta: dict) -> tuple[TraceHeader, list[TraceRecord]]:
    """The run as TraceV2, mode ``real``: per request ``arrival_time_us`` = ``send_time_us`` =
    queued_ts − the earliest queued_ts, ``first_chunk_time_us`` / ``last_chunk_time_us`` its
    first / last token and ``scheduled_time_us`` its scheduled_ts on the same origin (all
    rounded to the nearest µs; ``scheduled_time_us`` 0 when not logged); ``input_tokens``
    and ``input_token_ids`` the real prompt (no prefix group: sharing is in the IDs);
    ``server_input_tokens`` the server's count; streaming, status ``ok``; ``num_chunks`` 0
    and ``finish_reason`` empty (the log does not say); ``model`` empty (the header's
    ``server.model`` names it; a row model would restrict routing). Rows sorted by arrival
    (stable); ``request_id`` is the workload line."""
    st = run.settings
    records = []
    for r, ids in zip(run.requests, run.prompts, strict=True):
        us = lambda t: round((t - run.q0_s) * 1e6)   # noqa: E731
        records.append(TraceRecord(
            request_id=r.trace_id, streaming=True, input_tokens=r.input_toks,
            output_tokens=r.output_toks, server_input_tokens=r.input_toks,
            arrival_time_us=r.arrival_us, send_time_us=r.arrival_us,
            first_chunk_time_us=us(r.first_token_s), last_chunk_time_us=us(r.last_token_s),
            status="ok", input_token_ids=np.asarray(ids, dtype=np.int32),
            scheduled_time_us=0 if r.scheduled_s is None else us(r.scheduled_s)))
    records.sort(key=lambda rec: rec.arrival_time_us)
    created = meta.get("started_at")
    server = TraceServer(
        type="vllm", model=str(meta.get("model") or meta["engine_kwargs"].get("model") or ""),
        tensor_parallel=st.tp, max_num_seqs=st.max_num_seqs, block_size=st.block_size,
        gpu_memory_utilization=st.gpu_memory_utilization, max_model_len=st.max_model_len)
    header = TraceHeader(trace_version=2, mode="real", created_at=created if isinstance(created, str) else "",
                         warm_up_requests=0, server=server)
    return header, records
