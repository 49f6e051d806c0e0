"""SLOs, goodput, GPUs and cost in every result; the distribution mode's arrival processes
(docs/metrics.md, "SLOs and goodput", "Deployment and cost"; docs/workloads.md, "Arrival
processes"): real runs through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .support import LOCATED, SMALL_SCENARIO, TRACE_COLUMNS, TRACE_HEADER

#: every step costs 1,000 µs + 10 µs per prefill token; no queueing or output-token overhead
COEFFS = ("--model", "meta-llama/llama-3.1-8b-instruct", "--alpha-coeffs", "0,0,0",
          "--beta-coeffs", "1000,10,0")
#: a bucket of 1,000 tokens refilled at 1 token/s: prompts of 100 + 200 + 300 + 400 pass, the
#: fifth (500) is rejected
BUCKET = ("--admission-policy", "token-bucket", "--token-bucket-capacity", "1000",
          "--token-bucket-refill-rate", "1")
#: (arrival µs, prompt, output, SLO class): each runs alone, so TTFT = 1,000 + 10·prompt µs and
#: E2E = TTFT + (output − 1)·1,000 µs: TTFT 2/3/4/5 ms, E2E 3/5/8/13 ms, mean ITL 1 ms
ROWS = [(0, 100, 2, "interactive"), (100_000, 200, 3, "interactive"), (200_000, 300, 5, "batch"),
        (300_000, 400, 9, "batch"), (400_000, 500, 2, "batch")]


@pytest.fixture
def hand_trace(tmp_path: Path) -> tuple[Path, Path]:
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    header.write_text(TRACE_HEADER)
    lines = [TRACE_COLUMNS] + [f"{i},c,,{c},,0,,0,false,{n},{m},0,0,0,0,0,,0,0,{t},{t},0,0,0,ok,,"
                               for i, (t, n, m, c) in enumerate(ROWS)]
    data.write_text("\n".join(lines) + "\n")
    return header, data


def _json(res) -> dict:
    assert res.exit_code == 0, (res.stdout, res.stderr)
    return json.loads(res.stdout)


def _replay(cli, trace, *args) -> dict:
    """Replay ``trace`` (header and data files, or ``("--scenario", FILE)``) as JSON."""
    source = trace if trace[0] == "--scenario" else ("--trace-header", trace[0], "--trace-data", trace[1])
    return _json(cli("replay", *COEFFS, *BUCKET, *source, "--format", "json", *args))


def test_hand_checked_attainment_and_goodput(cli, hand_trace):
    doc = _replay(cli, hand_trace, "--slo-ttft", "3.5", "--slo-e2e", "10")
    c = doc["cluster"]
    assert (c["completed_requests"], doc["anomaly_counters"]["rejected_requests_admission"]) == (4, 1)
    assert (c["ttft_mean_ms"], c["e2e_mean_ms"], c["vllm_estimated_duration_s"]) == (3.5, 7.25, 0.313)
    slo = doc["slo"]
    assert (slo["ttft_ms"], slo["itl_ms"], slo["e2e_ms"]) == (3.5, None, 10)
    assert (slo["offered_requests"], slo["completed_requests"]) == (5, 4)
    # TTFT ≤ 3.5: 2 and 3 ms; E2E ≤ 10: 3, 5 and 8 ms; the rejected fifth fails every target
    assert slo["met_requests"] == {"ttft": 2, "itl": 4, "e2e": 3, "all": 2}
    assert slo["attainment_pct"] == {"ttft": 40, "itl": None, "e2e": 60, "all": 40}
    assert slo["goodput_rps"] == 2 / 0.313
    assert slo["goodput_rps"] == c["responses_per_sec"] / 2     # same time base: 2 of 4 completed
    batch = slo["per_class"]["batch"]
    assert (batch["offered_requests"], batch["completed_requests"]) == (3, 2)
    assert batch["attainment_pct"] == {"ttft": 0, "itl": None, "e2e": 100 / 3, "all": 0}
    assert slo["per_class"]["interactive"]["attainment_pct"]["all"] == 100
    assert doc["deployment"] == {"total_gpus": 1, "gpu_hour_usd": None, "cost_per_hour_usd": None,
                                 "cost_per_million_output_tokens_usd": None}
    # the ITL target is the request's mean ITL (1 ms here), inclusive
    assert _replay(cli, hand_trace, "--slo-itl", "1")["slo"]["met_requests"]["itl"] == 4
    assert _replay(cli, hand_trace, "--slo-itl", "0.999")["slo"]["met_requests"]["itl"] == 0


def test_per_class_targets_and_flags_override_the_scenario(cli, hand_trace, tmp_path):
    sc = tmp_path / "slo.yaml"
    sc.write_text(f"workload: {{kind: trace, header: {hand_trace[0]}, data: {hand_trace[1]}}}\n"
                  "slo:\n  ttft_ms: 3.5\n  e2e_ms: 10\n"
                  "  classes:\n    batch: {ttft_ms: 10, e2e_ms: 20}\n")
    doc = _replay(cli, ("--scenario", sc))
    slo = doc["slo"]
    assert slo["per_class"]["batch"]["e2e_ms"] == 20
    assert slo["per_class"]["batch"]["met_requests"]["all"] == 2     # 4/8 ms and 5/13 ms meet 10/20
    assert slo["per_class"]["interactive"]["met_requests"]["all"] == 2
    assert slo["attainment_pct"]["all"] == 80                       # 4 of 5 offered
    # --slo-ttft replaces the top-level 3.5 ms, not batch's own 10 ms
    doc = _replay(cli, ("--scenario", sc), "--slo-ttft", "2.5")
    assert doc["slo"]["ttft_ms"] == 2.5
    assert doc["slo"]["per_class"]["interactive"]["met_requests"]["ttft"] == 1
    assert doc["slo"]["per_class"]["batch"]["met_requests"]["ttft"] == 2


def test_streaming_and_exact_slo_blocks_are_equal(cli, small_scenario, hand_trace):
    args = ("run", "--scenario", small_scenario, "--slo-ttft", "40", "--slo-itl", "7",
            "--slo-e2e", "300", "--format", "json")
    exact, streamed = _json(cli(*args)), _json(cli(*args, "--streaming-metrics"))
    assert 0 < exact["slo"]["met_requests"]["all"] < exact["slo"]["offered_requests"]
    assert exact["slo"] == streamed["slo"] and exact["deployment"] == streamed["deployment"]
    a = _replay(cli, hand_trace, "--slo-ttft", "3.5", "--slo-e2e", "10")
    b = _replay(cli, hand_trace, "--slo-ttft", "3.5", "--slo-e2e", "10", "--streaming-metrics")
    assert a["slo"] == b["slo"]


def test_results_file_and_absent_keys(cli, small_scenario, tmp_path):
    plain = _json(cli("run", "--scenario", small_scenario, "--format", "json"))
    assert "slo" not in plain and "deployment" not in plain        # BLIS's document unchanged
    out = tmp_path / "r.json"
    doc = _json(cli("run", "--scenario", small_scenario, "--slo-e2e", "300", "--gpu-hour-cost", "2",
                    "--results-path", out, "--format", "json"))
    saved = json.loads(out.read_text())
    assert list(saved)[-3:] == ["requests", "slo", "deployment"]   # after every BLIS key
    assert saved["slo"] == doc["slo"] and saved["deployment"] == doc["deployment"]
    assert list(doc)[-2:] == ["slo", "deployment"]
    # a price alone adds "deployment" only
    priced = _json(cli("run", "--scenario", small_scenario, "--gpu-hour-cost", "2", "--format", "json"))
    assert "slo" not in priced
    assert priced["deployment"]["cost_per_hour_usd"] == 2
    tps = priced["cluster"]["tokens_per_sec"]
    assert priced["deployment"]["cost_per_million_output_tokens_usd"] == 2 / (tps * 3600) * 1e6


@pytest.mark.parametrize(("args", "gpus"), [
    (("--tp", "2", "--dp", "2", "--num-instances", "2"), 8),
    (("--num-instances", "3", "--prefill-instances", "1", "--decode-instances", "2",
      "--prefill-tp", "4", "--decode-tp", "1", "--pd-decider", "always"), 6),
])
def test_gpus_and_cost_tp_dp_pd(cli, args, gpus):
    doc = _json(cli("run", *COEFFS, "--num-requests", "10", *args, "--gpu-hour-cost", "2.5",
                    "--format", "json"))
    assert doc["deployment"]["total_gpus"] == gpus
    assert doc["deployment"]["cost_per_hour_usd"] == 2.5 * gpus


def test_catalog_price_and_table(cli, tmp_path):
    hw = tmp_path / "hw.json"
    hw.write_text('{"H100": {"TFlopsPeak": 989.5, "BwPeakTBs": 3.35, "mfuPrefill": 0.45, '
                  '"mfuDecode": 0.3, "MemoryGiB": 80, "price_per_hour_usd": 3.5}}')
    base = ("run", *COEFFS, "--num-requests", "10", "--hardware", "H100", "--hardware-config", hw,
            "--tp", "2")
    assert _json(cli(*base, "--format", "json"))["deployment"]["cost_per_hour_usd"] == 7
    assert _json(cli(*base, "--gpu-hour-cost", "1", "--format", "json"))["deployment"][
        "cost_per_hour_usd"] == 2                                   # the flag wins over the catalog
    res = cli(*base, "--slo-ttft", "1000")
    assert res.exit_code == 0, res.stderr
    assert "SLOs (attainment over 10 offered requests)" in res.stdout
    assert "$7.00/h" in res.stdout and "100.00%" in res.stdout


def test_blis_format_is_unchanged_by_slos(cli, small_scenario):
    plain = cli("run", "--scenario", small_scenario, "--format", "blis")
    with_slo = cli("run", "--scenario", small_scenario, "--slo-ttft", "40", "--gpu-hour-cost", "2",
                   "--format", "blis")
    assert plain.exit_code == with_slo.exit_code == 0
    assert plain.stdout == with_slo.stdout


def test_arrival_flags(cli, small_scenario, tmp_path):
    def arrivals(*args) -> list[float]:
        out = tmp_path / "r.json"
        res = cli("run", "--scenario", small_scenario, "--results-path", out, *args, "--format", "json")
        assert res.exit_code == 0, res.stderr
        return [r["arrived_at"] for r in json.loads(out.read_text())["requests"]]

    const = arrivals()
    # BLIS: every gap is int(1/rate) µs — 1/(20/1e6) = 49,999.99… truncated
    assert [round(t * 1e6) for t in const] == [(i + 1) * 49_999 for i in range(24)]
    assert arrivals("--arrival", "constant") == const
    poisson = arrivals("--arrival", "poisson")
    assert poisson != const and poisson == arrivals("--arrival", "poisson")
    gamma = arrivals("--arrival", "gamma", "--arrival-cv", "3")
    assert gamma not in (const, poisson) and gamma == arrivals("--arrival", "gamma", "--arrival-cv", "3")
    sc = tmp_path / "g.yaml"
    sc.write_text(SMALL_SCENARIO.replace("  rate: 20.0\n", "  rate: 20.0\n  arrival: gamma\n  arrival_cv: 3\n"))
    res = cli("run", "--scenario", sc, "--results-path", tmp_path / "g.json", "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert [r["arrived_at"] for r in json.loads((tmp_path / "g.json").read_text())["requests"]] == gamma


def _one_line(res) -> str:
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert res.stdout == "" and "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--slo-ttft", "-1", "must be > 0"), ("--slo-itl", "nan", "must be > 0"),
    ("--slo-e2e", "0", "must be > 0"), ("--gpu-hour-cost", "inf", "must be > 0"),
    ("--arrival", "weibull", "must be one of constant, poisson, gamma"),
    ("--arrival-cv", "0", "must be > 0"),
])
def test_bad_flag_values(cli, small_scenario, flag, value, words):
    line = _one_line(cli("run", "--scenario", small_scenario, flag, value))
    assert line.startswith(f"error: {flag}: ") and words in line


@pytest.mark.parametrize(("text", "line", "field", "words"), [
    ("slo:\n  ttft_ms: -5\n", 2, "slo.ttft_ms", "greater than 0"),
    ("slo:\n  e2e_ms: .nan\n", 2, "slo.e2e_ms", "finite"),
    ("slo:\n  ttft_ms: 5\n  p99: true\n", 3, "slo.p99", "unknown key"),
    ("slo:\n  classes:\n    batch:\n      tpot_ms: 3\n", 4, "slo.classes.batch.tpot_ms", "unknown key"),
    ("cost:\n  gpu_hour_usd: 0\n", 2, "cost.gpu_hour_usd", "greater than 0"),
    ("workload:\n  kind: distribution\n  arrival: weibull\n", 3, "workload.arrival", "constant"),
])
def test_bad_scenario_values_are_located(cli, tmp_path, text, line, field, words):
    sc = tmp_path / "bad.yaml"
    sc.write_text("model: meta-llama/llama-3.1-8b-instruct\n" + text)
    m = LOCATED.match(_one_line(cli("run", "--scenario", sc)))
    assert m, "not located"
    assert (m["file"], int(m["line"]) - 1, m["field"]) == (str(sc), line, field)
    assert words in m["problem"]
