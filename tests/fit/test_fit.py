"""fit: recovers known coefficients from a run the simulator itself produced; writes a set
that calibrate and run load; refuses what it cannot fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from tests.cli.support import SMALL_SCENARIO


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def measured(tmp_path: Path) -> tuple[Path, Path]:
    """A 'measured' run: SMALL_SCENARIO simulated with its true betas, exported as TraceV2,
    and a scenario that starts the fit from wrong betas."""
    sc = tmp_path / "true.yaml"
    sc.write_text(SMALL_SCENARIO)
    res = _cli("run", "--scenario", sc, "--num-requests", "150", "--rate", "40",
               "--trace-output", tmp_path / "m", "--format", "json")
    assert res.exit_code == 0, res.output
    (tmp_path / "m.yaml").rename(tmp_path / "m.header.yaml")      # converted files' naming
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(SMALL_SCENARIO.replace(
        "beta_coeffs: [6472.007648778123, 19.79721387814611, 304.4021040302657]",
        "beta_coeffs: [3000.0, 5.0, 100.0]"))
    return tmp_path / "m", wrong


def test_fit_closes_the_gap_to_the_run(measured, tmp_path):
    prefix, wrong = measured
    before = _cli("calibrate", prefix, "--scenario", wrong, "--format", "json")
    start = json.loads(before.stdout)["runs"][0]["metrics"]
    assert start["ttft"]["error_pct"]["mean"] < -40          # the wrong betas are far off
    out = tmp_path / "set.yaml"
    res = _cli("fit", prefix, "--scenario", wrong, "-o", out, "--time-budget", "120")
    assert res.exit_code == 0, res.output
    assert "time budget" not in res.stderr       # it converged: the set depends on the inputs only
    cs = yaml.safe_load(out.read_text())
    assert cs["backend"] == "blackbox" and cs["fit"]["stopped"] == "converged"
    # beta0 (per step) and beta2 x batch trade off at this load, so the betas are not
    # identified one by one; the fitted set must reproduce the run, and every beta must
    # move from the wrong start towards the truth (3000 -> 6472, 5 -> 19.8, 100 -> 304)
    got = cs["beta_coeffs"]
    assert got[0] > 3000 * 1.5 and got[1] > 5 * 1.5
    for m in ("ttft_mean_error_pct", "tpot_mean_error_pct", "e2e_mean_error_pct"):
        assert abs(cs["fit"]["in_sample"]["m"][m]) < 2.0, cs["fit"]
    assert cs["fit"]["in_sample"]["m"]["e2e_mape_pct"] < 5.0
    assert out.read_text().startswith("# written by: blis-simpy fit")
    # the set loads: calibrate with it reproduces the fit's in-sample error
    res = _cli("calibrate", prefix, "--scenario", wrong, "--coefficients", out, "--format", "json")
    assert res.exit_code == 0, res.output
    e2e = json.loads(res.stdout)["runs"][0]["metrics"]["e2e"]["error_pct"]["mean"]
    assert e2e == pytest.approx(cs["fit"]["in_sample"]["m"]["e2e_mean_error_pct"], abs=1e-3)


def test_leave_one_out_with_two_runs(measured, tmp_path):
    prefix, wrong = measured
    second = tmp_path / "m2"
    for suffix in (".header.yaml", ".csv"):
        Path(str(second) + suffix).write_bytes(Path(str(prefix) + suffix).read_bytes())
    out = tmp_path / "set.yaml"
    res = _cli("fit", prefix, second, "--scenario", wrong, "-o", out, "--max-evaluations", "30")
    assert res.exit_code == 0, res.output
    fit = yaml.safe_load(out.read_text())["fit"]
    assert set(fit["leave_one_out"]) == {"m", "m2"}
    assert "held out" in res.stdout


def test_fit_refuses_what_it_cannot_fit(measured, tmp_path):
    prefix, wrong = measured
    res = _cli("fit", prefix, "--scenario", wrong, "--latency-model", "crossmodel", "--hardware", "H100",
               "--tp", "1", "--beta-coeffs", "1,1,1,1", "--alpha-coeffs", "0,0,0", "-o", tmp_path / "x.yaml")
    assert res.exit_code == 2 and "fit supports physics, trained-physics, blackbox" in res.stderr, res.stderr
    res = _cli("fit", prefix, "--scenario", wrong, "-o", tmp_path / "nodir" / "x.yaml")
    assert res.exit_code == 2 and "--output" in res.stderr
    res = _cli("fit", prefix, "--scenario", wrong, "-o", tmp_path / "x.yaml", "--time-budget", "-1")
    assert res.exit_code == 2 and "--time-budget" in res.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_time_budget_keeps_the_best_point_seen(measured):
    """A deadline already past: the search evaluates the start (so there is a best point)
    and stops at the next evaluation; the fit reports 'budget' and returns the start."""
    import time

    from blis_simpy.cli.calibrate_cmd import prepare_invocation
    from blis_simpy.fit import Case, space_for
    from blis_simpy.fit.fit import _search
    from blis_simpy.measured.converted import load_measured
    prefix, wrong = measured
    run = load_measured(prefix)
    case = Case(run, prepare_invocation(run, {}, str(wrong)).scenario)
    space = space_for(case.scenario)
    obj, stopped, cost = _search(space, [case], time.monotonic() - 1.0, 100)
    assert stopped == "budget" and obj.evaluations == 1
    assert obj.best_x == space.x0() and cost == obj.history[0]


def test_a_fit_the_time_budget_ended_says_so(measured, tmp_path):
    """A budget too short to converge: the set is written (the best point seen), the table
    says 'budget', and a warning says the result depends on the machine's speed."""
    prefix, wrong = measured
    res = _cli("fit", prefix, "--scenario", wrong, "-o", tmp_path / "s.yaml", "--time-budget", "0.001")
    assert res.exit_code == 0, res.output
    assert "simulations, " in res.stdout and ", budget)" in res.stdout
    assert ("the time budget (--time-budget 0.001 s) ended a search before it converged"
            in res.stderr), res.stderr
    assert (tmp_path / "s.yaml").exists()


