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
  ``workload-<name>`` in ``DIR`` and in ``DIR``'s parent (or given explicitly): one request a
  line with ``input_toks``, ``output_toks``, ``input_tok_ids`` (the real prompt) and
  optionally ``output_tok_ids``.

:func:`load_vllm_log` returns an :class:`~blis_simpy.observed.run.ObservedRun`. Every
malformed input is a :class:`ConfigError` naming the file, line and field. Inputs are capped
(:data:`MAX_ROWS` lines a file, :data:`MAX_TOKEN_IDS` token IDs a workload,
:data:`MAX_FILE_BYTES` bytes a file).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
from pathlib import Path

import numpy as np

from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.models import builtin_models
from blis_simpy.errors import ConfigError
from blis_simpy.observed.run import ObservedRun, RealRequest, Settings, Tick, latencies
from blis_simpy.rng import numpy_rng
from blis_simpy.workload.replay import VOCAB_SIZE
from blis_simpy.workload.tracev2 import MAX_TOKEN_IDS_PER_FILE, TraceHeader, TraceRecord, TraceServer

MAX_ROWS = 1_000_000                     # lines of one JSONL / CSV file
MAX_FILE_BYTES = 2 << 30                 # 2 GiB: any one input file
MAX_META_BYTES = 64 << 20                # meta.json
MAX_TOKEN_IDS = MAX_TOKEN_IDS_PER_FILE   # token IDs of one workload file (all lines)


def _number(v, *, integer: bool = False) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if integer:
        return isinstance(v, int) or (float(v).is_integer() and math.isfinite(v))
    return math.isfinite(v)


def read_jsonl(path: Path, numbers: tuple[str, ...] = (), integers: tuple[str, ...] = (),
               id_lists: tuple[str, ...] = ()) -> list[dict]:
    """The rows of a JSONL file; each named key must be present with the right type
    (``id_lists``: lists of token IDs, integers >= 0)."""
    try:
        return _read_jsonl(path, numbers, integers, id_lists)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not valid UTF-8 ({exc.reason})", file=str(path)) from None


def _read_jsonl(path: Path, numbers: tuple[str, ...], integers: tuple[str, ...],
                id_lists: tuple[str, ...]) -> list[dict]:
    if not path.is_file():
        raise ConfigError("missing file", file=str(path))
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ConfigError(f"larger than {MAX_FILE_BYTES} bytes", file=str(path))
    rows = []
    n_ids = 0
    with open(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            if len(rows) >= MAX_ROWS:
                raise ConfigError(f"more than {MAX_ROWS} rows", file=str(path), line=ln)
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"not JSON: {exc.msg}", file=str(path), line=ln) from None
            if not isinstance(row, dict):
                raise ConfigError("not a JSON object", file=str(path), line=ln)
            for key in numbers + integers:
                if not _number(row.get(key), integer=key in integers):
                    kind = "an integer" if key in integers else "a finite number"
                    raise ConfigError(f"missing or not {kind}", file=str(path), line=ln, field=key)
            for key in id_lists:
                ids = row.get(key)
                if not isinstance(ids, list) or not all(type(x) is int and x >= 0 for x in ids):
                    raise ConfigError("missing or not a list of token IDs (integers >= 0)",
                                      file=str(path), line=ln, field=key)
                n_ids += len(ids)
                if n_ids > MAX_TOKEN_IDS:
                    raise ConfigError(f"more than {MAX_TOKEN_IDS} token IDs in the file",
                                      file=str(path), line=ln, field=key)
            rows.append(row)
    if not rows:
        raise ConfigError("no rows", file=str(path))
    return rows


def read_json_object(path: Path, max_bytes: int) -> dict:
    """A JSON file holding one object, at most ``max_bytes``; errors are located."""
    if not path.is_file():
        raise ConfigError("missing file", file=str(path))
    if path.stat().st_size > max_bytes:
        raise ConfigError(f"larger than {max_bytes} bytes", file=str(path))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not JSON: {exc.msg}", file=str(path), line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not valid UTF-8 ({exc.reason})", file=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("not a JSON object", file=str(path))
    return data


def read_meta(path: Path) -> dict:
    """meta.json: a JSON object with an ``engine_kwargs`` object."""
    meta = read_json_object(path, MAX_META_BYTES)
    if not isinstance(meta.get("engine_kwargs"), dict):
        raise ConfigError("no engine_kwargs object", file=str(path), field="engine_kwargs")
    return meta


def read_ticks(path: Path) -> list[Tick]:
    """timeseries.csv: ``t,prompt_throughput,gen_throughput,running,waiting[,kv_cache_pct]``
    (``t_s`` instead of ``t`` is accepted, as ``convert`` writes it)."""
    try:
        return _read_ticks(path)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not valid UTF-8 ({exc.reason})", file=str(path)) from None
    except csv.Error as exc:
        raise ConfigError(f"malformed CSV: {exc}", file=str(path)) from None


