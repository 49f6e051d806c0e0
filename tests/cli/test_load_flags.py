"""Closed-loop clients and time-varying load on the command line (docs/cli.md): the flags,
the header line, and bad input — exit 2, one located ``error:`` line."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import LOCATED, REPO, SMALL_SCENARIO
from .support import one_error as _one_error


@pytest.mark.parametrize("args, line", [
    (["--concurrency", "0"], "error: --concurrency: must be > 0, got 0"),
    (["--concurrency", "1000001"], "error: --concurrency: input should be less than or equal to 1000000, got 1000001"),
    (["--concurrency", "x"], None),
    (["--think-time-ms", "5"], "error: --think-time-ms: applies to closed-loop clients: set "
                               "workload.concurrency or workload.concurrency_stages"),
    (["--concurrency", "2", "--think-time-dist", "gauss"], None),
    (["--concurrency", "2", "--think-time-dist", "lognormal"],
     "error: --think-time-dist: a lognormal think time needs workload.think_time.mean_ms > 0"),
    (["--concurrency", "2", "--think-time-ms", "-1"], "error: --think-time-ms: must be >= 0, got -1.0"),
    (["--concurrency", "2", "--think-time-ms", "1e9"], None),
    (["--concurrency", "2", "--think-time-sigma", "11"], None),
])
def test_bad_closed_loop_flags(cli, small_scenario, args, line):
    got = _one_error(cli("run", "--scenario", small_scenario, *args))
    if line is not None:
        assert got == line
    else:
        assert got.startswith(f"error: {args[-2]}: ")


def test_rate_schedule_flag_errors_name_the_file_and_line(cli, small_scenario, tmp_path):
    bad = tmp_path / "day.csv"
    bad.write_text("time_s,rate\n0,5\n60,fast\n")
    assert _one_error(cli("run", "--scenario", small_scenario, "--rate-schedule", bad)) == \
        f"error: {bad}:3: rate: not a number: 'fast'"
    missing = tmp_path / "none.csv"
    assert _one_error(cli("run", "--scenario", small_scenario, "--rate-schedule", missing)).startswith(
        f"error: --rate-schedule: cannot read the rate CSV {missing}")


def test_rate_schedule_on_a_trace_is_refused(cli, tmp_path, trace_files):
    header, data = trace_files
    sc = tmp_path / "t.yaml"
    sc.write_text(SMALL_SCENARIO.split("workload:")[0]
                  + f"workload: {{kind: trace, header: {header}, data: {data}}}\n")
    csv = tmp_path / "r.csv"
    csv.write_text("time_s,rate\n0,1\n")
    assert _one_error(cli("run", "--scenario", sc, "--rate-schedule", csv)).startswith(
        "error: --rate-schedule: applies to a distribution workload")


def _scenario(tmp_path: Path, workload_extra: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(SMALL_SCENARIO + workload_extra)
    return p


@pytest.mark.parametrize("extra, field, problem", [
    ("  concurrency_stages: [{concurrency: 2, duration_s: 0}]\n",
     "workload.concurrency_stages[0].duration_s", "input should be greater than 0"),
    ("  concurrency_stages: [{concurrency: 2, duration_s: 1.0e+9}]\n",
     "workload.concurrency_stages[0].duration_s", "input should be less than or equal to"),
    ("  concurrency_stages: [{concurrency: -1, duration_s: 1}]\n",
     "workload.concurrency_stages[0].concurrency", "input should be greater than or equal to 0"),
    ("  concurrency_stages: [{concurrency: 2, duration_s: 1, num_requests: 5}]\n",
     "workload.concurrency_stages[0]", "give exactly one of duration_s and num_requests"),
    ("  concurrency_stages: [{concurrency: 2}]\n",
     "workload.concurrency_stages[0]", "give exactly one of duration_s and num_requests"),
    ("  concurrency: 2\n  concurrency_stages: [{concurrency: 2, duration_s: 1}]\n",
     "workload.concurrency_stages", "give workload.concurrency or workload.concurrency_stages"),
    ("  stages: [{rate: 1.0e+10, duration_s: 1}]\n",
     "workload.stages[0].rate", "input should be less than or equal to 1000000000"),
    ("  stages: []\n", "workload.stages", "list should have at least 1 item"),
    ("  rate_schedule:\n    - {at_s: 0, rate: 1}\n    - {at_s: 0, rate: 2}\n",
     "workload.rate_schedule[1].at_s", "0 is not after the previous point's 0"),
    ("  stages: [{rate: 1, duration_s: 1}]\n  rate_schedule: [{at_s: 0, rate: 1}]\n",
     "workload.rate_schedule", "give one of workload.stages, workload.rate_schedule"),
    ("  stages: [{rate: 1, duration_s: 1}]\n  concurrency: 3\n",
     "workload.stages", "open-loop arrivals cannot be combined with closed-loop clients"),
])
def test_bad_load_keys_are_located(cli, tmp_path, extra, field, problem):
    sc = _scenario(tmp_path, extra)
    line = _one_error(cli("run", "--scenario", sc))
    m = LOCATED.match(line)
    assert m and m["file"] == str(sc) and m["field"] == field, line
    assert m["problem"].lower().startswith(problem.lower()), line
    src = sc.read_text().splitlines()[int(m["line"]) - 1]     # the line of the key named
    assert field.split(".")[-1].split("[")[0] in src, (line, src)


def test_too_many_arrivals_and_an_open_schedule(cli, tmp_path):
    """Without a written num_requests a schedule is not capped: its arrivals are bounded."""
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO.replace("  num_requests: 24\n", "")
                  + "  stages: [{rate: 1.0e+9, duration_s: 1.0e+8}]\n")
    line = len(sc.read_text().splitlines())
    assert _one_error(cli("run", "--scenario", sc)) == (
        f"error: {sc}:{line}: workload.stages: about 1e+17 arrivals, more than the 10000000 a "
        "workload may have: set workload.num_requests or a shorter horizon")
    csv = tmp_path / "r.csv"
    csv.write_text("time_s,rate\n0,1\n")
    sc.write_text(SMALL_SCENARIO.replace("  num_requests: 24\n", ""))
    assert _one_error(cli("run", "--scenario", sc, "--rate-schedule", csv)) == (
        "error: --rate-schedule: the last rate never ends: set horizon_us (--horizon) or "
        "workload.num_requests")


def test_closed_loop_sessions_cannot_be_a_pool(cli):
    got = _one_error(cli("run", "--scenario", REPO / "scenarios" / "multiturn_chat.yaml",
                         "--concurrency", "3"))
    assert got.startswith("error: --concurrency: closed-loop clients cannot send a workload with "
                          "closed-loop multi-turn sessions")


def test_closed_loop_run_and_replay(cli, small_scenario, trace_files):
    res = cli("run", "--scenario", small_scenario, "--concurrency", "3", "--think-time-dist",
              "exponential", "--think-time-ms", "20")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[0].startswith("run: 24 requests sent by 3 closed-loop clients,")
    header, data = trace_files
    res = cli("replay", "--scenario", small_scenario, "--trace-header", header, "--trace-data", data,
              "--concurrency", "2")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[0].startswith("replay: 12 requests sent by 2 closed-loop clients,")


def test_a_preset_keeps_the_scenario_load_keys(cli, tmp_path):
    sc = _scenario(tmp_path, "  concurrency: 2\n")
    res = cli("run", "--scenario", sc, "--workload", "chatbot", "--num-requests", "5")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[0].startswith("run: 5 requests sent by 2 closed-loop clients,")


def test_validate_names_the_load_shape(cli, tmp_path):
    res = cli("validate", _scenario(tmp_path, "  concurrency: 2\n"))
    assert res.exit_code == 0 and "(24 requests at 20 req/s) sent by 2 closed-loop clients" in res.stdout
    p = tmp_path / "t.yaml"
    p.write_text(SMALL_SCENARIO + "  rate_schedule: [{at_s: 0, rate: 5}]\n")
    res = cli("validate", p)
    assert res.exit_code == 0 and "distribution workload (time-varying rate: rate_schedule)" in res.stdout


def test_observe_refuses_closed_loop_clients(cli, tmp_path):
    """observe sends to a real server at the workload's arrival times; its closed loop is
    --max-concurrency."""
    sc = _scenario(tmp_path, "  concurrency: 2\n")
    line = len(sc.read_text().splitlines())
    out = tmp_path / "o"
    got = _one_error(cli("observe", "--server-url", "http://127.0.0.1:9", "--model", "m",
                         "--scenario", sc, "--trace-header", f"{out}.yaml", "--trace-data",
                         f"{out}.csv", "--results", f"{out}.json"))
    assert got == (f"error: {sc}:{line}: workload.concurrency: observe sends the workload at its own "
                   "arrival times: for a closed loop against a server use --max-concurrency")
    assert not list(tmp_path.glob("o.*"))


def test_a_rate_csv_is_read_relative_to_the_scenario(cli, tmp_path):
    """`workload.rate_csv` names a file next to the scenario; 4 req/s for 1 s, then nothing."""
    (tmp_path / "day.csv").write_text("time_s,rate\n0,4\n1,0\n")
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO.replace("  num_requests: 24\n", "") + "  rate_csv: day.csv\n")
    res = cli("run", "--scenario", sc, "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert '"completed_requests": 4' in res.stdout
