"""calibrate and fit on aggregate runs (a hand-made inference-perf folder) and on a vllm bench
result, with hand-checked figures.

Every step of the blackbox model below takes 1000 µs (alpha 0, beta [1000, 0, 0]). A request
of 3 output tokens alone in the engine: a prefill step (first token at 1 ms), two decode
steps: TTFT 1 ms, E2E 3 ms, per-token ITLs 1 ms and 1 ms. The rebuilt sends are at least
0.1 s apart (tests/workload/test_observed_inference_perf.py), so every request is alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.calibrate.aggregate import calibrate_aggregate
from blis_simpy.calibrate.aggregate_twin import client_measured
from blis_simpy.cli.app import app
from blis_simpy.cli.calibrate_cmd import prepare_runs
from blis_simpy.fit import AggregateCase, Objective, space_for
from tests.workload.iperf_support import write_run

BLACKBOX = ("--hardware", "H100", "--latency-model", "blackbox", "--alpha-coeffs", "0,0,0",
            "--beta-coeffs", "1000,0,0", "--total-kv-blocks", "300")
BENCH = Path(__file__).resolve().parents[1] / "workload" / "data" / "vllm_bench_result.json"


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _json(*args) -> dict:
    res = _cli("calibrate", *args, "--format", "json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_two_stage_folder_exact_figures(tmp_path):
    folder = write_run(tmp_path)
    doc = _json(folder, *BLACKBOX)["runs"][0]
    assert (doc["kind"], doc["measured_at"], doc["seed"], doc["simulations"]) == ("inference-perf", "client", 42, 2)
    assert doc["coefficients_used"] == "alpha [0.0, 0.0, 0.0], beta [1000.0, 0.0, 0.0]"
    assert (doc["model"], doc["hardware"], doc["tp"]) == ("meta-llama/llama-3.1-8b-instruct", "H100", 1)
    s0, s1 = doc["stages"]
    # stage 0 drains when its last request (sent at exactly 2 s) completes 3 ms later; stage 1's
    # timer starts 2 s after (interval 1 s + 1 s queue fill); its last send is 2 s after that
    assert (s0["sim_start_us"], s0["sim_drained_us"]) == (0, 2_003_000)
    assert (s1["sim_start_us"], s1["sim_drained_us"]) == (4_003_000, 6_006_000)
    assert (s0["rate_rps"], s0["requests"], s1["requests"]) == (2.0, 4, 2)
    assert s0["real"] == s0["sim"] == {"successes": 4, "failures": 0}
    m = s0["metrics"]
    assert m["ttft"] == {"real_ms": {"mean": 2.0, "p50": 2.0, "p90": 2.0, "p99": 3.0},
                         "sim_ms": {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0},
                         "error_pct": {"mean": -50.0, "p50": -50.0, "p90": -50.0, "p99": pytest.approx(-200 / 3)}}
    assert m["e2e"]["sim_ms"] == {"mean": 3.0, "p50": 3.0, "p90": 3.0, "p99": 3.0}
    assert m["e2e"]["error_pct"] == {"mean": -25.0, "p50": -25.0, "p90": -40.0, "p99": -50.0}
    assert m["itl"]["sim_ms"] == m["tpot"]["sim_ms"] == {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}
    assert s1["metrics"]["itl"]["error_pct"]["mean"] == -50.0           # real 2 ms, sim 1 ms
    # the score: ITL = (E2E - TTFT) / (3 - 1)
    sc = s0["score"]
    assert sc["real_ms"] == {"e2e": 4.0, "ttft": 2.0, "itl": 1.0} and sc["sim_ms"] == {"e2e": 3.0, "ttft": 1.0, "itl": 1.0}
    assert sc["abs_error_pct"] == {"e2e": 25.0, "ttft": 50.0, "itl": 0.0} and sc["avg3_pct"] == 25.0
    assert s1["score"]["avg3_pct"] == 50.0
    t = doc["total"]
    assert t["real"] == t["sim"] == {"successes": 6, "failures": 0}
    assert t["metrics"]["e2e"]["real_ms"] == {"mean": 5.0, "p50": 5.0, "p90": 6.0, "p99": 6.0}
    assert t["metrics"]["itl"]["sim_ms"] == {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}   # 12 samples of 1 ms
    assert t["score"]["real_ms"] == {"e2e": 5.0, "ttft": 2.0, "itl": 1.5}
    assert t["score"]["abs_error_pct"] == pytest.approx({"e2e": 40.0, "ttft": 50.0, "itl": 100 / 3})
    assert t["score"]["avg3_pct"] == pytest.approx((40 + 50 + 100 / 3) / 3)


def test_table_output_names_the_coefficients_and_the_score(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")    # each score on one line (piped output is 120 wide)
    res = _cli("calibrate", write_run(tmp_path), *BLACKBOX)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "run-a: blackbox on H100 (TP 1, DP 1), 300 KV blocks, alpha [0.0, 0.0, 0.0], beta [1000.0, 0.0, 0.0]" in out
    assert "stage 0 (2 req/s)" in out and "whole run" in out and "ok 4/4, failed 0/0 (real/sim)" in out
    assert "stage 0: score (mean, real → sim, |error|): E2E 4.00 → 3.00 ms (25.0%), TTFT 2.00 → 1.00 ms " \
           "(50.0%), ITL 1.00 → 1.00 ms (0.0%); avg3 25.0%" in out
    assert "whole run: score" in out and "avg3 41.1%" in out
    assert "note: load.request_timeout is null" in out


def test_client_timeout_fails_requests_like_the_client(tmp_path):
    """A 1.5 ms timeout: each request is dropped by the engine 1.5 ms after its send, during
    its first decode step; a 2.5 ms one: the engine completes it at 3 ms, after the client gave
    up, so it fails too. Stages drain at the last deadline."""
    for timeout, deadline in (("0.0015", 1_500), ("0.0025", 2_500)):
        folder = write_run(tmp_path / timeout, timeout=timeout)
        doc = _json(folder, *BLACKBOX)["runs"][0]
        s0, s1 = doc["stages"]
        assert s0["sim"] == {"successes": 0, "failures": 4} and s1["sim"] == {"successes": 0, "failures": 2}
        assert s0["sim_drained_us"] == 2_000_000 + deadline
        assert s1["sim_start_us"] == 4_000_000 + deadline and s1["sim_drained_us"] == 6_000_000 + 2 * deadline
        assert doc["total"]["score"] is None and doc["total"]["metrics"]["e2e"]["sim_ms"] is None


def test_same_inputs_same_bytes_and_the_seed_moves_the_sends(tmp_path):
    folder = write_run(tmp_path)
    a = _cli("calibrate", folder, *BLACKBOX, "--format", "json").stdout
    assert a == _cli("calibrate", folder, *BLACKBOX, "--format", "json").stdout
    b = json.loads(_cli("calibrate", folder, *BLACKBOX, "--seed", "7", "--format", "json").stdout)["runs"][0]
    assert b["seed"] == 7 and b["stages"][0]["sim_drained_us"] == 2_003_000      # the last send is at 2 s
    (r42, _), = prepare_runs([str(folder)], {"--hardware": "H100"}, None)
    (r7, p7), = prepare_runs([str(folder)], {"--hardware": "H100", "--seed": "7"}, None)
    assert (r42.seed, r7.seed, p7.scenario.seed) == (42, 7, 7)
    assert [r.send_time_us for r in r7.records] != [r.send_time_us for r in r42.records]


def test_the_run_must_name_its_gpu(tmp_path):
    res = _cli("calibrate", write_run(tmp_path), "--latency-model", "blackbox")
    assert res.exit_code == 2
    assert res.stderr == "error: --hardware: the run run-a does not record its GPU: pass --hardware (or --scenario FILE.yaml)\n"
    res = _cli("calibrate", write_run(tmp_path, "run-b", exp=False), "--hardware", "H100")
    assert res.exit_code == 2 and "records no engine settings (no exp-config.yaml)" in res.stderr


def test_plots_are_skipped_for_aggregate_runs(tmp_path):
    res = _cli("calibrate", write_run(tmp_path), *BLACKBOX, "--plot", tmp_path / "plots", "--format", "json")
    assert res.exit_code == 0, res.output
    assert "no plots for run-a: the run has aggregate metrics only" in res.stderr


def test_vllm_bench_result_exact_figures_and_like_for_like_counts():
    """Requests 0, 1, 3 succeeded (4, 3 and 2 output tokens, sent 0.5 s and 1.5 s apart);
    request 2 failed and is not replayed. Real TTFT 125, 62.5, 250 ms; E2E TTFT + sum(ITLs)."""
    doc = _json(BENCH, "--model", "meta-llama/llama-3.1-8b-instruct", *BLACKBOX)["runs"][0]
    assert (doc["offered"], doc["completed_real"], doc["completed_sim"], doc["not_replayed"]) == (3, 3, 3, 1)
    m = doc["metrics"]
    assert m["ttft"]["sim_ms"] == {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}
    assert m["e2e"]["sim_ms"]["mean"] == 3.0 and m["e2e"]["sim_ms"]["p50"] == 3.0   # 4, 3, 2 ms
    assert m["e2e"]["real_ms"]["mean"] == pytest.approx((234.375 + 140.625 + 312.5) / 3)
    assert m["ttft"]["real_ms"]["p90"] == pytest.approx(125 + 0.8 * 125)       # rank 1.8 of [62.5, 125, 250]
    sc = doc["score"]
    real_e2e, real_ttft = (234.375 + 140.625 + 312.5) / 3, (125 + 62.5 + 250) / 3
    assert sc["real_ms"] == pytest.approx({"e2e": real_e2e, "ttft": real_ttft, "itl": (real_e2e - real_ttft) / 2})
    assert sc["sim_ms"] == {"e2e": 3.0, "ttft": 1.0, "itl": 1.0} and sc["output_len_real"] == 3.0
    assert sc["avg3_pct"] == pytest.approx(100 * ((1 - 3 / real_e2e) + (1 - 1 / real_ttft)
                                                  + (1 - 1 / ((real_e2e - real_ttft) / 2))) / 3)
    res = _cli("calibrate", BENCH, "--model", "meta-llama/llama-3.1-8b-instruct", *BLACKBOX)
    assert "completed: real 3/3, sim 3/3 (1 request(s) without a measured latency, e.g. failed, not replayed)" \
        in res.stdout


def test_calibrate_mixes_kinds_in_one_call(tmp_path):
    doc = _json(write_run(tmp_path), BENCH, "--model", "meta-llama/llama-3.1-8b-instruct", *BLACKBOX)
    assert [r.get("kind", "per-request") for r in doc["runs"]] == ["inference-perf", "per-request"]


def test_fit_objective_of_an_aggregate_run_by_hand(tmp_path):
    """Residuals 10·(sim/real − 1) per stage: TTFT mean and p90, E2E mean and p90, the score's
    ITL. Stage 0: TTFT 1/2, 1/2, E2E 3/4, 3/5, ITL 1/1; stage 1: 1/2, 1/2, 3/6, 3/6, 1/2."""
    given = {"--hardware": "H100", "--latency-model": "blackbox", "--alpha-coeffs": "0,0,0",
             "--beta-coeffs": "1000,0,0", "--total-kv-blocks": "300"}
    (run, plan), = prepare_runs([str(write_run(tmp_path))], given, None, "fit")
    case = AggregateCase(run, plan.scenario)
    obj = Objective(space_for(plan.scenario), [case])
    r = obj.residuals([1000.0, 0.0, 0.0])
    assert r.tolist() == pytest.approx([-5.0, -5.0, -2.5, -4.0, 0.0, -5.0, -5.0, -5.0, -5.0, -5.0])
    c = obj.comparison(case, [1000.0, 0.0, 0.0])
    assert c.total.score.avg3_pct == pytest.approx((40 + 50 + 100 / 3) / 3)
    assert calibrate_aggregate(plan.scenario, run).to_dict() == c.to_dict()


def test_fit_accepts_an_inference_perf_folder_beside_a_bench_result(tmp_path):
    out = tmp_path / "set.yaml"
    res = _cli("fit", write_run(tmp_path), BENCH, "-o", out, "--model", "meta-llama/llama-3.1-8b-instruct",
               *BLACKBOX, "--max-evaluations", "3", "--no-cross-validate")
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "backend: blackbox" in text and "run-a" in text and "avg3_pct" in text
    assert "avg3" in res.stdout


def test_an_aggregate_run_is_measured_at_the_client(tmp_path):
    (_, plan), = prepare_runs([str(write_run(tmp_path))], {"--hardware": "H100"}, None)
    s = plan.scenario
    assert s.metrics.measured_at == "server"                     # the scenario's own default
    got = client_measured(s, "client")
    assert got.metrics.measured_at == "client" and s.metrics.measured_at == "server"


def test_without_a_summary_the_whole_run_means_are_pooled_from_the_stages(tmp_path):
    """Stage E2E means 4 ms (4 successes) and 6 ms (2): the run's mean is 28/6 ms; its
    percentiles are unknown (null), and ITL (per chunk) is not pooled."""
    doc = _json(write_run(tmp_path, summary=False), *BLACKBOX)["runs"][0]
    t = doc["total"]
    assert t["real"] == {"successes": 6, "failures": 0}
    assert t["metrics"]["e2e"]["real_ms"] == {"mean": pytest.approx(28 / 6), "p50": None, "p90": None, "p99": None}
    assert t["metrics"]["e2e"]["error_pct"]["p50"] is None
    assert t["metrics"]["itl"]["real_ms"] is None and t["metrics"]["itl"]["sim_ms"]["mean"] == 1.0
    assert t["score"]["real_ms"] == pytest.approx({"e2e": 28 / 6, "ttft": 2.0, "itl": (28 / 6 - 2.0) / 2})
    assert any("no summary_lifecycle_metrics.json" in n for n in doc["notes"])


def test_calibrate_warns_when_the_set_was_fitted_on_the_run(tmp_path):
    """A set whose ``fit.runs`` names the run: in-sample, said on stderr and in the JSON."""
    folder = write_run(tmp_path)
    cs = tmp_path / "set.yaml"
    for runs, expected in ((["run-a", "other"], True), (["other"], False)):
        cs.write_text("backend: physics\nname: mine\nfit:\n  runs: " + json.dumps(runs) + "\n")
        res = CliRunner().invoke(app, ["calibrate", str(folder), "--hardware", "H100", "--latency-model",
                                       "physics", "--coefficients", str(cs), "--format", "json"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)["runs"][0]
        assert doc["in_sample"] is expected and doc["coefficients_used"] == "coefficient set 'mine'"
        assert ("in-sample: the coefficient set was fitted on this run (run-a)" in res.stderr) is expected
