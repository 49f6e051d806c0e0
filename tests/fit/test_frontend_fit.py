"""The front end's fixed latency fitted from light stages (blis_simpy.fit.frontend), on the
hand-made inference-perf folder of tests/workload/iperf_support.py.

The physics set below times every step at exactly 1000 µs (every multiplier and cost 0 but
``step_cpu_us``); the rebuilt sends are at least 0.1 s apart, so a request is alone in the
engine: TTFT 1 ms, E2E 3 ms (3 output tokens). The folder's real TTFT medians are 2 ms in both
stages, so the gap is 1 ms: 500 µs each way.
"""

from __future__ import annotations

import json

import pytest

from blis_simpy.calibrate.aggregate import calibrate_aggregate
from blis_simpy.cli.calibrate_cmd import prepare_runs
from blis_simpy.fit import case_for, space_for
from blis_simpy.fit.frontend import fit_frontend, light_stage, with_frontend
from blis_simpy.latency.coefficient_sets import PhysicsCoefficients
from blis_simpy.latency.frontend import FrontendParams
from tests.workload.iperf_support import STAGE1, lifecycle, write_run

ZERO = {k: 0.0 for k in ("prefill_compute", "decode_compute", "attention_compute", "weight_reads",
                         "prefill_memory", "decode_kv_reads", "moe_compute", "moe_expert_reads",
                         "tp_allreduce", "ep_dispatch_combine", "sampling", "elementwise")}
FLAT = PhysicsCoefficients(**ZERO, layer_launch_us=0.0, request_cpu_us=0.0, step_cpu_us=1000.0)
GIVEN = {"--hardware": "H100", "--latency-model": "physics"}


def _cases(*folders):
    out = [case_for(run, plan.scenario) for run, plan in prepare_runs([str(f) for f in folders], GIVEN, None, "fit")]
    return out, space_for(out[0].scenario)


def _set_ttft(folder, stage: int, ttft_s: float, median_s: float | None = None):
    """Rewrite the real mean and median TTFT of ``stage`` (seconds; the median = the mean
    unless given)."""
    p = folder / "results" / f"stage_{stage}_lifecycle_metrics.json"
    doc = json.loads(p.read_text())
    doc["successes"]["latency"]["time_to_first_token"]["mean"] = ttft_s
    doc["successes"]["latency"]["time_to_first_token"]["median"] = ttft_s if median_s is None else median_s
    p.write_text(json.dumps(doc))


def test_the_light_stage_is_the_slowest_rate_that_lost_nothing(tmp_path):
    (case,), _ = _cases(write_run(tmp_path))
    assert [st.rate_rps for st in case.run.stages] == [2.0, 1.0]
    assert light_stage(case.run) == 1
    # stage 1 lost a request: stage 0 is the light one
    (tmp_path / "b").mkdir()
    folder = write_run(tmp_path / "b")
    (folder / "results" / "stage_1_lifecycle_metrics.json").write_text(
        json.dumps(lifecycle(1, 1, **STAGE1, fail_max=300.0)))
    (case_b,), _ = _cases(folder)
    assert light_stage(case_b.run) == 0
    case_b.run.measured_at = "server"            # a server-side log has no front end to see
    assert light_stage(case_b.run) is None


def test_half_the_ttft_gap_each_way_and_the_stage_then_matches(tmp_path):
    (case,), space = _cases(write_run(tmp_path))
    fe = fit_frontend(space, [case], FLAT)
    (gap,) = fe.gaps
    assert (gap.stage, gap.rate_rps, gap.real_ttft_ms, gap.sim_ttft_ms) == (1, 1.0, 2.0, 1.0)
    assert fe.params == FrontendParams(network_us=500.0)
    assert fe.to_dict() == {"network_us": 500.0, "gaps_ms": {"run-a": 1.0}}
    # replayed with it: 500 µs in, 500 µs out -> TTFT 2 ms and E2E 4 ms in every stage
    dep = space.deployment(case.scenario, with_frontend(FLAT, fe))
    c = calibrate_aggregate(case.scenario, case.run, deployment=dep)
    for st in c.stages:
        assert st.row("ttft").sim["mean"] == pytest.approx(2.0)
        assert st.row("e2e").sim["mean"] == pytest.approx(4.0)
        assert st.score.sim["itl"] == pytest.approx(1.0)         # per-token gaps unchanged


def test_the_median_gap_over_runs_and_never_negative(tmp_path):
    folders = []
    for name, ttft_s in (("a", 0.002), ("b", 0.004), ("c", 0.011)):
        f = write_run(tmp_path, name)
        _set_ttft(f, 1, ttft_s)
        folders.append(f)
    cases, space = _cases(*folders)
    fe = fit_frontend(space, cases, FLAT)
    # gaps 1, 3 and 10 ms: the median 3 ms, 1500 µs each way (one run's outlier does not move it)
    assert [g.gap_ms for g in fe.gaps] == pytest.approx([1.0, 3.0, 10.0])
    assert fe.params.network_us == 1500.0
    # a real TTFT below the engine's alone gives no negative latency
    _set_ttft(folders[0], 1, 0.0005)
    (low,), space = _cases(folders[0])
    assert fit_frontend(space, [low], FLAT).params.network_us == 0.0


def test_the_gap_is_taken_at_the_median_not_the_mean(tmp_path):
    """A tail of slow first tokens moves the mean (here to 9 ms) but not the median (2 ms):
    the fixed latency is the median's gap."""
    folder = write_run(tmp_path)
    _set_ttft(folder, 1, 0.009, median_s=0.002)
    (case,), space = _cases(folder)
    fe = fit_frontend(space, [case], FLAT)
    assert (fe.gaps[0].real_ttft_ms, fe.gaps[0].sim_ttft_ms) == (2.0, 1.0)
    assert fe.params.network_us == 500.0


def test_no_client_measured_run_no_front_end(tmp_path):
    (case,), space = _cases(write_run(tmp_path))
    case.run.measured_at = "server"
    assert fit_frontend(space, [case], FLAT) is None
    assert with_frontend(FLAT, None) is FLAT


def test_fit_carries_the_front_end_and_refits_it_per_held_out_run(tmp_path, monkeypatch):
    """``fit`` on physics fits the front end at its start point and writes it into the set; each
    held-out fit refits it on the other runs only (recorded calls below)."""
    import importlib

    fit_mod = importlib.import_module("blis_simpy.fit.fit")     # the module (the package exports fit())

    folders = [write_run(tmp_path, n) for n in ("a", "b")]
    _set_ttft(folders[1], 1, 0.004)
    cases, space = _cases(*folders)
    seen = []
    real = fit_mod.fit_frontend

    def spy(sp, cs, start_set):
        seen.append(sorted(c.run.name for c in cs))
        return real(sp, cs, start_set)

    monkeypatch.setattr(fit_mod, "fit_frontend", spy)
    res = fit_mod.fit(space, cases, max_evaluations=1, time_budget_s=600, prefit=False)
    assert seen == [["a", "b"], ["b"], ["a"]]                   # all runs, then without each
    assert res.frontend is not None and len(res.frontend.gaps) == 2
    assert res.coefficient_set.frontend == res.frontend.params
    assert res.frontend.params.network_us > 0
    assert len(res.held_out) == 2
