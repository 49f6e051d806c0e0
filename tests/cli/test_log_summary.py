"""Per-request warnings come as one line per cause at the end of a run (blis_simpy/engine/tally.py);
the deprecated offload threshold warns only when it is set."""

from __future__ import annotations

import json
import logging
import re

from blis_simpy.engine.tally import FIRST_IDS, Tally

from .support import QUICKSTART

LINE = re.compile(r"^WARNING blis_simpy\.(?P<logger>\w+): (?P<what>.+?) (?P<n>[\d,]+) requests?: "
                  r"(?P<cause>.+); first: (?P<first>.+)$")


def _lines(stderr: str) -> list[dict]:
    out = []
    for line in stderr.splitlines():
        if line.startswith("WARNING blis_simpy.run: saturated: "):   # docs/metrics.md, "Saturation"
            continue
        m = LINE.match(line)
        assert m, line                           # every stderr line is a per-cause summary
        out.append(m.groupdict() | {"n": int(m["n"].replace(",", ""))})
    return out


def test_drops_and_final_token_failures_are_summarised_per_cause(cli):
    # 60 KV blocks of 16 tokens for 60 requests at 50 req/s: some prompts never fit, some are
    # recomputed forever, one request's final token finds no block (non-fatal)
    res = cli("run", "--scenario", QUICKSTART, "--total-kv-blocks", "60", "--num-requests", "60",
              "--rate", "50", "--format", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    lines = _lines(res.stderr)
    dropped = [ln for ln in lines if ln["what"] == "dropped"]
    assert sorted(ln["cause"] for ln in dropped) == [
        "input needs more KV blocks than the N available",
        "it cannot get the KV blocks it needs on instance_N (N KV blocks in all) and would be "
        "recomputed forever"]
    assert sum(ln["n"] for ln in dropped) == doc["anomaly_counters"]["dropped_unservable"] == 9
    # 60 KV blocks cannot keep up with 50 req/s: the run is saturated, said once
    assert doc["saturation"]["saturated"] and res.stderr.count("saturated: ") == 1
    final = [ln for ln in lines if ln["what"] == "KV allocation failed for the final token of"]
    assert [(ln["n"], ln["cause"]) for ln in final] == [
        (1, "the request completes (counted as KV allocation failures)")]   # WARNING, not ERROR
    for ln in dropped:   # the first request's own text, then at most FIRST_IDS IDs in all
        ids = ln["first"].removesuffix(", ...").split(", ")
        assert len(ids) == min(ln["n"], FIRST_IDS)
        assert ids[0].startswith("request_") and "(" in ids[0]
        assert ln["first"].endswith(", ...") == (ln["n"] > FIRST_IDS)


def test_pd_drops_at_decode_are_one_line(cli):
    res = cli("run", "--scenario", QUICKSTART, "--num-instances", "2", "--prefill-instances", "1",
              "--decode-instances", "1", "--pd-decider", "always", "--total-kv-blocks", "80",
              "--num-requests", "60", "--rate", "50", "--format", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    [line] = _lines(res.stderr)
    assert (line["logger"], line["what"], line["cause"]) == (
        "cluster", "dropped at decode routing", "instance_N has no KV room for its prompt")
    assert line["n"] == doc["pd"]["dropped_at_decode_kv"] == 56


def test_each_event_is_still_logged_at_debug(cli):
    res = cli("run", "--scenario", QUICKSTART, "--total-kv-blocks", "60", "--num-requests", "60",
              "--rate", "50", "--format", "json", "--log", "debug")
    assert res.exit_code == 0
    per_request = [ln for ln in res.stderr.splitlines() if ln.startswith("DEBUG blis_simpy.engine: dropped request")]
    assert len(per_request) == 9


def test_tally_groups_causes_that_differ_in_numbers_and_caps_the_causes():
    log = logging.getLogger("blis_simpy.test_tally")
    t = Tally()
    for i in range(5):
        t.note(log, "dropped", f"input length {100 + i} >= MaxModelLen 100", f"r{i}")
    t.note(log, "dropped", "no decode instance", "r9")
    assert t.lines() == [
        ("blis_simpy.test_tally", logging.WARNING, "dropped 5 requests: input length N >= MaxModelLen N; "
                                                   "first: r0 (input length 100 >= MaxModelLen 100), r1, r2, ..."),
        ("blis_simpy.test_tally", logging.WARNING, "dropped 1 request: no decode instance; first: r9")]
    for i in range(200):                      # causes are bounded: the rest count as "other causes"
        t.note(log, "dropped", f"cause {'x' * (i % 97)} {i}", f"q{i}")
    assert len(t.lines()) <= 65
    assert sum(int(re.search(r"dropped ([\d,]+) request", ln).group(1)) for _, _, ln in t.lines()) == 206


def test_offload_threshold_warns_only_when_set(cli):
    base = ("run", "--scenario", QUICKSTART, "--kv-cpu-blocks", "100", "--num-requests", "5",
            "--num-instances", "2", "--format", "json")
    assert cli(*base).stderr == ""
    res = cli(*base, "--kv-offload-threshold", "0.9")
    assert res.exit_code == 0
    [line] = res.stderr.splitlines()          # once per deployment, not per instance
    assert line.startswith("WARNING blis_simpy: KVOffloadThreshold is deprecated")
