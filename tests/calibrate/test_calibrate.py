"""calibrate: hand-checked sim-vs-real figures on a tiny trace, and both real vLLM runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from tests.cli.support import TRACE_COLUMNS
from tests.conftest import REALDATA_FACTS

HEADER = "trace_version: 2\ntime_unit: microseconds\nmode: real\nwarm_up_requests: 0\n"
# constant 1000 µs steps: no API overheads, no per-token costs
SCENARIO = """\
seed: 1
model: meta-llama/llama-3.1-8b-instruct
latency: {model: blackbox, alpha_coeffs: [0, 0, 0], beta_coeffs: [1000, 0, 0]}
engine: {total_kv_blocks: 100}
"""


def _row(rid: int, arrival: int, n_in: int, n_out: int, first: int, last: int) -> str:
    return (f"{rid},c,,,,0,,0,true,{n_in},{n_out},0,0,0,0,0,,0,{n_in},{arrival},{arrival},"
            f"{first},{last},{n_out},ok,,stop")


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    prefix = tmp_path / "tiny"
    (tmp_path / "tiny.header.yaml").write_text(HEADER)
    rows = [_row(0, 0, 16, 3, 2_000, 4_000),                     # real TTFT 2 ms, E2E 4 ms, TPOT 1 ms
            _row(7, 10_000_000, 16, 2, 10_001_000, 10_003_000)]   # real TTFT 1 ms, E2E 3 ms, TPOT 2 ms
    (tmp_path / "tiny.csv").write_text(TRACE_COLUMNS + "\n" + "".join(r + "\n" for r in rows))
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    return prefix, sc


def test_tiny_trace_exact_errors(tiny):
    prefix, sc = tiny
    res = _cli("calibrate", prefix, "--scenario", sc, "--format", "json")
    assert res.exit_code == 0, res.output
    run = json.loads(res.stdout)["runs"][0]
    m = run["metrics"]
    # sim: request 0 = prefill step [0, 1000) then 2 decode steps -> TTFT 1, E2E 3, TPOT 1 ms;
    #      request 7 = prefill step then 1 decode step -> TTFT 1, E2E 2, TPOT 1 ms
    assert m["ttft"]["sim_ms"]["mean"] == pytest.approx(1.0)
    assert m["e2e"]["sim_ms"]["mean"] == pytest.approx(2.5)
    assert m["tpot"]["sim_ms"]["mean"] == pytest.approx(1.0)
    assert m["ttft"]["real_ms"]["mean"] == pytest.approx(1.5)
    assert m["ttft"]["error_pct"]["mean"] == pytest.approx(-100 / 3)
    assert m["e2e"]["error_pct"]["mean"] == pytest.approx(100 * (2.5 - 3.5) / 3.5)
    assert m["tpot"]["error_pct"]["mean"] == pytest.approx(-100 / 3)
    assert m["e2e"]["mape_pct"] == pytest.approx(100 * (1 / 4 + 1 / 3) / 2)
    assert m["ttft"]["error_pct"]["p50"] == pytest.approx(100 * (1.0 - 1.5) / 1.5)
    assert run["completed_sim"] == run["offered"] == 2


def test_tiny_trace_table_plots_and_report(tiny, tmp_path):
    prefix, sc = tiny
    plots, report = tmp_path / "plots", tmp_path / "r.json"
    res = _cli("calibrate", prefix, "--scenario", sc, "--plot", plots, "--report", report)
    assert res.exit_code == 0, res.output
    assert "TTFT" in res.stdout and "-33.3%" in res.stdout
    for name in ("tiny-cdf.png", "tiny-scatter.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (plots / "tiny-timeline.png").exists()      # the trace has no timeseries
    assert json.loads(report.read_text())["runs"][0]["metrics"]["e2e"]["n"] == 2


def test_flags_override_the_scenario(tiny):
    prefix, sc = tiny
    res = _cli("calibrate", prefix, "--scenario", sc, "--beta-coeffs", "2000,0,0", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["runs"][0]["metrics"]["ttft"]["sim_ms"]["mean"] == pytest.approx(2.0)


def test_bad_inputs_are_one_line_errors(tiny, tmp_path):
    prefix, sc = tiny
    res = _cli("calibrate", tmp_path / "nope")
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    res = _cli("calibrate", prefix)       # a converted trace with no scenario beside it
    assert res.exit_code == 2 and "--scenario" in res.stderr


@pytest.mark.parametrize("run", ["vllm-rtx4090-llama-3.1-8b", "vllm-rtxpro6000-llama-3.1-8b"])
def test_real_vllm_runs_replay_to_completion_with_timelines(run, realdata, tmp_path):
    """The full runs (300 requests): the shipped fitted set of the GPU is within 5 % of the real
    means. The excerpt (the first 48 requests and the ticks before the 49th arrives) replays
    them alone, without the 252 that shared the real batches with them: the simulated decode
    is faster (TPOT, E2E below the real means), but by under 40 %."""
    folder = realdata.path(run)
    res = _cli("calibrate", folder, "--format", "json", "--plot", tmp_path)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)["runs"][0]
    n = REALDATA_FACTS[realdata.kind].requests
    assert doc["completed_sim"] == doc["completed_real"] == n      # never cut by a horizon
    ticks = (folder / "timeseries.csv").read_text().count("\n") - 1
    assert len(doc["timeline"]) == ticks and doc["latency_model"] == "physics"
    assert (tmp_path / f"{run}-timeline.png").stat().st_size > 10_000
    err = {m: doc["metrics"][m]["error_pct"]["mean"] for m in ("ttft", "tpot", "e2e")}
    te = doc["timeline_errors"]
    assert te["running_mean_abs_diff"] < 3 and te["waiting_mean_abs_diff"] < 5
    if realdata.full:
        assert ticks > 60 and all(abs(e) < 5.0 for e in err.values()), err
        assert doc["metrics"]["e2e"]["mape_pct"] < 10.0
    else:
        assert ticks == 4 and all(-40.0 < err[m] < 0 for m in ("tpot", "e2e")), err
    if run.startswith("vllm-rtxpro6000"):      # its KV gauge reads 0 throughout: not recorded
        assert te["kv_pct_mean_abs_diff"] is None
        assert all(r["real_kv_pct"] is None for r in doc["timeline"])
    else:
        assert te["kv_pct_mean_abs_diff"] < (5 if realdata.full else 7)
