"""--timeline: exact samples on a hand-checked replay, byte-identical results with and without
it, both file formats, the caps and the errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from tests.cli.support import TRACE_COLUMNS

HEADER = "trace_version: 2\ntime_unit: microseconds\nmode: real\nwarm_up_requests: 0\n"
# every step takes 10 ms (beta0), no queueing delay, one request at a time
SCENARIO = """\
seed: 1
model: meta-llama/llama-3.1-8b-instruct
latency: {model: blackbox, alpha_coeffs: [0, 0, 0], beta_coeffs: [10000, 0, 0]}
engine: {total_kv_blocks: 100, max_num_running_reqs: 1}
"""
RUN = ["run", "--model", "qwen/qwen3-14b", "--hardware", "H100", "--tp", "1",
       "--latency-model", "roofline", "--format", "json"]


def _row(rid: int, arrival: int, n_in: int, n_out: int) -> str:
    return (f"{rid},c,,,,0,,0,true,{n_in},{n_out},0,0,0,0,0,,0,{n_in},{arrival},{arrival},"
            f"0,0,{n_out},ok,,stop")


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def tiny(tmp_path: Path) -> list[str]:
    (tmp_path / "t.yaml").write_text(HEADER)
    rows = [_row(0, 0, 16, 3), _row(1, 1_000, 16, 2)]
    (tmp_path / "t.csv").write_text(TRACE_COLUMNS + "\n" + "".join(r + "\n" for r in rows))
    (tmp_path / "s.yaml").write_text(SCENARIO)
    return ["replay", "--scenario", tmp_path / "s.yaml", "--trace-header", tmp_path / "t.yaml",
            "--trace-data", tmp_path / "t.csv", "--horizon", "1000000", "--format", "json"]


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_hand_checked_samples(tiny, tmp_path):
    # The engine does a step's bookkeeping when the step begins (BLIS's model): a request
    # leaves the running batch, and frees its KV blocks, when its last step begins.
    # Request 0 (t = 0, 3 output tokens): steps begin at 0 (prefill), 10 and 20 ms (its last):
    # running over (0, 20] ms. Request 1 arrives at 1 ms and waits (one running request at
    # most) until the engine is free at 30 ms; steps at 30 and 40 ms (its last), which holds
    # the engine until 50 ms (docs/engine.md, "A step holds the engine"). A sample at t is the
    # state just before the events at t; the last event is the end of that step at 50 ms, so
    # the last sample (55 ms) is the final, empty state.
    out = tmp_path / "tl.csv"
    res = _cli(*tiny, "--timeline", out, "--timeline-interval-ms", "5")
    assert res.exit_code == 0, res.output
    rows = _read_csv(out)
    got = [(int(r["t_us"]), int(r["running"]), int(r["waiting"])) for r in rows]
    want = [(0, 0, 0), (5_000, 1, 1), (10_000, 1, 1), (15_000, 1, 1), (20_000, 1, 1),
            (25_000, 0, 1), (30_000, 0, 1), (35_000, 1, 0), (40_000, 1, 0), (45_000, 0, 0),
            (50_000, 0, 0), (55_000, 0, 0)]
    assert got == want
    assert {r["instance"] for r in rows} == {"instance_0"} and {r["role"] for r in rows} == {""}
    assert all(r["kv_transfers_in_flight"] == "" and r["preemptions"] == "0" for r in rows)
    assert all(r["kv_blocks_total"] == "100" for r in rows)
    kv = {int(r["t_us"]): int(r["kv_blocks_used"]) for r in rows}
    # 16 prompt tokens = 1 block; the first decode step (10 ms) writes token 17: a second block
    assert kv == {0: 0, 5_000: 1, 10_000: 1, 15_000: 2, 20_000: 2, 25_000: 0, 30_000: 0,
                  35_000: 1, 40_000: 1, 45_000: 0, 50_000: 0, 55_000: 0}
    # steps begin at 0, 10, 20 (request 0), 30 and 40 ms (request 1): the steps begun before t
    steps = {int(r["t_us"]): int(r["steps"]) for r in rows}
    assert steps == {0: 0, 5_000: 1, 10_000: 1, 15_000: 2, 20_000: 2, 25_000: 3, 30_000: 3,
                     35_000: 4, 40_000: 4, 45_000: 5, 50_000: 5, 55_000: 5}
    assert list(rows[0]) == ["t_us", "instance", "role", "running", "waiting", "kv_blocks_used",
                             "kv_blocks_total", "preemptions", "kv_transfers_in_flight", "steps"]


def _same_with_and_without(tmp_path: Path, args: list, suffix: str) -> None:
    plain = tmp_path / "plain.json"
    timed = tmp_path / "timed.json"
    a = _cli(*args, "--results-path", plain)
    b = _cli(*args, "--results-path", timed, "--timeline", tmp_path / f"tl{suffix}",
             "--timeline-interval-ms", "1")
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert a.stdout == b.stdout
    assert plain.read_bytes() == timed.read_bytes()


@pytest.mark.parametrize("extra", [
    # preemptions on a small KV cache, 3 instances, a horizon that cuts the run mid-way
    ["--num-instances", "3", "--total-kv-blocks", "800", "--rate", "40", "--num-requests", "120",
     "--horizon", "2500000"],
    # prefill/decode pools: transfers on the fabric
    ["--num-instances", "4", "--prefill-instances", "2", "--decode-instances", "2",
     "--pd-decider", "always", "--rate", "20", "--num-requests", "80"],
])
def test_outputs_byte_identical_with_timeline(tmp_path, extra):
    _same_with_and_without(tmp_path, RUN + extra, ".parquet")


def test_replay_byte_identical_with_timeline(tiny, tmp_path):
    _same_with_and_without(tmp_path, tiny, ".csv")


def test_pd_columns_and_parquet(tmp_path):
    out = tmp_path / "tl.parquet"
    res = _cli(*RUN, "--num-instances", "3", "--prefill-instances", "1", "--decode-instances", "2",
               "--pd-decider", "always", "--rate", "20", "--num-requests", "60", "--timeline", out)
    assert res.exit_code == 0, res.output
    t = pq.read_table(out).to_pydict()
    assert set(t["role"]) == {"prefill", "decode"}
    assert max(t["kv_transfers_in_flight"]) >= 1 and min(t["kv_transfers_in_flight"]) == 0
    assert t["t_us"][:3] == [0, 0, 0] and t["t_us"][3] == 100_000     # default 100 ms, 3 rows a sample


def test_preemptions_are_cumulative(tmp_path):
    out = tmp_path / "tl.csv"
    res = _cli(*RUN, "--total-kv-blocks", "400", "--rate", "40", "--num-requests", "100",
               "--timeline", out)
    assert res.exit_code == 0, res.output
    p = [int(r["preemptions"]) for r in _read_csv(out)]
    assert p == sorted(p) and p[-1] > 0


def test_sample_cap(tmp_path, monkeypatch):
    import blis_simpy.cluster.monitor as mon
    monkeypatch.setattr(mon, "MAX_SAMPLES", 3)
    out = tmp_path / "tl.csv"
    res = _cli(*RUN, "--num-instances", "2", "--num-requests", "20", "--timeline", out)
    assert res.exit_code == 0, res.output
    assert [int(r["t_us"]) for r in _read_csv(out)] == [0, 0, 100_000, 100_000, 200_000, 200_000]
    assert "timeline: stopped at 3 samples" in res.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--timeline", "x.txt"], "--timeline: unknown suffix '.txt'"),
    (["--timeline", "no/such/dir/x.csv"], "no such directory"),
    (["--timeline", "x.csv", "--timeline-interval-ms", "0.5"], "greater than or equal to 1"),
    (["--timeline", "x.csv", "--timeline-interval-ms", "-3"], "--timeline-interval-ms"),
])
def test_bad_timeline_flags_exit_2(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    res = _cli(*RUN, "--num-requests", "5", *args)
    assert res.exit_code == 2
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and needle in res.stderr
    assert not any(tmp_path.iterdir())
