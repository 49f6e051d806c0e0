"""bench/realdata.py on a tiny realdata-shaped folder with hand-known times (no timing checks)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from blis_simpy.errors import ConfigError

_spec = importlib.util.spec_from_file_location(
    "bench_realdata", Path(__file__).resolve().parents[1] / "bench" / "realdata.py")
rd = importlib.util.module_from_spec(_spec)
sys.modules["bench_realdata"] = rd          # dataclasses look their module up there
_spec.loader.exec_module(rd)

# request i: (queued_ts, first_token_ts, last_token_ts, input ids, output_toks), seconds
REQS = [
    (100.0, 100.5, 102.5, [1, 2, 3, 4], 5),             # TTFT 500, E2E 2500, TPOT 2000/4 = 500 ms
    (100.25, 101.0, 101.0, [1, 2, 3], 1),               # TTFT 750, E2E 750, no TPOT
    (101.0, 101.125, 103.125, [7, 8, 9, 10, 11, 12], 3),  # TTFT 125, E2E 2125, TPOT 1000 ms
]
# t, prompt tps, gen tps, running, waiting
TICKS = [(1, 10, 5, 2, 1), (2, 0, 50, 2, 0), (3, 0, 100, 1, 0), (4, 0, 80, 1, 0), (5, 0, 120, 1, 0)]


def write_folder(root: Path, *, meta_extra: dict | None = None, bad_hash: bool = False) -> Path:
    work = root / "workload-wl.jsonl"
    with open(work, "w") as f:
        for _q, _a, _b, ids, n_out in REQS:
            f.write(json.dumps({"input_toks": len(ids), "output_toks": n_out, "arrival_time_ns": 0,
                                "input_tok_ids": ids, "output_tok_ids": list(range(50, 50 + n_out))}) + "\n")
    run = root / "vllm-rtx4090-tiny"
    run.mkdir()
    digest = hashlib.sha256(work.read_bytes()).hexdigest()
    meta = {"model": "meta-llama/Llama-3.1-8B", "dataset_path": "workloads/wl.jsonl",
            "dataset_hash": "0" * 64 if bad_hash else digest,
            "engine_kwargs": {"tensor_parallel_size": 1, "data_parallel_size": 1, "max_num_seqs": 8,
                              "max_num_batched_tokens": 64, "max_model_len": None, "seed": 42},
            "kv_cache": {"num_gpu_blocks": 100, "block_size": 16, "gpu_memory_utilization": 0.9,
                         "enable_prefix_caching": True},
            "hardware": {"device_name": "NVIDIA GeForce RTX 4090"}}
    meta.update(meta_extra or {})
    (run / "meta.json").write_text(json.dumps(meta))
    with open(run / "requests.jsonl", "w") as f:
        for i, (q, a, b, ids, n_out) in enumerate(REQS):
            f.write(json.dumps({"request_id": f"bench-{i}", "input_toks": len(ids), "output_toks": n_out,
                                "queued_ts": q, "first_token_ts": a, "last_token_ts": b}) + "\n")
    rows = ["t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct"]
    rows += [f"{t}.0,{p}.0,{g}.0,{r},{w},0.0" for t, p, g, r, w in TICKS]
    (run / "timeseries.csv").write_text("\n".join(rows) + "\n")
    return run


def test_real_latencies_and_settings(tmp_path):
    write_folder(tmp_path)
    run = rd.load_run(tmp_path, "vllm-rtx4090-tiny")
    got = [(r.id, r.arrival_us, r.ttft_ms, r.e2e_ms, r.tpot_ms) for r in run.requests]
    assert got == [("bench-0", 0, 500.0, 2500.0, 500.0), ("bench-1", 250_000, 750.0, 750.0, None),
                   ("bench-2", 1_000_000, 125.0, 2125.0, 1000.0)]
    st = run.settings
    assert (st.hardware, st.tp, st.dp, st.max_num_seqs, st.max_num_batched_tokens) == ("RTX-4090", 1, 1, 8, 64)
    assert (st.kv_blocks, st.block_size, st.max_model_len, st.seed) == (100, 16, 0, 42)
    reqs = rd.build_requests(run)
    assert [q.arrival_us for q in reqs] == [0, 250_000, 1_000_000]
    assert reqs[2].input_tokens.tolist() == [7, 8, 9, 10, 11, 12]
    assert reqs[2].output_tokens.tolist() == [50, 51, 52]


def test_stats_errors_and_mape():
    real = {"a": 500.0, "b": 750.0, "c": 2000.0}
    sim = {"a": 550.0, "b": 750.0, "c": 1600.0, "extra": 1.0}
    assert rd.mape_pct(sim, real) == 10.0           # (10 + 0 + 20) / 3
    assert rd.signed_error_pct(125.0, 100.0) == 25.0
    assert rd.signed_error_pct(75.0, 100.0) == -25.0
    s = rd.stats([750.0, 125.0, 500.0])
    assert (s.p50, s.p90) == (500.0, 700.0)         # p90: rank 1.8 -> 500 + 0.8 x 250
    assert s.mean == pytest.approx(1375.0 / 3, abs=1e-12)


def test_compare_against_hand_made_sim(tmp_path):
    write_folder(tmp_path)
    run = rd.load_run(tmp_path, "vllm-rtx4090-tiny")
    res = rd.BackendResult("fake")
    res.sim = {"ttft": {"bench-0": 600.0, "bench-1": 750.0, "bench-2": 125.0},
               "tpot": {"bench-0": 400.0, "bench-2": 1000.0},
               "e2e": {"bench-0": 2000.0, "bench-1": 750.0, "bench-2": 2125.0}}
    c = rd.compare(run, res)
    assert c["tpot"]["n"] == 2                      # bench-1 has one output token: no TPOT
    assert c["tpot"]["real"]["mean"] == 750.0 and c["tpot"]["sim"]["mean"] == 700.0
    assert c["tpot"]["err_pct"]["mean"] == pytest.approx(-100 / 15, abs=1e-12)
    assert c["ttft"]["real"]["p50"] == 500.0 and c["ttft"]["sim"]["p50"] == 600.0
    assert c["ttft"]["err_pct"]["p50"] == 20.0
    assert c["e2e"]["real"]["p50"] == 2125.0 and c["e2e"]["sim"]["p50"] == 2000.0
    assert c["e2e_mape_pct"] == pytest.approx(20 / 3, abs=1e-12)   # (20 + 0 + 0) / 3


def test_real_decode_step_from_ticks(tmp_path):
    write_folder(tmp_path)
    run = rd.load_run(tmp_path, "vllm-rtx4090-tiny")
    # steady decode-only ticks: 2 (running 2 -> 2), 4 and 5 (1 -> 1); tick 3 lost a request
    assert [t.t_s for t in rd.steady_decode_ticks(run.ticks)] == [2.0, 4.0, 5.0]
    step = rd.real_decode_step(run.ticks)
    assert (step.batch, step.ticks, step.low_load) == (1, [4.0, 5.0], True)
    assert step.step_ms == 10.0                     # 1 x 2 ticks / (80 + 120) tokens
    rd.decode_context(run, step)                    # nothing decodes at 103.5 s or 104.5 s
    assert step.context == 6                        # (5x4 + 10 + 1x3 + 3x6 + 3) / 9 = 54 / 9
    two = rd.RealStep(2, 40.0, [2.0], True)         # mid-tick 101.5 s: bench-0 and bench-2 decode
    rd.decode_context(run, two)
    assert (two.context, two.log_running) == (7, 2.0)   # 4 + (1 + 2) and 6 + 1
    assert rd.real_decode_step(run.ticks, max_running=0).low_load is False


def test_simulated_requests_all_complete(tmp_path):
    write_folder(tmp_path)
    run = rd.load_run(tmp_path, "vllm-rtx4090-tiny")
    res = rd.simulate(run, "roofline", rd.real_decode_step(run.ticks))
    assert res.completed == 3 and res.kv_blocks == 100
    assert sorted(res.sim["tpot"]) == ["bench-0", "bench-2"]
    assert all(res.sim["e2e"][k] >= res.sim["ttft"][k] for k in res.sim["e2e"])
    assert res.step_ms == res.batch1_ms > 0          # the real step is at batch 1


def test_bad_inputs_exit_2(tmp_path, capsys):
    bad_row, bad_hash, no_ticks = (tmp_path / n for n in ("bad_row", "bad_hash", "no_ticks"))
    for d in (bad_row, bad_hash, no_ticks):
        d.mkdir()
    run = write_folder(bad_row)
    with open(run / "requests.jsonl", "a") as f:
        f.write('{"request_id": "bench-3", "input_toks": 3}\n')
    assert rd.main(["--data", str(bad_row), "--backends", "roofline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "requests.jsonl:4: queued_ts" in err[0]
    write_folder(bad_hash, bad_hash=True)
    with pytest.raises(ConfigError, match="dataset_hash"):
        rd.load_run(bad_hash, "vllm-rtx4090-tiny")
    (write_folder(no_ticks) / "timeseries.csv").unlink()
    with pytest.raises(ConfigError, match="timeseries.csv: missing file"):
        rd.load_run(no_ticks, "vllm-rtx4090-tiny")


def test_crossval_fits_per_gpu_where_the_gpu_has_other_runs():
    """bench/crossval.py: a run of a GPU with at least two runs (besides it, when held out) is
    fitted on that GPU's runs; a GPU alone is fitted on every run (held out: every other)."""
    cv_spec = importlib.util.spec_from_file_location(
        "bench_crossval", Path(__file__).resolve().parents[1] / "bench" / "crossval.py")
    cv = importlib.util.module_from_spec(cv_spec)
    sys.modules["bench_crossval"] = cv
    cv_spec.loader.exec_module(cv)

    def case(name, gpu):
        return cv.Case(name, "aggregate", gpu, None, None, None)

    h1, h2, h3, r = case("h1", "H100"), case("h2", "H100"), case("h3", "H100"), case("r", "RTX")
    runs = [h1, h2, h3, r]
    names = lambda cs: [c.name for c in cs]            # noqa: E731
    assert cv.MIN_GPU_RUNS == 2
    assert names(cv.training_runs(runs, h1, held_out=False)) == ["h1", "h2", "h3"]
    assert names(cv.training_runs(runs, h1, held_out=True)) == ["h2", "h3"]
    assert names(cv.training_runs(runs, r, held_out=False)) == ["h1", "h2", "h3", "r"]
    assert names(cv.training_runs(runs, r, held_out=True)) == ["h1", "h2", "h3"]
    # two H100 runs: holding one out leaves one, too few for a per-GPU fit -> every other run
    assert names(cv.training_runs([h1, h2, r], h1, held_out=True)) == ["h2", "r"]
