"""End-to-end behaviour of ``blis-simpy run | replay | validate``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from blis_simpy.cli.runner import build_requests, prepare
from tests.conftest import data_sources

from .support import QUICKSTART, REPO, trace_row, write_trace_files


def _ok(res):
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr)
    return res


# ---------------------------------------------------------------------------- validate
def test_validate_quickstart(cli):
    res = _ok(cli("validate", QUICKSTART))
    assert res.stdout.startswith(f"ok: {QUICKSTART}: quickstart: model meta-llama/llama-3.1-8b-instruct")
    assert "blackbox latency" in res.stdout and "300 requests" in res.stdout
    assert res.stderr == ""


@pytest.mark.parametrize("reference", data_sources("reference-data"))
def test_quickstart_uses_the_reference_coefficients(reference):
    import yaml

    defaults = yaml.safe_load(reference.path("defaults.yaml").read_text())
    entry = next(m for m in defaults["models"] if m["id"] == "meta-llama/llama-3.1-8b-instruct"
                 and m["GPU"] == "H100" and m["tensor_parallelism"] == 1
                 and m["vllm_version"] == "vllm/vllm-openai:v0.11.0")
    s = prepare("run", {}, str(QUICKSTART)).scenario
    assert s.latency.alpha_coeffs == entry["alpha_coeffs"]
    assert s.latency.beta_coeffs == entry["beta_coeffs"]
    assert s.engine.total_kv_blocks == entry["total_kv_blocks"]


def test_validate_trace_scenario_resolves_paths_next_to_the_file(cli, tmp_path, trace_files):
    sub = tmp_path / "scenarios"
    sub.mkdir()
    sc = sub / "t.yaml"
    sc.write_text("latency: {model: blackbox, alpha_coeffs: [1, 0, 0], beta_coeffs: [1, 1, 1]}\n"
                  "workload: {kind: trace, header: ../trace.yaml, data: ../trace.csv}\n")
    res = _ok(cli("validate", sc))
    assert "(12 trace rows)" in res.stdout
    assert prepare("replay", {}, str(sc)).scenario.workload.data == str(trace_files[1])


# ---------------------------------------------------------------------------- run
def test_run_flags_override_the_scenario(cli, small_scenario, tmp_path):
    out = tmp_path / "r.json"
    res = _ok(cli("run", "--scenario", small_scenario, "--num-requests=7", "--format", "json",
                  "--results-path", out))
    doc = json.loads(res.stdout)
    assert doc["command"] == "run"
    assert doc["cluster"]["injected_requests"] == 7
    results = json.loads(out.read_text())
    assert results["instance_id"] == "cluster" and len(results["requests"]) == 7
    res = _ok(cli("run", "--scenario", small_scenario, "--format", "json"))
    assert json.loads(res.stdout)["cluster"]["injected_requests"] == 24


def test_run_table_format(cli, small_scenario):
    res = _ok(cli("run", "--scenario", small_scenario))
    assert "Latency (ms)" in res.stdout and "24 requests" in res.stdout
    assert res.stderr == ""  # no progress bar when stderr is not a terminal


def test_run_blis_format_matches_the_results_file(cli, small_scenario, tmp_path):
    out = tmp_path / "r.json"
    res = _ok(cli("run", "--scenario", small_scenario, "--format", "blis", "--results-path", out))
    assert res.stdout.startswith("=== Simulation Metrics ===\n{\n")
    printed = json.loads(res.stdout.split("=== Simulation Metrics ===\n")[1].split("\n}\n")[0] + "}")
    written = json.loads(out.read_text())
    assert {k: v for k, v in written.items() if k != "requests"} == printed


def test_run_horizon_cuts_the_run(cli, small_scenario):
    full = json.loads(_ok(cli("run", "--scenario", small_scenario, "--format", "json")).stdout)
    cut = json.loads(_ok(cli("run", "--scenario", small_scenario, "--format", "json",
                             "--horizon", "300000")).stdout)
    assert cut["cluster"]["completed_requests"] < full["cluster"]["completed_requests"]
    assert cut["cluster"]["vllm_estimated_duration_s"] <= 0.3


def _run_subprocess(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blis_simpy", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=60,
                          env=None if env is None else {**os.environ, **env})


@pytest.mark.parametrize("fmt", ["blis", "json"])
def test_runs_are_deterministic(small_scenario, tmp_path, fmt):
    # two processes with different string-hash seeds: no output may follow set or dict
    # order of hashed strings
    outs = []
    for k in range(2):
        res_path = tmp_path / f"r{k}.json"
        p = _run_subprocess("run", "--scenario", small_scenario, "--format", fmt, "--results-path",
                            res_path, env={"PYTHONHASHSEED": str(k + 1)})
        assert p.returncode == 0, p.stderr
        outs.append((p.stdout, res_path.read_bytes()))
    assert outs[0] == outs[1]
    assert len(outs[0][0]) > 100 and b'"requests"' in outs[0][1]


@pytest.mark.parametrize("name", ["multiturn_chat", "pd_comparison"])
def test_shipped_scenarios_do_not_depend_on_the_hash_seed(tmp_path, name):
    # sessions, prefix groups, several instances, PD pools and variants, in two processes
    outs = []
    for k in range(2):
        p = _run_subprocess("run", "--scenario", REPO / "scenarios" / f"{name}.yaml", "--format",
                            "json", env={"PYTHONHASHSEED": str(7 + 3 * k)})
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1] and '"cluster"' in outs[0]


def test_seed_changes_the_workload(cli, small_scenario, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _ok(cli("run", "--scenario", small_scenario, "--format", "json", "--results-path", a))
    _ok(cli("run", "--scenario", small_scenario, "--format", "json", "--results-path", b, "--seed", "43"))
    assert a.read_bytes() != b.read_bytes()


def test_python_dash_m_help():
    p = _run_subprocess("--help")
    assert p.returncode == 0 and "run" in p.stdout and "replay" in p.stdout and "validate" in p.stdout


def test_error_from_a_real_process_is_one_line(tmp_path):
    sc = tmp_path / "bad.yaml"
    sc.write_text("engine:\n  block_size: 0\n")
    p = _run_subprocess("run", "--scenario", sc)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == f"error: {sc}:2: engine.block_size: input should be greater than 0, got 0\n"


# ---------------------------------------------------------------------------- logging
def test_log_level_controls_engine_warnings(cli, small_scenario):
    # max-model-len 100 drops most requests (the enqueue guards, docs/engine.md): one warning
    # per cause at the end of the run; each request at debug
    args = ("run", "--scenario", small_scenario, "--max-model-len", "100", "--format", "json")
    assert "dropped " in _ok(cli(*args)).stderr                             # default: warn
    assert _ok(cli(*args, "--log", "error")).stderr == ""
    bad = cli(*args, "--log", "no-such-level")                               # refused, not "error"
    assert (bad.exit_code, bad.stdout) == (2, "")
    assert bad.stderr == ("error: --log: unknown log level 'no-such-level'; valid: trace, debug, "
                          "info, warn, error, fatal, panic\n")
    assert "dropped request request_" in _ok(cli(*args, "--log", "debug")).stderr


# ---------------------------------------------------------------------------- replay
def test_replay_from_flags(cli, small_scenario, trace_files, tmp_path):
    h, d = trace_files
    out = tmp_path / "r.json"
    res = _ok(cli("replay", "--scenario", small_scenario, "--trace-header", h, "--trace-data", d,
                  "--format", "json", "--results-path", out, "--horizon", "100000000"))
    assert json.loads(res.stdout)["command"] == "replay"
    rows = json.loads(out.read_text())
    assert [r["request_id"] for r in rows] == list(range(12))
    assert [(r["input_tokens"], r["output_tokens"]) for r in rows] == [(100 + 10 * i, 20 + i) for i in range(12)]
    assert all(0 < r["ttft_us"] < r["e2e_us"] for r in rows)


def test_replay_default_horizon(small_scenario, tmp_path):
    h, d = write_trace_files(tmp_path, [trace_row(0, 1000, 10, 5), trace_row(1, 250_000, 10, 5)])
    given = {"--trace-header": str(h), "--trace-data": str(d)}
    plan = prepare("replay", given, str(small_scenario))
    assert build_requests(plan)[1] == 500_000                               # 2 x last arrival
    plan = prepare("replay", {**given, "--horizon": "77"}, str(small_scenario))
    assert build_requests(plan)[1] == 77
    h0, d0 = write_trace_files(tmp_path, [trace_row(0, 0, 10, 5)], name="zero")
    plan = prepare("replay", {"--trace-header": str(h0), "--trace-data": str(d0)}, str(small_scenario))
    assert build_requests(plan)[1] == 600_000_000                           # all arrive at 0


def test_replay_seed_drives_token_synthesis(small_scenario, trace_files):
    h, d = trace_files
    given = {"--trace-header": str(h), "--trace-data": str(d)}
    a = build_requests(prepare("replay", given, str(small_scenario)))[0]
    b = build_requests(prepare("replay", {**given, "--seed": "5"}, str(small_scenario)))[0]
    assert [r.tokens.tolist() for r in a] != [r.tokens.tolist() for r in b]
    assert [r.input_len for r in a] == [r.input_len for r in b]


def test_trace_output_replays_to_the_same_latencies(cli, small_scenario, tmp_path):
    # run exports its workload with per-request timings; replaying it gives the same TTFT/E2E
    prefix = tmp_path / "exported"
    run_out = tmp_path / "run.json"
    _ok(cli("run", "--scenario", small_scenario, "--format", "json", "--results-path", run_out,
            "--trace-output", prefix))
    csv_rows = (tmp_path / "exported.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + 24
    assert "mode: generated" in (tmp_path / "exported.yaml").read_text()
    rep_out = tmp_path / "replay.json"
    _ok(cli("replay", "--scenario", small_scenario, "--trace-header", f"{prefix}.yaml",
            "--trace-data", f"{prefix}.csv", "--format", "json", "--results-path", rep_out))
    run_rows = {r["requestID"]: r for r in json.loads(run_out.read_text())["requests"]}
    rep_rows = json.loads(rep_out.read_text())
    assert len(rep_rows) == len(run_rows) == 24
    for r in rep_rows:
        src = run_rows[f"request_{r['request_id']}"]
        assert round(src["ttft_ms"] * 1000) == r["ttft_us"]
        assert round(src["e2e_ms"] * 1000) == r["e2e_us"]
    for line in csv_rows[1:]:
        cols = line.split(",")
        arrival, first, last = int(cols[19]), int(cols[21]), int(cols[22])
        assert cols[24] == "ok" and arrival < first <= last
