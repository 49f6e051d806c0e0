"""What the tables and our JSON show: session outcomes, the PD pools' routing targets in the
decision-trace summary, the cache hit rate and GPUs in the ``variants:`` comparison, total
GPUs in the run header. BLIS's own layout (``--format blis``) is unchanged."""

from __future__ import annotations

import json

from .support import QUICKSTART, REPO

MULTITURN = REPO / "scenarios" / "multiturn_chat.yaml"
SESSION_KEYS = ["total", "completed", "cancelled_timeout", "cancelled_dropped", "cancelled_rejected",
                "horizon_interrupted", "in_flight_at_horizon", "followup_requests"]


def test_session_outcomes_in_json_and_tables(cli):
    doc = json.loads(cli("run", "--scenario", MULTITURN, "--format", "json").stdout)
    s = doc["sessions"]
    assert list(s) == SESSION_KEYS
    ended = s["completed"] + s["cancelled_timeout"] + s["cancelled_dropped"] + s["cancelled_rejected"] \
        + s["horizon_interrupted"] + s["in_flight_at_horizon"]
    assert ended == s["total"] > 0 and s["followup_requests"] > 0
    # every follow-up request is a request of the run: the round-0 requests + follow-ups injected
    assert doc["cluster"]["injected_requests"] <= s["total"] + s["followup_requests"]
    table = cli("run", "--scenario", MULTITURN).stdout
    assert "Closed-loop sessions" in table
    assert f"Follow-up requests                   │ {s['followup_requests']:>3,} │" in table
    assert "SessionCounters(" not in table


def test_no_sessions_key_without_sessions(cli):
    doc = json.loads(cli("run", "--scenario", QUICKSTART, "--num-requests", "3", "--format", "json").stdout)
    assert "sessions" not in doc


PD = ("run", "--scenario", QUICKSTART, "--num-requests", "4", "--num-instances", "4",
      "--prefill-instances", "2", "--decode-instances", "2", "--pd-decider", "always", "--summarize-trace")


def test_pd_trace_summary_counts_the_pool_targets(cli):
    doc = json.loads(cli(*PD, "--format", "json").stdout)
    ts = doc["trace_summary"]
    # round-robin in each pool: requests 0..3 alternate over instance_0/1 (prefill), 2/3 (decode)
    assert ts["pool_target_distribution"] == {"prefill": {"instance_0": 2, "instance_1": 2},
                                              "decode": {"instance_2": 2, "instance_3": 2}}
    # our JSON and table count the pools' targets too; BLIS's text does not (next test)
    assert (ts["unique_targets"], ts["target_distribution"]) == (4, {})
    table = cli(*PD).stdout
    line = next(ln for ln in table.splitlines() if "Unique targets" in ln)
    assert line.split("│")[2].strip() == "4"
    assert "Prefill pool targets" in table and "Decode pool targets" in table


def test_pd_blis_text_is_blis(cli):
    """BLIS counts standard routing only: its layout keeps ``Unique Targets: 0`` in PD runs."""
    out = cli(*PD, "--format", "blis").stdout
    assert "Unique Targets: 0\n" in out and "pool" not in out.lower().split("=== trace summary ===")[1]


def test_variants_comparison_has_gpus_and_the_cache_hit_rate(cli):
    doc = json.loads(cli("run", "--scenario", REPO / "scenarios" / "pd_comparison.yaml",
                         "--num-requests", "20", "--format", "json").stdout)
    for c, v in zip(doc["comparison"], doc["variants"], strict=True):
        assert c["cache_hit_rate"] == v["kv_cache"]["cache_hit_rate"]
        assert c["gpus"] == 4
    table = cli("run", "--scenario", REPO / "scenarios" / "pd_comparison.yaml", "--num-requests", "20").stdout
    head = table.split("Counters")[0]
    assert "GPUs" in head and "KV hit" in head


def test_run_header_shows_total_gpus(cli):
    out = cli("run", "--scenario", QUICKSTART, "--num-requests", "3", "--num-instances", "2", "--tp", "2").stdout
    assert out.splitlines()[0].startswith("run: 3 requests, 2 instances x TP 2 = 4 GPUs, ")
