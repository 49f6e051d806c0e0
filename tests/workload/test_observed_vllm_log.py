"""Reading a vLLM run log and converting it (blis_simpy.measured): tiny hand-made folders
with exact figures, and the real runs (the shipped excerpt, and the full runs when present:
tests/data/README.md)."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.measured.converted import (
    converted_files,
    load_converted,
    load_measured,
    write_files,
)
from blis_simpy.measured.vllm_log import load_vllm_log
from blis_simpy.workload.replay import trace_requests
from blis_simpy.workload.tracev2_read import read_trace
from tests.conftest import REALDATA_FACTS, DataSource, data_sources

# request i: (queued_ts, first_token_ts, last_token_ts, prompt IDs, output_toks), seconds
REQS = [
    (100.0, 100.5, 102.5, [1, 2, 3, 4], 5),
    (100.25, 101.0, 101.0, [1, 2, 3], 1),
    (100.125, 100.375, 103.125, [7, 8, 9, 10, 11, 12], 3),     # arrives before request 1
]
TICKS = "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n1.0,13.0,5.0,2,1,12.5\n2.0,0.0,4.5,1,0,3.25\n"


def write_run(root: Path, *, meta_extra: dict | None = None, workload_in: str = "parent",
              ticks: bool = True) -> Path:
    run = root / "vllm-rtx4090-tiny"
    run.mkdir()
    work = (root if workload_in == "parent" else run) / "workload-wl.jsonl"
    with open(work, "w") as f:
        for _q, _a, _b, ids, n_out in REQS:
            f.write(json.dumps({"input_toks": len(ids), "output_toks": n_out, "arrival_time_ns": 0,
                                "input_tok_ids": ids}) + "\n")
    meta = {"model": "meta-llama/Llama-3.1-8B", "dataset_path": "workloads/wl.jsonl",
            "dataset_hash": hashlib.sha256(work.read_bytes()).hexdigest(), "started_at": "2026-01-02T03:04:05Z",
            "engine_kwargs": {"tensor_parallel_size": 1, "data_parallel_size": 1, "max_num_seqs": 8,
                              "max_num_batched_tokens": 64, "max_model_len": 4096, "seed": 7},
            "kv_cache": {"num_gpu_blocks": 100, "block_size": 16, "gpu_memory_utilization": 0.85,
                         "enable_prefix_caching": True},
            "hardware": {"device_name": "NVIDIA GeForce RTX 4090"}}
    meta.update(meta_extra or {})
    (run / "meta.json").write_text(json.dumps(meta))
    with open(run / "requests.jsonl", "w") as f:
        for i, (q, a, b, ids, n_out) in enumerate(REQS):
            f.write(json.dumps({"request_id": f"bench-{i}", "input_toks": len(ids), "output_toks": n_out,
                                "queued_ts": q, "scheduled_ts": q, "first_token_ts": a,
                                "last_token_ts": b}) + "\n")
    if ticks:
        (run / "timeseries.csv").write_text(TICKS)
    return run


def test_trace_rows_exact(tmp_path):
    run = load_vllm_log(write_run(tmp_path))
    got = [(r.request_id, r.arrival_time_us, r.send_time_us, r.first_chunk_time_us, r.last_chunk_time_us,
            r.input_tokens, r.output_tokens, r.server_input_tokens, r.input_token_ids.tolist())
           for r in run.records]
    assert got == [(0, 0, 0, 500_000, 2_500_000, 4, 5, 4, [1, 2, 3, 4]),
                   (2, 125_000, 125_000, 375_000, 3_125_000, 6, 3, 6, [7, 8, 9, 10, 11, 12]),
                   (1, 250_000, 250_000, 1_000_000, 1_000_000, 3, 1, 3, [1, 2, 3])]
    r = run.records[0]
    assert (r.streaming, r.status, r.model, r.prefix_group, r.prefix_length, r.num_chunks) == (
        True, "ok", "", "", 0, 0)
    h = run.header
    assert (h.mode, h.created_at, h.server.type, h.server.model, h.server.max_num_seqs,
            h.server.gpu_memory_utilization, h.server.max_model_len) == (
        "real", "2026-01-02T03:04:05Z", "vllm", "meta-llama/Llama-3.1-8B", 8, 0.85, 4096)
    assert [(q.id, q.trace_id, q.ttft_ms, q.e2e_ms, q.tpot_ms) for q in run.requests] == [
        ("bench-0", 0, 500.0, 2500.0, 500.0), ("bench-1", 1, 750.0, 750.0, None),
        ("bench-2", 2, 250.0, 3000.0, 1375.0)]


def test_converted_files_and_reading_back(tmp_path):
    run = load_vllm_log(write_run(tmp_path))
    out = tmp_path / "out" / "tiny"
    out.parent.mkdir()
    written = write_files(converted_files(run, out))
    assert [p.name for p in written] == ["tiny.header.yaml", "tiny.csv", "tiny.scenario.yaml",
                                         "tiny.timeseries.csv"]
    assert (out.parent / "tiny.timeseries.csv").read_text() == (
        "t_s,running,waiting,kv_cache_pct,prompt_throughput,gen_throughput\n"
        "1,2,1,12.5,13,5\n2,1,0,3.25,0,4.5\n")
    scen = (out.parent / "tiny.scenario.yaml").read_text()
    for line in ("seed: 7", "model: meta-llama/llama-3.1-8b", "hardware: RTX-4090", "tp: 1", "dp: 1",
                 "enable_expert_parallel: false", "  total_kv_blocks: 100", "  block_size: 16",
                 "  gpu_memory_utilization: 0.85", "  max_model_len: 4096", "  header: tiny.header.yaml",
                 "  data: tiny.csv", "horizon_us: 9223372036854775807   # run every request to completion"):
        assert line in scen.splitlines()
    assert "  max_num_running_reqs: 8 " in scen and "  max_num_scheduled_tokens: 64 " in scen
    back = load_measured(str(out) + ".scenario.yaml")
    assert [(q.id, q.trace_id, q.arrival_us, q.ttft_ms, q.e2e_ms, q.tpot_ms) for q in back.requests] == [
        ("request_0", 0, 0, 500.0, 2500.0, 500.0), ("request_2", 2, 125_000, 250.0, 3000.0, 1375.0),
        ("request_1", 1, 250_000, 750.0, 750.0, None)]
    assert [p.tolist() for p in back.prompts] == [[1, 2, 3, 4], [7, 8, 9, 10, 11, 12], [1, 2, 3]]
    assert back.ticks == run.ticks
    s, t = back.settings, run.settings
    assert (s.model, s.hardware, s.tp, s.dp, s.max_num_seqs, s.max_num_batched_tokens, s.max_model_len,
            s.block_size, s.kv_blocks, s.gpu_memory_utilization, s.seed) == (
        t.model, t.hardware, t.tp, t.dp, t.max_num_seqs, t.max_num_batched_tokens, t.max_model_len,
        t.block_size, t.kv_blocks, t.gpu_memory_utilization, t.seed)
    assert load_measured(tmp_path / "vllm-rtx4090-tiny").records == run.records   # a raw folder


def test_workload_found_in_the_run_folder_or_given(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    run = load_vllm_log(write_run(a, workload_in="run"))
    assert len(run.records) == 3
    folder = write_run(b, meta_extra={"dataset_path": None, "dataset_hash": None})
    with pytest.raises(ConfigError) as ei:
        load_vllm_log(folder)
    assert (ei.value.file, ei.value.field) == (str(folder / "meta.json"), "dataset_path")
    assert load_vllm_log(folder, b / "workload-wl.jsonl").records == run.records


def test_no_timeseries_means_no_ticks_file(tmp_path):
    run = load_vllm_log(write_run(tmp_path, ticks=False))
    assert run.ticks == []
    assert "timeseries" not in "".join(p.name for p in converted_files(run, tmp_path / "x"))


@pytest.mark.parametrize("edit, where", [
    (lambda run: (run / "requests.jsonl").write_text(
        (run / "requests.jsonl").read_text() + '{"request_id": "bench-3", "input_toks": 3}\n'),
     ("requests.jsonl", 4, "queued_ts")),
    (lambda run: (run / "requests.jsonl").write_text(
        (run / "requests.jsonl").read_text().replace('"bench-2"', '"bench-1"')),
     ("requests.jsonl", 3, "request_id")),
    (lambda run: (run / "meta.json").write_text(
        (run / "meta.json").read_text().replace('"gpu_memory_utilization": 0.85', '"gpu_memory_utilization": 2')),
     ("meta.json", None, "kv_cache.gpu_memory_utilization")),
    (lambda run: (run / "meta.json").write_text(
        (run / "meta.json").read_text().replace('"max_num_seqs": 8', '"max_num_seqs": "8"')),
     ("meta.json", None, "engine_kwargs.max_num_seqs")),
    (lambda run: (run / "timeseries.csv").write_text(TICKS + "3.0,x,1,1,1,1\n"),
     ("timeseries.csv", 4, None)),
    (lambda run: (run.parent / "workload-wl.jsonl").write_text('{"input_toks": 1}\n'),
     ("workload-wl.jsonl", None, None)),     # the hash no longer matches
    (lambda run: (run / "requests.jsonl").write_bytes(b'{"request_id": "\xff"}\n'),
     ("requests.jsonl", None, None)),        # not UTF-8
])
def test_malformed_inputs_are_located(tmp_path, edit, where):
    run = write_run(tmp_path)
    edit(run)
    with pytest.raises(ConfigError) as ei:
        load_vllm_log(run)
    e = ei.value
    assert (Path(e.file).name, e.line, e.field) == where


# ----------------------------------------------------------------------------- real runs

REAL_RUNS = ("vllm-rtx4090-llama-3.1-8b", "vllm-rtxpro6000-llama-3.1-8b")


@pytest.mark.parametrize("name", REAL_RUNS)
def test_real_run_converts_with_its_prompts(realdata, tmp_path, name):
    facts = REALDATA_FACTS[realdata.kind]
    run = load_vllm_log(realdata.path(name))
    assert len(run.records) == facts.requests and run.notes == []
    assert [r.arrival_time_us for r in run.records] == sorted(r.arrival_time_us for r in run.records)
    assert run.records[0].arrival_time_us == 0
    work = [json.loads(line) for line in open(realdata.path(facts.workload))]
    write_files(converted_files(run, tmp_path / "r"))
    tr = read_trace(tmp_path / "r.header.yaml", tmp_path / "r.csv")
    reqs = {q.id: q for q in trace_requests(tr.records, 42)}
    for i in (0, 38, facts.requests // 2, facts.requests - 1):
        assert reqs[f"request_{i}"].input_tokens.tolist() == work[i]["input_tok_ids"]
    # a later turn begins with all of an earlier prompt (full: line 237, 1871 tokens, with the
    # 1265 of line 207; excerpt: line 47, 1255 tokens, with the 455 of line 40): so do their replays
    i, j, n_i, n_j = facts.pair
    a, b = reqs[f"request_{i}"].input_tokens, reqs[f"request_{j}"].input_tokens
    assert (a.size, b.size) == (n_i, n_j) and np.array_equal(a, b[:n_i])
    back = load_converted(tmp_path / "r")
    real = {q.trace_id: q for q in run.requests}
    for q in back.requests:            # µs rounding only
        assert abs(q.ttft_ms - real[q.trace_id].ttft_ms) < 1e-3
        assert abs(q.e2e_ms - real[q.trace_id].e2e_ms) < 1e-3


@pytest.fixture(scope="module", params=data_sources("realdata", excerpt="realdata-gauges"))
def gauges(request) -> DataSource:
    """Per run, every request's queued / scheduled / last-token times and the 1 s gauges: the
    shipped excerpt keeps just those columns of all 300 requests and ticks."""
    return request.param


def _gauge_mismatch(folder: Path, offset_s: float) -> int:
    """Σ over ticks of |running − log running| + |waiting − log waiting|, with the gauges
    recounted from requests.jsonl at q0 + t + offset (q0: the earliest queued_ts, the loader's
    origin)."""
    rows = [json.loads(line) for line in open(folder / "requests.jsonl")]
    q0 = min(r["queued_ts"] for r in rows)
    err = 0
    with open(folder / "timeseries.csv") as f:
        for t in csv.DictReader(f):
            now = q0 + float(t["t"]) + offset_s
            running = sum(r["scheduled_ts"] <= now < r["last_token_ts"] for r in rows)
            waiting = sum(r["queued_ts"] <= now < r["scheduled_ts"] for r in rows)
            err += abs(running - int(t["running"])) + abs(waiting - int(t["waiting"]))
    return err


@pytest.mark.parametrize("name", REAL_RUNS)
def test_timeseries_axis_starts_at_the_first_arrival(gauges, name):
    """Why the timeseries keeps the log's t: the gauges agree with the requests best when
    tick t is taken at t seconds after the earliest queued_ts (not a second earlier or later)."""
    at0 = _gauge_mismatch(gauges.path(name), 0.0)
    assert at0 < _gauge_mismatch(gauges.path(name), -0.5) and at0 < _gauge_mismatch(gauges.path(name), 0.5)


def llmservingsim_layout(tmp_path: Path) -> Path:
    """The public LLMServingSim repository's layout, made by hand: the vLLM log in
    ``bench/examples/<hw>/<model>/vllm/`` and the workload at ``workloads/<name>.jsonl``, the
    path meta.json ``dataset_path`` gives relative to the repository's root."""
    flat = write_run(tmp_path)
    repo = tmp_path / "LLMServingSim"
    example = repo / "bench" / "examples" / "RTX4090" / "Llama-3.1-8B"
    example.mkdir(parents=True)
    flat.rename(example / "vllm")
    # the recorder's current timeseries has more columns (bench/core/stat_logger.py)
    (example / "vllm" / "timeseries.csv").write_text(
        "t,prompt_throughput,prompt_compute_throughput,prompt_cached_throughput,gen_throughput,running,"
        "waiting,preempted,kv_cache_pct\n1.0,13.0,13.0,0.0,5.0,2,1,0,12.5\n2.0,0.0,0.0,0.0,4.5,1,0,0,3.25\n")
    (repo / "workloads").mkdir()
    (tmp_path / "workload-wl.jsonl").rename(repo / "workloads" / "wl.jsonl")
    return example


def test_an_llmservingsim_example_is_read_as_it_is_laid_out(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "repo").mkdir()
    flat = load_vllm_log(write_run(tmp_path / "flat"))
    example = llmservingsim_layout(tmp_path / "repo")
    for given in (example, example / "vllm"):
        run = load_vllm_log(given)
        assert run.name == "vllm-rtx4090-llama-3.1-8b"          # as docs/accuracy.md names the runs
        assert run.records == flat.records and run.ticks == flat.ticks
        assert run.settings.hardware == "RTX-4090" and run.settings.kv_blocks == 100
    # the workload is looked for at dataset_path under the ancestors; a wrong hash still stops it
    (example.parent.parent.parent.parent / "workloads" / "wl.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="is not the run's dataset_hash"):
        load_vllm_log(example)
    (example.parent.parent.parent.parent / "workloads" / "wl.jsonl").unlink()
    with pytest.raises(ConfigError) as ei:
        load_vllm_log(example)
    assert ei.value.field == "dataset_path" and "and workloads/wl.jsonl above it" in ei.value.problem
