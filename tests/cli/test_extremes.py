"""Extremes (issue 13): one KV block, prompts that can never fit, a context cap below every
prompt, no request at all, exactly one request.

Every request that cannot be served is dropped, counted, and named in ONE summary line per cause
(blis_simpy/engine/tally.py); the counters add up to the requests offered; and every output
format (table, json, blis) and ``--results-path`` is a valid report, empty or one row.
"""

from __future__ import annotations

import json
import re

import pytest

from .support import SMALL_SCENARIO

DROP = re.compile(r"^WARNING blis_simpy\.\w+: dropped (?P<n>\d+) requests?: (?P<cause>.+); "
                  r"first: (?P<first>request_\d+) \((?P<why>.+)\)(?:, request_\d+)*(?:, \.\.\.)?$")

#: the small scenario's 24 requests: prompts of 2..600 tokens (mean 200), outputs of 2..120
OFFERED = 24
NEVER_FIT = "input needs more KV blocks than the N available"
NO_ROOM = "input length N >= MaxModelLen N (no room for output)"
# (flags, the one drop cause, requests dropped, the first dropped request's own reason)
EXTREMES = {
    "one KV block": (["--total-kv-blocks", "1"], NEVER_FIT, 24,
                     "input needs more KV blocks than the 1 available"),
    "prompts that never fit": (["--total-kv-blocks", "2", "--block-size-in-tokens", "8"], NEVER_FIT, 24,
                               "input needs more KV blocks than the 2 available"),
    "context cap below every prompt": (["--max-model-len", "1"], NO_ROOM, 24,
                                       "input length 55 >= MaxModelLen 1 (no room for output)"),
}


def _counters(path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("implementation", ["fast", "reference"])
@pytest.mark.parametrize("case", sorted(EXTREMES))
def test_unservable_requests_are_dropped_counted_and_named_once(cli, tmp_path, case, implementation):
    args, cause, dropped, first_why = EXTREMES[case]
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO.replace("  max_num_running_reqs: 16\n",
                                         f"  max_num_running_reqs: 16\n  implementation: {implementation}\n"))
    out = tmp_path / "r.json"
    res = cli("run", "--scenario", sc, "--format", "json", "--results-path", out, *args)
    assert res.exit_code == 0, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr                       # one line for the one cause
    m = DROP.match(lines[0])
    assert m, lines[0]
    assert (int(m["n"]), m["cause"], m["first"], m["why"]) == (dropped, cause, "request_0", first_why)
    c = _counters(out)
    assert c["dropped_unservable"] == dropped
    assert c["injected_requests"] == OFFERED
    assert (c["completed_requests"] + c["still_queued"] + c["still_running"] + c["dropped_unservable"]
            + c["timed_out_requests"]) == OFFERED
    assert c["completed_requests"] == 0 and "requests" not in c   # no row: nothing completed
    doc = json.loads(res.stdout)
    assert doc["anomaly_counters"]["dropped_unservable"] == dropped


def test_some_requests_fit_and_the_totals_still_add_up(cli, tmp_path):
    # 5 blocks of 16 tokens hold prompts of at most 80 tokens: the rest are dropped as never fitting
    out = tmp_path / "r.json"
    res = cli("run", "--scenario", _small(tmp_path), "--total-kv-blocks", "5", "--format", "json",
              "--results-path", out)
    assert res.exit_code == 0, res.stderr
    [line] = res.stderr.splitlines()
    m = DROP.match(line)
    assert m and m["cause"] == NEVER_FIT
    c = _counters(out)
    assert c["completed_requests"] + int(m["n"]) == OFFERED
    assert c["completed_requests"] == len(c["requests"]) > 0
    assert all(r["num_prefill_tokens"] <= 80 for r in c["requests"])


def _small(tmp_path):
    sc = tmp_path / "small.yaml"
    sc.write_text(SMALL_SCENARIO)
    return sc


