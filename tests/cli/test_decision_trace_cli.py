"""``--summarize-trace`` implies the decision trace; ``--trace-output-decisions FILE`` writes
its records as JSON Lines (all-or-nothing)."""

from __future__ import annotations

import json

from .support import QUICKSTART, REPO

TINY = ("--scenario", QUICKSTART, "--num-requests", "3", "--num-instances", "2")


def test_summarize_trace_alone_prints_the_summary(cli):
    res = cli("run", *TINY, "--summarize-trace", "--format", "blis")
    assert res.exit_code == 0, res.stderr
    assert "=== Trace Summary ===\nTotal Decisions: 3\n  Admitted: 3\n  Rejected: 0\nUnique Targets: 2\n" \
        in res.stdout
    assert "no effect" not in res.stderr


def test_decision_records_as_jsonl(cli, tmp_path):
    out = tmp_path / "decisions.jsonl"
    res = cli("run", *TINY, "--trace-output-decisions", out, "--format", "json")
    assert res.exit_code == 0, res.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    # quickstart: constant arrivals 125 ms apart; round-robin over two instances
    assert [(r["kind"], r["request_id"], r["clock_us"]) for r in recs] == [
        ("admission", "request_0", 125_000), ("admission", "request_1", 250_000),
        ("admission", "request_2", 375_000),
        ("routing", "request_0", 125_000), ("routing", "request_1", 250_000),
        ("routing", "request_2", 375_000)]
    assert [r["chosen_instance"] for r in recs[3:]] == ["instance_0", "instance_1", "instance_0"]
    assert recs[0] == {"kind": "admission", "request_id": "request_0", "clock_us": 125_000,
                       "admitted": True, "reason": ""}
    assert set(recs[3]) == {"kind", "request_id", "clock_us", "chosen_instance", "reason", "scores",
                            "candidates", "regret"}
    assert json.loads(res.stdout)["trace_summary"] is None      # the file only: no summary asked


def test_pd_records_and_their_kinds(cli, tmp_path):
    out = tmp_path / "pd.jsonl"
    res = cli("run", *TINY, "--prefill-instances", "1", "--decode-instances", "1", "--pd-decider",
              "always", "--trace-output-decisions", out, "--format", "json")
    assert res.exit_code == 0, res.stderr
    kinds = [json.loads(line)["kind"] for line in out.read_text().splitlines()]
    assert kinds == ["admission"] * 3 + ["disaggregation"] * 3 + ["prefill_routing"] * 3 + \
        ["decode_routing"] * 3 + ["kv_transfer"] * 3


def test_unwritable_decisions_file_writes_nothing(cli, tmp_path):
    results = tmp_path / "results.json"
    res = cli("run", *TINY, "--results-path", results, "--trace-output-decisions",
              tmp_path / "no-dir" / "d.jsonl", "--format", "json")
    assert res.exit_code == 2 and res.stdout == ""
    [line] = res.stderr.splitlines()
    assert line.startswith(f"error: {tmp_path / 'no-dir' / 'd.jsonl'}") and "--trace-output-decisions" in line
    assert list(tmp_path.iterdir()) == []


def test_refused_with_variants(cli, tmp_path):
    res = cli("run", "--scenario", REPO / "scenarios" / "pd_comparison.yaml", "--trace-output-decisions",
              tmp_path / "d.jsonl")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: --trace-output-decisions: not supported with scenario variants")
    assert list(tmp_path.iterdir()) == []