def test_blackbox_fit_of_a_model_with_no_catalog_row(realdata, tmp_path):
    """Llama-3.1-8B (base) has no blackbox row: fit starts from a generic point instead of
    refusing, and the set it writes replays the run with the fitted betas."""
    run = realdata.path("vllm-rtxpro6000-llama-3.1-8b")
    out = tmp_path / "bb.yaml"
    res = _cli("fit", run, "--latency-model", "blackbox", "-o", out, "--max-evaluations", "15")
    assert res.exit_code == 0, res.output
    cs = yaml.safe_load(out.read_text())
    assert cs["backend"] == "blackbox" and cs["gpu"] == "RTX-PRO-6000"
    assert cs["beta_coeffs"] != [5000.0, 0.5, 50.0] and cs["alpha_coeffs"] == [0.0, 0.0, 0.0]
    cal = _cli("calibrate", run, "--latency-model", "blackbox", "--coefficients", out, "--format", "json",
               "--no-timeline")
    assert cal.exit_code == 0, cal.output
    e2e = json.loads(cal.stdout)["runs"][0]["metrics"]["e2e"]["error_pct"]["mean"]
    assert e2e == pytest.approx(cs["fit"]["in_sample"]["vllm-rtxpro6000-llama-3.1-8b"]["e2e_mean_error_pct"],
                                abs=1e-3)


def test_max_evaluations_caps_every_simulation_of_a_search(measured, tmp_path):
    """scipy's own ``max_nfev`` leaves out the finite-difference Jacobian's evaluations (three
    more simulations here, one per beta); ``--max-evaluations`` counts every simulation."""
    prefix, wrong = measured
    out = tmp_path / "set.yaml"
    res = _cli("fit", prefix, "--scenario", wrong, "-o", out, "--max-evaluations", "2", "--no-cross-validate")
    assert res.exit_code == 0, res.output
    cs = yaml.safe_load(out.read_text())
    assert (cs["fit"]["evaluations"], cs["fit"]["stopped"]) == (2, "evaluations")
    assert "time budget" not in res.stderr