def _read_ticks(path: Path) -> list[Tick]:
    if not path.is_file():
        raise ConfigError("missing file", file=str(path))
    ticks = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        names = reader.fieldnames or []
        t_col = "t_s" if "t_s" in names and "t" not in names else "t"
        need = (t_col, "prompt_throughput", "gen_throughput", "running", "waiting")
        missing = [c for c in need if c not in names]
        if missing:
            raise ConfigError(f"missing column(s) {', '.join(missing)}", file=str(path), line=1)
        has_kv = "kv_cache_pct" in names
        for ln, row in enumerate(reader, 2):
            if len(ticks) >= MAX_ROWS:
                raise ConfigError(f"more than {MAX_ROWS} rows", file=str(path), line=ln)
            try:
                vals = [float(row[c]) for c in need]
                kv = float(row["kv_cache_pct"]) if has_kv and row["kv_cache_pct"] not in ("", None) else None
            except (TypeError, ValueError):
                raise ConfigError("not a number in a needed column", file=str(path), line=ln) from None
            if not all(math.isfinite(v) and v >= 0 for v in vals) or not all(
                    v.is_integer() for v in vals[3:]) or (kv is not None and not 0 <= kv <= 100):
                raise ConfigError("values must be finite, >= 0, gauges integers, kv_cache_pct "
                                  "in [0, 100]", file=str(path), line=ln)
            ticks.append(Tick(vals[0], vals[1], vals[2], int(vals[3]), int(vals[4]), kv))
    if not ticks:
        raise ConfigError("no rows", file=str(path))
    return ticks


def _index(rid: str, ln: int) -> int:
    """The workload line of a request: the number ending its id (``bench-12`` → 12), else
    its own line index."""
    m = re.fullmatch(r"[A-Za-z_-]*?(\d+)", rid)
    return int(m.group(1)) if m else ln - 1


def _scheduled(r: dict, q: float, first: float, file: str, ln: int) -> float | None:
    """The row's ``scheduled_ts`` (s): None when absent or null, else a finite number with
    queued_ts <= scheduled_ts <= first_token_ts."""
    s = r.get("scheduled_ts")
    if s is None:
        return None
    if not _number(s):
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
        sched = _scheduled(r, q, first, file, ln)
        rid = str(r.get("request_id", f"bench-{ln - 1}"))
        ttft, e2e, tpot = latencies(first, last, q, n_out)
        out.append(RealRequest(
            id=rid, arrival_us=round((q - q0) * 1e6), input_toks=int(r["input_toks"]),
            output_toks=n_out, first_token_s=first, last_token_s=last, ttft_ms=ttft, e2e_ms=e2e,
            tpot_ms=tpot, trace_id=_index(rid, ln),
            sched_ms=None if sched is None else (sched - q) * 1000.0, scheduled_s=sched))
    return out


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("geforce", ""))


def find_gpu(meta: dict, run_name: str) -> tuple[str, str]:
    """The catalog GPU of a run: meta.json ``hardware.device_name`` (longest catalog name or
    alias it starts with), else the longest catalog name or alias in the run folder's name."""
    names = {}
    for key, e in builtin_gpus().entries.items():
        for n in (key, *e.aliases):
            names[_norm(n)] = key
    dev = (meta.get("hardware") or {}).get("device_name")
    if isinstance(dev, str) and dev:
        hits = [n for n in names if n and _norm(dev).startswith(n)]
        if hits:
            return names[max(hits, key=len)], f"meta.json hardware.device_name {dev!r}"
        raise ConfigError(f"device {dev!r} is not in the GPU catalog", field="hardware.device_name")
    hits = [n for n in names if n and n in _norm(run_name)]
    if not hits:
        raise ConfigError(f"run {run_name}: meta.json has no hardware.device_name and the folder name "
                          "names no catalog GPU", field="hardware")
    return names[max(hits, key=len)], "run folder name (meta.json has no hardware record)"


def find_model(name: str) -> tuple[str, str]:
    """The catalog model: the run's own name, else its ``-instruct`` variant (same shape)."""
    cat = builtin_models()
    m = name.lower()
    if cat.find(m) is not None:
        return m, "meta.json model"
    if cat.find(m + "-instruct") is not None:
        return m + "-instruct", f"{m} is not in the model catalog; its -instruct variant has the same shape"
    raise ConfigError(f"model {m!r} (nor {m}-instruct) is not in the model catalog", field="model")