# ---------------------------------------------------------------------------- empty and one-row reports
# No request (the first arrival, at 1/rate = 50 ms, is past a 10 us horizon) and exactly one.
SIZES = {"no request": (["--num-requests", "0", "--horizon", "10"], 0),
         "one request": (["--num-requests", "1"], 1)}


@pytest.mark.parametrize("fmt", ["table", "json", "blis"])
@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("pd", [False, True], ids=["co-located", "pd"])
def test_empty_and_one_request_reports_in_every_format(cli, tmp_path, size, fmt, pd):
    args, n = SIZES[size]
    if pd:
        args = [*args, "--num-instances", "2", "--prefill-instances", "1", "--decode-instances", "1",
                "--pd-decider", "always"]
    out = tmp_path / "r.json"
    res = cli("run", "--scenario", _small(tmp_path), "--format", fmt, "--results-path", out, *args)
    assert res.exit_code == 0, res.stderr
    assert res.stderr == ""
    c = _counters(out)                           # BLIS's results object (docs/metrics.md)
    assert (c["completed_requests"], c["injected_requests"]) == (n, n)
    assert len(c.get("requests", [])) == n       # "requests" is omitted when empty, as BLIS does
    if fmt == "json":
        doc = json.loads(res.stdout)
        assert doc["command"] == "run" and doc["cluster"]["completed_requests"] == n
    elif fmt == "blis":
        # BLIS prints a metrics block only for a scope that completed a request
        assert ("=== Simulation Metrics ===" in res.stdout) == (n > 0)
        if n:
            body = res.stdout.split("=== Simulation Metrics ===\n")[-1]
            block = json.loads(body[:body.index("\n}") + 2])
            assert block["instance_id"] == "cluster" and block["completed_requests"] == 1
    else:
        assert re.search(rf"│ Completed / injected\s+│\s+{n} / {n} │", res.stdout), res.stdout


def test_unfinished_requests_are_null_and_counted_not_zero(cli, tmp_path):
    """A 100 ms horizon: request_0 (arrives at 49,999 us, 10,326 us of alpha queueing delay) has
    its first token 17,886 us after arrival and does not finish; request_1 (arrives at 99,998 us)
    is still in its queueing delay. Our formats say "no value" (null / -), never 0 ms."""
    rows = tmp_path / "rows.jsonl"
    args = ("run", "--scenario", _small(tmp_path), "--num-requests", "5", "--horizon", "100000")
    res = cli(*args, "--format", "json", "--requests-out", rows)
    assert res.exit_code == 0, res.stderr
    c = json.loads(res.stdout)["cluster"]
    assert (c["completed_requests"], c["injected_requests"], c["unfinished_requests"]) == (0, 1, 1)
    assert (c["ttft_mean_ms"], c["ttft_p50_ms"], c["ttft_count"]) == (17.886, 17.886, 1)
    assert c["e2e_count"] == c["itl_count"] == 0
    assert c["e2e_mean_ms"] is None and c["e2e_p99_ms"] is None and c["itl_p50_ms"] is None
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [(r["requestID"], r["ttft_ms"], r["e2e_ms"], r["scheduling_delay_ms"]) for r in got] == [
        ("request_0", 17.886, None, 10.326), ("request_1", None, None, None)]
    table = cli(*args).stdout
    assert re.search(r"│ E2E +│ +- │ +- │ +- │ +- │ +- │ +0 │", table), table
    assert re.search(r"│ TTFT +│ +17\.89 │ +17\.89 │", table), table
    # BLIS's own results file keeps BLIS's 0 for an absent latency
    res = cli(*args, "--format", "json", "--results-path", tmp_path / "res.json")
    blis_rows = json.loads((tmp_path / "res.json").read_text())["requests"]
    assert [(r["ttft_ms"], r["e2e_ms"]) for r in blis_rows] == [(17.886, 0), (0, 0)]
