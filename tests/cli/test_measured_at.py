"""``metrics.measured_at`` / ``--measured-at`` and the scenario's ``frontend:`` section on the
command line (docs/frontend.md, docs/cli.md): a bad flag value is one error line (bad scenario
values: tests/config/test_loader.py), the flag beats the key, and without a front end every
output is byte-identical in both modes."""

from __future__ import annotations

import json

import pytest

from blis_simpy.cli import flags as F
from blis_simpy.cli.runner import prepare

from .support import SMALL_SCENARIO, trace_row, write_trace_files

REPLAY_FLAGS = ("--model", "meta-llama/llama-3.1-8b-instruct", "--alpha-coeffs", "100,1,0",
                "--beta-coeffs", "1000,10,5", "--total-kv-blocks", "2000", "--horizon", "10000000")


def _one_error(res) -> str:
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    assert res.stdout == "" and "Traceback" not in res.stderr
    (line,) = res.stderr.splitlines()
    return line


def test_bad_flag_value(cli, small_scenario):
    line = _one_error(cli("run", "--scenario", small_scenario, "--measured-at", "proxy"))
    assert line.startswith("error: --measured-at:") and "server" in line and "client" in line


def test_the_flag_beats_the_scenario_key(tmp_path):
    header, data = write_trace_files(tmp_path, [trace_row(0, 5000, 300, 4)])
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO + "metrics:\n  measured_at: client\n")
    assert prepare("run", {}, str(sc)).scenario.metrics.measured_at == "client"
    assert prepare("run", {"--measured-at": "server"}, str(sc)).scenario.metrics.measured_at == "server"
    given = {"--model": "m", "--alpha-coeffs": "1,0,0", "--beta-coeffs": "1,1,1", "--measured-at": "client",
             "--trace-header": str(header), "--trace-data": str(data)}
    assert prepare("replay", given).scenario.metrics.measured_at == "client"
    assert {F.RUN, F.REPLAY} <= set(F.BY_NAME["--measured-at"].commands)   # calibrate/fit take replay's


@pytest.mark.parametrize("extra", ["", "frontend: {}\n",
                                   "frontend: {request_us: 0, input_token_us: 0.0, network_us: 0}\n"])
def test_without_a_front_end_both_modes_print_the_same_bytes(cli, tmp_path, extra):
    base = tmp_path / "base.yaml"
    base.write_text(SMALL_SCENARIO)
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO + extra)
    ref = cli("run", "--scenario", base, "--format", "json", "--results-path", tmp_path / "ref.json")
    assert ref.exit_code == 0, ref.stderr
    for mode in ("server", "client"):
        out = tmp_path / f"{mode}.json"
        res = cli("run", "--scenario", sc, "--measured-at", mode, "--format", "json", "--results-path", out)
        assert res.exit_code == 0, res.stderr
        assert res.stdout == ref.stdout
        assert out.read_bytes() == (tmp_path / "ref.json").read_bytes()


def test_replay_rows_say_where_the_clock_starts(cli, tmp_path):
    """One request at 5000 µs (300 prompt tokens); front end: 200 µs + 2 µs per prompt
    token, 30 µs of network each way. server: its row's arrival is the hand-over to the
    engine, 5000 + 30 + 200 + 600 = 5830 µs; client: the client's send, 5000 µs. The client's
    TTFT and E2E exceed the server's by at least the tokenize time and the network."""
    header, data = write_trace_files(tmp_path, [trace_row(0, 5000, 300, 4)])
    sc = tmp_path / "fe.yaml"
    sc.write_text("frontend:\n  request_us: 200\n  input_token_us: 2\n  network_us: 30\n")
    sims, rows = {}, {}
    for mode in ("server", "client"):
        out = tmp_path / f"{mode}.json"
        res = cli("replay", "--scenario", sc, *REPLAY_FLAGS, "--trace-header", header,
                  "--trace-data", data, "--measured-at", mode, "--format", "json",
                  "--results-path", out, "--requests-out", tmp_path / f"{mode}.jsonl")
        assert res.exit_code == 0, res.stderr
        (sims[mode],) = json.loads(out.read_text())
        (rows[mode],) = [json.loads(x) for x in (tmp_path / f"{mode}.jsonl").read_text().splitlines()]
    assert sims["client"]["ttft_us"] >= sims["server"]["ttft_us"] + 200 + 600 + 2 * 30
    assert sims["client"]["e2e_us"] >= sims["server"]["e2e_us"] + 200 + 600 + 2 * 30
    assert (rows["server"]["arrived_at"], rows["client"]["arrived_at"]) == (5830 / 1e6, 5000 / 1e6)


@pytest.mark.parametrize("mode", ["server", "client"])
def test_streamed_rows_are_the_exact_ones(cli, tmp_path, mode):
    """Under --streaming-metrics each request's row is written when it leaves the instance —
    with a front end, when its last token reaches the client — so it carries the same
    figures as the exact run's rows, and the streamed means are the exact ones."""
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO + "frontend: {request_us: 300, input_token_us: 1, "
                  "step_output_us: 3000, output_token_us: 50, network_us: 100}\n")
    out = {}
    for streaming in ("--no-streaming-metrics", "--streaming-metrics"):
        rows = tmp_path / f"{streaming}.jsonl"
        res = cli("run", "--scenario", sc, "--measured-at", mode, streaming, "--format", "json",
                  "--requests-out", rows)
        assert res.exit_code == 0, res.stderr
        lines = sorted(json.loads(x)["requestID"] + x for x in rows.read_text().splitlines())
        out[streaming] = (json.loads(res.stdout)["cluster"], lines)
    (exact, exact_rows), (streamed, streamed_rows) = out.values()
    assert streamed_rows == exact_rows and len(exact_rows) == 24
    for key in ("completed_requests", "ttft_mean_ms", "e2e_mean_ms", "itl_mean_ms"):
        assert streamed[key] == pytest.approx(exact[key], rel=1e-12), key