def engine_settings(meta: dict, run_name: str, path: Path) -> Settings:
    """The simulator's settings from meta.json (errors name ``path``)."""
    kw = meta["engine_kwargs"]
    kv = meta.get("kv_cache") or {}

    def need_int(key: str, default=None, positive=True) -> int:
        v = kw.get(key, default)
        if v is None or not _number(v, integer=True) or (positive and v < 1):
            raise ConfigError("missing or not a positive integer", file=str(path), field=f"engine_kwargs.{key}")
        return int(v)

    def kv_value(key: str, default, ok, what: str):
        v = kv.get(key)
        if v is None:
            return default
        if not ok(v):
            raise ConfigError(f"not {what}", file=str(path), field=f"kv_cache.{key}")
        return v

    if not isinstance(kv, dict):
        raise ConfigError("not a JSON object", file=str(path), field="kv_cache")
    try:
        model, model_from = find_model(str(meta.get("model") or kw.get("model") or ""))
        hw, hw_from = find_gpu(meta, run_name)
    except ConfigError as exc:
        raise ConfigError(exc.problem, file=str(path), field=exc.field) from None
    mml = kw.get("max_model_len")
    pos_int = lambda v: _number(v, integer=True) and v > 0   # noqa: E731
    blocks = kv_value("num_gpu_blocks", None, pos_int, "a positive integer")
    util = kv_value("gpu_memory_utilization", 0.9, lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]")
    seed = kw.get("seed")
    if seed is not None and not _number(seed, integer=True):
        raise ConfigError("not an integer", file=str(path), field="engine_kwargs.seed")
    return Settings(
        model=model, model_from=model_from, hardware=hw, hardware_from=hw_from,
        tp=need_int("tensor_parallel_size", 1), dp=need_int("data_parallel_size", 1),
        expert_parallel=bool(kw.get("enable_expert_parallel", False)),
        max_num_seqs=need_int("max_num_seqs"), max_num_batched_tokens=need_int("max_num_batched_tokens"),
        max_model_len=need_int("max_model_len") if mml is not None else 0,
        block_size=int(kv_value("block_size", 16, pos_int, "a positive integer")),
        kv_blocks=int(blocks) if blocks is not None else None,
        gpu_memory_utilization=float(util),
        prefix_caching=bool(kv.get("enable_prefix_caching", True)),
        seed=int(seed or 0))


def workload_path(run_dir: Path, meta: dict, explicit: Path | None = None,
                  meta_path: Path | None = None) -> Path:
    """The workload file: ``explicit`` if given, else the one meta.json ``dataset_path``
    names, as ``<name>`` or ``workload-<name>`` in ``run_dir`` or in its parent. Checked
    against ``dataset_hash`` (SHA-256) when meta.json records one."""
    where = str(meta_path or run_dir / "meta.json")
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError("missing file", file=str(explicit), field="--workload")
        cands = [explicit]
    else:
        name = os.path.basename(str(meta.get("dataset_path") or ""))
        if not name:
            raise ConfigError("no dataset_path (or pass --workload FILE)", file=where,
                              field="dataset_path")
        cands = [d / n for d in (run_dir, run_dir.parent) for n in (name, f"workload-{name}")]
    for cand in cands:
        if cand.is_file():
            want = meta.get("dataset_hash")
            if isinstance(want, str) and want:
                got = hashlib.sha256(cand.read_bytes()).hexdigest()
                if got != want:
                    raise ConfigError(f"SHA-256 {got} is not the run's dataset_hash {want}", file=str(cand))
            return cand
    raise ConfigError(f"missing file: workload {name} (looked for {name} and workload-{name} in "
                      f"{run_dir} and {run_dir.parent}; or pass --workload FILE)", file=where,
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
                  require_ticks: bool = False) -> ObservedRun:
    """Read and check one raw vLLM run folder and its workload (module docstring).

    Returns an :class:`ObservedRun` whose ``requests`` follow requests.jsonl, ``prompts`` are
    the workload's ``input_tok_ids``, ``outputs`` its ``output_tok_ids`` (drawn uniformly
    from the run's seed where missing, with a note), ``ticks`` the timeseries (empty when
    there is none, an error with ``require_ticks``), and ``header``/``records`` the run as
    TraceV2 (:func:`trace_of`)."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise ConfigError("missing folder", file=str(folder))
    mpath = folder / "meta.json"
    meta = read_meta(mpath)
    st = engine_settings(meta, folder.name, mpath)
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
    run = ObservedRun(folder.name, st, reqs, prompts, outputs, ticks, q0, notes, source=str(folder))
    run.header, run.records = trace_of(run, meta)
    return run


def trace_of(run: ObservedRun, meta: dict) -> tuple[TraceHeader, list[TraceRecord]]:
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
