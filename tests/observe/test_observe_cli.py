"""``blis-simpy observe`` end to end: the CLI against a live SSE server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from blis_simpy.workload import TraceHeader, TraceRecord, read_trace, write_trace

from .sse_server import PROMPT_TOKENS_REPORTED_EXTRA

#: the server's first-token delay (a lower bound) and the only upper bound, which catches a
#: unit error or a hang and nothing a slow machine does (see test_observe.py)
FIRST_MS, HANG_BOUND_MS = 80.0, 30_000.0
#: 4 requests of exactly 8 prompt and 3 output tokens at 20 req/s (stdev must lie in [min, max])
DIST = ["--rate", "20", "--num-requests", "4",
        "--prompt-tokens", "8", "--prompt-tokens-stdev", "8", "--prompt-tokens-min", "8",
        "--prompt-tokens-max", "8", "--output-tokens", "3", "--output-tokens-stdev", "3",
        "--output-tokens-min", "3", "--output-tokens-max", "3"]

#: a tiny simulated deployment for `run` / `replay` of the same workload
SIM = ["--model", "meta-llama/llama-3.1-8b-instruct", "--alpha-coeffs", "1000,0,0",
       "--beta-coeffs", "5000,10,100"]


def cli(*args):
    return CliRunner().invoke(app, ["observe", *map(str, args)])


def test_distribution_workload_to_trace_and_results(server, tmp_path: Path):
    h, d, res = tmp_path / "obs.yaml", tmp_path / "obs.csv", tmp_path / "res.json"
    r = cli("--server-url", server.url, "--model", "Org/Model-8B", *DIST, "--trace-header", h,
            "--trace-data", d, "--results", res, "--rtt-ms", "0.25", "--warmup-requests", "1")
    assert r.exit_code == 0, r.stderr
    assert "observe: 4 requests to " + server.url + "/v1/completions" in r.stdout
    assert "1 warm-up, then 3 ok, 0 errors, 0 timeouts" in r.stdout and "TTFT" in r.stdout
    trace = read_trace(h, d)
    hd = trace.header
    assert (hd.mode, hd.warm_up_requests, hd.workload_seed) == ("real", 1, 42)
    assert (hd.server.type, hd.server.model, hd.network.measured_rtt_ms) == ("vllm", "Org/Model-8B", 0.25)
    rows = trace.records
    assert [x.request_id for x in rows] == [0, 1, 2, 3]
    for x in rows:
        assert x.status == "ok" and x.streaming and x.finish_reason == "length"
        assert (x.input_tokens, x.output_tokens, x.num_chunks) == (8, 3, 3)
        assert x.server_input_tokens == 8 + PROMPT_TOKENS_REPORTED_EXTRA
        assert x.send_time_us >= x.arrival_time_us
        assert FIRST_MS * 1000 <= x.first_chunk_time_us - x.send_time_us < HANG_BOUND_MS * 1000
    # the same flags give the same requests as `run` (its exported workload)
    ran = CliRunner().invoke(app, ["run", *SIM, *DIST, "--trace-output", str(tmp_path / "run")])
    assert ran.exit_code == 0, ran.stderr
    sim_rows = read_trace(tmp_path / "run.yaml", tmp_path / "run.csv").records
    assert [x.arrival_time_us for x in rows] == [x.arrival_time_us for x in sim_rows]
    assert len({x.arrival_time_us for x in rows}) == 4
    doc = json.loads(res.read_text())
    assert doc["run"]["model"] == "Org/Model-8B" and doc["run"]["workload_seed"] == 42
    s = doc["summary"]
    assert (s["requests"], s["warmup_requests"], s["ok"], s["ttft_ms"]["count"]) == (4, 1, 3, 3)
    assert FIRST_MS <= s["ttft_ms"]["p50"] < HANG_BOUND_MS
    ttfts = sorted((x.first_chunk_time_us - x.send_time_us) / 1000 for x in rows[1:])   # not the warm-up
    assert s["ttft_ms"]["p50"] == ttfts[1]
    assert s["itl_ms"]["count"] == 6
    per = doc["requests"]
    assert [q["warmup"] for q in per] == [True, False, False, False]
    assert all(len(q["itl_ms"]) == 2 and q["tokens_from"] == "usage" for q in per)
    assert all(q["e2e_ms"] == pytest.approx(q["ttft_ms"] + sum(q["itl_ms"]), abs=0.002) for q in per)
    # the observed trace replays through the simulator as it is
    rep = CliRunner().invoke(app, ["replay", "--trace-header", str(h), "--trace-data", str(d), *SIM,
                                   "--format", "json"])
    assert rep.exit_code == 0, rep.stderr
    cluster = json.loads(rep.stdout)["cluster"]
    assert (cluster["completed_requests"], cluster["total_input_tokens"]) == (4, 4 * 8)


def _input_trace(tmp_path: Path) -> tuple[Path, Path]:
    rows = [TraceRecord(request_id=10 + i, arrival_time_us=a, input_tokens=n_in, output_tokens=n_out,
                        prefix_group="sys" if i < 2 else "", prefix_length=4 if i < 2 else 0)
            for i, (a, n_in, n_out) in enumerate([(0, 5, 2), (100_000, 3, 4), (250_000, 6, 1)])]
    yh, yd = write_trace(tmp_path / "in", TraceHeader(trace_version=2), rows)
    return yh, yd


def test_input_trace_is_replayed_at_its_arrival_times(server, tmp_path: Path):
    ih, idata = _input_trace(tmp_path)
    h, d = tmp_path / "out.yaml", tmp_path / "out.csv"
    r = cli("--server-url", server.url, "--model", "m", "--input-trace-header", ih,
            "--input-trace-data", idata, "--trace-header", h, "--trace-data", d)
    assert r.exit_code == 0, r.stderr
    bodies = [x["body"] for x in server.received]
    assert [len(b["prompt"]) for b in bodies] == [4 + 5, 4 + 3, 6]
    assert bodies[0]["prompt"][:4] == bodies[1]["prompt"][:4]          # the shared prefix is shared
    assert [b["max_tokens"] for b in bodies] == [2, 4, 1]
    rows = read_trace(h, d).records
    assert [x.arrival_time_us for x in rows] == [0, 100_000, 250_000]
    assert all(x.send_time_us >= x.arrival_time_us for x in rows)
    assert [(x.prefix_group, x.prefix_length, x.input_tokens) for x in rows] == \
        [("sys", 4, 5), ("sys", 4, 3), ("", 0, 6)]
    assert [x.output_tokens for x in rows] == [2, 4, 1]
    # the prompts that were sent travel with the trace, so a replay shares the same prefix
    assert [x.input_token_ids.tolist() for x in rows] == [b["prompt"] for b in bodies]


def test_input_trace_num_requests_takes_the_first_n(server, tmp_path: Path):
    ih, idata = _input_trace(tmp_path)
    r = cli("--server-url", server.url, "--model", "m", "--input-trace-header", ih,
            "--input-trace-data", idata, "--num-requests", "2")
    assert r.exit_code == 0, r.stderr
    assert len(server.received) == 2 and "observe: 2 requests" in r.stdout


def test_scenario_workload_and_model_with_chat(server, tmp_path: Path):
    sc = tmp_path / "s.yaml"
    sc.write_text("model: Org/Mixed-Case\nseed: 3\nworkload:\n  kind: distribution\n  rate: 50\n"
                  "  num_requests: 2\n  prompt_tokens: {mean: 6, stdev: 6, min: 6, max: 6}\n"
                  "  output_tokens: {mean: 2, stdev: 2, min: 2, max: 2}\n")
    h, d = tmp_path / "o.yaml", tmp_path / "o.csv"
    r = cli("--server-url", server.url + "/v1", "--scenario", sc, "--api-format", "chat",
            "--trace-header", h, "--trace-data", d)
    assert r.exit_code == 0, r.stderr
    assert [x["path"] for x in server.received] == ["/v1/chat/completions"] * 2
    body = server.received[0]["body"]
    assert body["model"] == "Org/Mixed-Case" and len(body["messages"][0]["content"].split(" ")) == 6
    tr = read_trace(h, d)
    assert tr.header.workload_seed == 3 and [x.status for x in tr.records] == ["ok", "ok"]
    assert all(x.input_token_ids is None for x in tr.records)    # chat: the server got text


def test_closed_loop_sessions_send_follow_ups_after_think_time(server, tmp_path: Path):
    spec = tmp_path / "spec.yaml"
    spec.write_text('version: "2"\nseed: 7\naggregate_rate: 10\nnum_requests: 3\nclients:\n'
                    "  - id: chat\n    rate_fraction: 1.0\n    arrival: {process: constant}\n"
                    "    input_distribution: {type: constant, params: {value: 6}}\n"
                    "    output_distribution: {type: constant, params: {value: 2}}\n"
                    "    reasoning: {multi_turn: {max_rounds: 2, think_time_us: 50000}}\n")
    h, d = tmp_path / "o.yaml", tmp_path / "o.csv"
    r = cli("--server-url", server.url, "--model", "m", "--workload-spec", spec,
            "--trace-header", h, "--trace-data", d)
    assert r.exit_code == 0, r.stderr
    tr = read_trace(h, d)
    assert tr.header.workload_spec == str(spec)
    rows = tr.records
    assert sorted(x.round_index for x in rows) == [0, 0, 1, 1]
    assert [x.arrival_time_us for x in rows] == sorted(x.arrival_time_us for x in rows)
    for first in [x for x in rows if x.round_index == 0]:
        (follow,) = [x for x in rows if x.session_id == first.session_id and x.round_index == 1]
        wait = follow.arrival_time_us - first.last_chunk_time_us      # think time after the answer
        # (the answer ends at data: [DONE], after its last chunk; tests/workload/test_sessions.py
        # checks the think-time arithmetic exactly)
        assert 50_000 <= wait < HANG_BOUND_MS * 1000
        assert follow.send_time_us >= follow.arrival_time_us


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_server_exits_2_without_a_trace(tmp_path: Path):
    h, d = tmp_path / "o.yaml", tmp_path / "o.csv"
    r = cli("--server-url", f"http://127.0.0.1:{_closed_port()}", "--model", "m", *DIST,
            "--trace-header", h, "--trace-data", d)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --server-url: cannot reach the server")
    assert not h.exists() and not d.exists()


def test_a_dead_server_is_reported_before_the_workload_is_built(monkeypatch):
    """Found by CLI fuzzing: `observe --num-requests 10000000` against a port with nothing
    listening built all ten million requests (minutes, ~15 GB) before it found the server
    dead. The flags and sizes are checked first, then the server, then the requests built."""
    from blis_simpy.cli import runner

    def built(*_a, **_k):
        raise AssertionError("the workload was built before the server was checked")
    monkeypatch.setattr(runner, "build_workload", built)
    r = cli("--server-url", f"http://127.0.0.1:{_closed_port()}", "--model", "m", "--num-requests", "10000000")
    assert r.exit_code == 2, r.stderr
    assert r.stderr.startswith("error: --server-url: cannot reach the server") and r.stderr.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["--num-requests", "20000000"], "--num-requests: input should be less than or equal to 10000000, got 20000000"),
    (["--trace-header", "x.yaml"], "--trace-header: must be given together with --trace-data"),
    (["--max-concurrency", "0"], "--max-concurrency: must be in [1, 10000], got 0"),
    (["--rtt-ms", "-1"], "--rtt-ms: must be finite and >= 0, got -1.0"),
    (["--warmup-requests", "-2"], "--warmup-requests: must be >= 0, got -2"),
    (["--rate", "0"], "--rate: must be > 0, got 0.0"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = cli("--server-url", "http://127.0.0.1:9", "--model", "m", *args)
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {message}"


def test_missing_model_and_missing_output_folder_are_refused_before_sending(tmp_path: Path):
    r = cli("--server-url", "http://127.0.0.1:9", *DIST)
    assert r.exit_code == 2 and r.stderr.strip() == "error: --model: is required: the model name the server serves"
    out = tmp_path / "nowhere" / "res.json"
    r = cli("--server-url", "http://127.0.0.1:9", "--model", "m", "--results", out)
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {out}: --results: the folder does not exist"


def test_input_trace_excludes_distribution_flags(tmp_path: Path):
    ih, idata = _input_trace(tmp_path)
    r = cli("--server-url", "http://127.0.0.1:9", "--model", "m", "--input-trace-header", ih,
            "--input-trace-data", idata, "--rate", "5")
    assert r.exit_code == 2 and "--rate: cannot be combined with --input-trace-header" in r.stderr
