"""Saturation detection (docs/metrics.md, "Saturation"): the backlog's slope over the arrival
window and completed/offered over its second half, on hand-checked loads on both sides of
a capacity computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy import run
from blis_simpy.config.scenario import Scenario
from blis_simpy.metrics.report import report_dict
from blis_simpy.metrics.saturation import (
    MAX_BINS,
    MAX_WINDOWS,
    BacklogProbe,
    probe_metrics,
    saturation_windows,
)
from blis_simpy.metrics.summary import aggregate
from blis_simpy.run import simulate
from tests.cluster.helpers import request

# One instance, one request at a time (max_num_running_reqs 1), every step 10 ms (beta0; no
# queueing delay, alpha 0), 16-token prompts and 10 output tokens: a request takes its
# prefill step (the first token) and 9 decode steps, 10 x 10 ms = 100 ms, so the instance
# completes exactly 10 requests/s. Distribution arrivals are evenly spaced.
CAPACITY_RPS = 10.0


def scenario(rate: float, n: int = 300) -> dict:
    return {"seed": 1, "model": "m",
            "latency": {"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [10000, 0, 0]},
            "engine": {"total_kv_blocks": 1000, "max_num_running_reqs": 1, "block_size": 16},
            "workload": {"kind": "distribution", "rate": rate, "num_requests": n,
                         "prompt_tokens": {"mean": 16, "stdev": 16, "min": 16, "max": 16},
                         "output_tokens": {"mean": 10, "stdev": 10, "min": 10, "max": 10}}}


def test_the_hand_computed_capacity():
    out = run.execute(run.prepare(scenario(0.5, n=20)))
    assert set(out.report.cluster.e2e.values()) == {100_000}     # 10 steps x 10 ms, alone


def test_below_capacity_does_not_fire():
    v = run.execute(run.prepare(scenario(0.7 * CAPACITY_RPS))).report.saturation
    assert not v.saturated and v.undetermined == ""
    assert v.backlog_first == v.backlog_last == 0 and v.backlog_slope_rps == 0.0
    assert v.achieved_rps == pytest.approx(v.offered_rps)


def test_above_capacity_fires_with_the_hand_computed_rates():
    out = run.execute(run.prepare(scenario(1.5 * CAPACITY_RPS)))
    v = out.report.saturation
    assert v.saturated
    # arrivals 15/s, departures from the queue 10/s: the backlog grows 5/s
    assert v.backlog_slope_rps == pytest.approx(15.0 - CAPACITY_RPS, abs=0.02)
    assert v.offered_rps == pytest.approx(15.0, abs=0.05)
    assert v.achieved_rps == pytest.approx(CAPACITY_RPS, abs=0.05)
    assert v.t_stat > 100
    assert v.backlog_last == 99      # 300 arrivals in 20 s, 200 scheduled (one per 100 ms) + 1 running


def _burst_then_light():
    """A burst at 3x capacity for 1 s (30 requests), then 1 request/s for 60 s: the burst
    drains within 3 s, long before the arrivals end."""
    reqs = [request(i, arrival=i * 33_333, n_in=16, n_out=10, seed=i) for i in range(30)]
    reqs += [request(30 + k, arrival=1_000_000 + k * 1_000_000, n_in=16, n_out=10, seed=30 + k)
             for k in range(60)]
    return reqs


def _small_scenario() -> Scenario:
    d = scenario(1.0)
    del d["workload"]
    return Scenario.model_validate(d)


def test_a_burst_that_drains_within_the_run_does_not_fire():
    _, res = simulate(_small_scenario(), _burst_then_light())
    v = probe_metrics(aggregate(res.instances)).verdict()
    assert not v.saturated
    assert v.backlog_slope_rps < 0                    # high early, empty after the drain
    assert v.achieved_rps == pytest.approx(v.offered_rps)


def test_a_burst_in_the_last_second_needs_both_conditions():
    """Arrivals 1/s for 60 s, then 30 in the last second (3x capacity): at the last arrival
    19 still wait and completions fall short over the second half (about 2/3 of the
    arrivals), but one late burst does not make the backlog's trend over the window
    significant (t < 3): not saturated."""
    reqs = [request(k, arrival=k * 1_000_000, n_in=16, n_out=10, seed=k) for k in range(60)]
    reqs += [request(60 + i, arrival=60_000_000 + i * 33_333, n_in=16, n_out=10, seed=60 + i)
             for i in range(30)]
    _, res = simulate(_small_scenario(), reqs)
    v = probe_metrics(aggregate(res.instances)).verdict()
    assert v.backlog_last == 19 and v.achieved_over_offered < 0.9
    assert 0 < v.t_stat < 3 and not v.saturated


# ------------------------------------------------------------------------ the probe itself
def test_probe_linear_backlog_is_fitted_exactly():
    """Arrivals every 100 ms, each leaves the backlog 1 s after the one before (from t=0):
    departures 1/s against arrivals 10/s."""
    p = BacklogProbe()
    for k in range(100):
        p.add(k * 100_000, k * 1_000_000, k * 1_000_000 + 1)
    v = p.verdict()
    assert v.saturated
    assert v.window_start_us == 0 and v.window_end_us == 9_900_000
    assert v.backlog_slope_rps == pytest.approx(9.0, abs=0.1)
    assert v.achieved_rps / v.offered_rps == pytest.approx(0.1, abs=0.02)


def test_probe_without_waiting_does_not_fire_and_too_few_samples_has_no_verdict():
    p = BacklogProbe()
    for k in range(100):
        p.add(k * 100_000, k * 100_000, k * 100_000 + 50_000)
    v = p.verdict()
    assert not v.saturated and v.backlog_slope_rps == 0.0 and v.backlog_slope_stderr_rps == 0.0
    one = BacklogProbe()
    one.add(5, None, None)
    assert one.verdict().undetermined == "fewer than two requests"
    two = BacklogProbe()
    two.add(0, None, None)
    two.add(3, None, None)
    assert "samples" in two.verdict().undetermined


def test_probe_widens_its_bins_keeping_every_count():
    p = BacklogProbe()
    p.add(0, 1, 2)
    p.add(MAX_BINS * 5, None, MAX_BINS * 7)          # forces 2**3 µs bins
    assert p.shift == 3
    assert p.arrivals.sum() == 2 and p.leaves.sum() == 1 and p.completions.sum() == 2
    assert p.arrivals[0] == 1 and p.arrivals[(MAX_BINS * 5) >> 3] == 1
    q = BacklogProbe()
    q.add_many(np.array([0, MAX_BINS * 5]), np.array([1, -1]), np.array([2, MAX_BINS * 7]))
    assert q.shift == 3 and (q.arrivals == p.arrivals).all() and (q.leaves == p.leaves).all()
    assert (q.completions == p.completions).all()


def test_streaming_metrics_give_the_same_verdict():
    exact = run.execute(run.prepare(scenario(15))).report.saturation
    d = scenario(15)
    d["metrics"] = {"streaming": True}
    streamed = run.execute(run.prepare(d)).report.saturation
    assert streamed == exact


def test_pd_pools_count_the_decode_queue_and_the_parents_completions():
    """1 prefill + 1 decode instance, one request at a time each: a parent's prefill takes one
    10 ms step, its decode 9 (90 ms), so the decode instance completes 1/0.09 = 11.1 req/s.
    At 30 req/s the backlog (here in the decode queue) grows 30 - 11.1 = 18.9 req/s."""
    d = scenario(30, n=600)
    d["cluster"] = {"num_instances": 2}
    d["disaggregation"] = {"prefill_instances": 1, "decode_instances": 1,
                           "decider": {"policy": "always"}}
    v = run.execute(run.prepare(d)).report.saturation
    assert v.saturated
    assert v.achieved_rps == pytest.approx(1 / 0.09, abs=0.05)
    assert v.backlog_slope_rps == pytest.approx(1e6 / 33_333 - 1 / 0.09, abs=0.05)   # arrivals 33,333 µs apart


def test_a_run_stopped_when_saturated_ends_at_a_check():
    from blis_simpy.run.describe import Outputs
    out = run.execute(run.prepare(scenario(1.5 * CAPACITY_RPS),
                                  outputs=Outputs(stop_when_saturated=True)))
    last_us = 300 * (1_000_000 // 15)                      # the 300th arrival, 66,666 µs apart
    assert out.stopped_saturated_us == last_us // 4        # saturated at the first check
    assert out.report.saturation.saturated
    under = run.execute(run.prepare(scenario(0.7 * CAPACITY_RPS),
                                    outputs=Outputs(stop_when_saturated=True)))
    assert under.stopped_saturated_us is None and under.report.cluster.completed_requests == 300


# ------------------------------------------------------------ per window of a time-varying load
def staged(*stages: tuple[float, float]) -> dict:
    """The hand-computed deployment under ``(rate, duration_s)`` stages (evenly spaced
    arrivals within each: a stage of rate r from s has them at s + k * int(1e6 / r) µs)."""
    d = scenario(1.0)
    del d["workload"]["num_requests"]
    d["workload"]["stages"] = [{"rate": r, "duration_s": t} for r, t in stages]
    return d


def test_a_peak_stage_fires_its_window_where_the_whole_window_does_not():
    """7 req/s for 20 s, 15 req/s for 20 s, 5 req/s for 40 s: the queue grows 15 - 10 = 5/s
    over the peak (to 100 waiting at 40 s) and drains at 10 - 5 = 5/s by 60 s. Over the whole
    window the backlog is a triangle centred on it (no trend) and the second half completes
    more than arrives: only the peak's window fires."""
    out = run.execute(run.prepare(staged((7, 20), (15, 20), (5, 40))))
    assert len(out.requests) == 140 + 300 + 200
    v = out.report.saturation
    assert v.saturated and not v.whole_window_saturated
    assert abs(v.backlog_slope_rps) < 0.1 and v.achieved_over_offered > 1       # the whole window
    assert (v.windows_tested, v.windows_fired, len(v.fired_windows)) == (3, 1, 1)
    w = v.fired
    assert w is v.fired_windows[0]
    assert (w.window_start_us, w.window_end_us) == (20_000_000, 40_000_000)
    # bins of 2**13 µs; the first edge in the window 20,004,864 µs (all 140 earlier arrivals
    # scheduled), the last 39,993,344 µs: 299 arrived in the stage, 199 scheduled (the first
    # at 20,099,980 µs when the 7 req/s stage's last request ends, then one per 100 ms)
    assert (w.backlog_first, w.backlog_last) == (0, 100 - 0)
    assert w.backlog_slope_rps == pytest.approx(15.0 - CAPACITY_RPS, abs=0.02)
    assert w.offered_rps == pytest.approx(15.0, abs=0.1)
    assert w.achieved_rps == pytest.approx(CAPACITY_RPS, abs=0.05)
    doc = report_dict(out.report)["saturation"]
    assert doc["saturated"] is True and doc["whole_window_saturated"] is False
    assert (doc["windows_tested"], doc["windows_fired"]) == (3, 1)
    assert [(x["window_start_s"], x["window_end_s"]) for x in doc["windows"]] == [(20.0, 40.0)]
    assert v.warning().startswith("saturated between 20.0 s and 40.0 s of the arrivals: ")
    assert "(1 of 3 windows of the arrival rate fired; not the whole arrival window)" in v.warning()
    assert v.summary().startswith("backlog +5.01 ")


def test_a_schedule_below_capacity_everywhere_does_not_fire(caplog):
    out = run.execute(run.prepare(staged((7, 20), (9, 20), (5, 40))))
    v = out.report.saturation
    assert not v.saturated and (v.windows_tested, v.windows_fired) == (3, 0)
    assert "saturation" not in report_dict(out.report)
    assert "saturated" not in caplog.text


def test_concurrency_stages_keep_the_whole_window_test():
    d = scenario(1.0, n=200)
    d["workload"]["concurrency_stages"] = [{"concurrency": 1, "duration_s": 10},
                                           {"concurrency": 3, "duration_s": 10}]
    v = run.execute(run.prepare(d)).report.saturation
    assert v.windows_tested == 0


def test_a_run_stopped_when_saturated_stops_at_the_peak_window():
    """5 req/s for 40 s, 15 req/s for 20 s, 5 req/s for 100 s: the last arrival at 60 s + 500
    gaps of 199,999 µs (the sampler truncates 1 / 5e-6 µs = 199,999.99…) = 159,999,500 µs,
    checks at a quarter, half, ... of it. At the second (79,999,750 µs) the whole window so far
    has completed as many as arrived in its second half (the peak's queue drained by 80 s),
    but the peak's window fired; without the per-window test the run goes to its end."""
    from blis_simpy.run.describe import Outputs
    out = run.execute(run.prepare(staged((5, 40), (15, 20), (5, 100)),
                                  outputs=Outputs(stop_when_saturated=True)))
    assert out.stopped_saturated_us == 159_999_500 // 2
    v = out.report.saturation
    assert v.saturated and not v.whole_window_saturated
    assert (v.fired.window_start_us, v.fired.window_end_us) == (40_000_000, 60_000_000)


def test_streaming_metrics_give_the_same_window_verdict():
    exact = run.execute(run.prepare(staged((7, 20), (15, 20), (5, 40)))).report.saturation
    d = staged((7, 20), (15, 20), (5, 40))
    d["metrics"] = {"streaming": True}
    assert run.execute(run.prepare(d)).report.saturation == exact


def _peak_probe(n: int, with_first: bool = True) -> BacklogProbe:
    """1 arrival/s over [0, 9 s] (each leaves at once), then ``n`` evenly over (10, 20] s
    leaving the backlog at half that rate: in that window the queue grows n/20 per s and
    half the arrivals complete."""
    p = BacklogProbe()
    if with_first:
        for k in range(10):
            p.add(k * 1_000_000, k * 1_000_000, k * 1_000_000 + 1)
    gap = 10_000_000 // n
    for i in range(n):
        left = 10_000_000 + (2 * i + 1) * gap
        p.add(10_000_000 + (i + 1) * gap, left, left + 1)
    return p


def test_a_window_fires_only_when_its_rise_passes_the_counting_noise():
    """The same shape with 100 arrivals (rise 49 against 3 sqrt(99 + 50) = 36.6) fires; with
    10 (rise 4 against 3 sqrt(9 + 5) = 11.2) it does not, although its slope and throughput
    would fire the whole-window test."""
    big = _peak_probe(100).verdict([10_000_000])
    assert big.windows_fired == 1
    w = big.fired_windows[0]
    assert (w.window_start_us, w.window_end_us) == (10_000_000, 20_000_000)
    assert w.backlog_last - w.backlog_first == 49
    assert big.fired is big                # the whole window fired too: the verdict rests on it
    small = _peak_probe(10).verdict([10_000_000])
    assert small.windows_tested == 2 and small.windows_fired == 0
    assert _peak_probe(10, with_first=False).verdict().saturated    # alone, the two conditions


def test_windows_merge_short_pieces_and_stay_bounded():
    # bins of 10 µs: a window needs 8 edges (70 µs from an edge); the piece 0-30 joins 30-100,
    # and the last one (995-1000) joins the window before
    assert saturation_windows([0, 30, 100, 500, 995, 2**63 - 1], 0, 1000, 10) == [
        (0, 100), (100, 500), (500, 1000)]
    assert saturation_windows([], 0, 1000, 10) == [(0, 1000)]
    # a million pieces of 1 µs: at most MAX_WINDOWS windows, each >= 1/MAX_WINDOWS of the span
    w = saturation_windows(np.arange(1_000_001), 0, 1_000_000, 1)
    assert len(w) == MAX_WINDOWS
    assert w[0][0] == 0 and w[-1][1] == 1_000_000
    assert all(a[1] == b[0] for a, b in zip(w, w[1:], strict=False))
    assert all(e - s >= 1_000 for s, e in w)


def test_the_rate_changes_reach_the_test_from_a_stream_or_a_list():
    from blis_simpy.run.load_shape import arrival_rate_changes
    from blis_simpy.run.workload import build_workload
    d = run.prepare(staged((7, 20), (15, 20), (5, 40)))
    reqs = build_workload(d, lazy=True)[0]
    assert list(arrival_rate_changes(d, reqs)) == [0, 20_000_000, 40_000_000, 80_000_000]
    assert list(arrival_rate_changes(d, list(reqs))) == [0, 20_000_000, 40_000_000, 80_000_000]
    assert arrival_rate_changes(run.prepare(scenario(15)), []) is None


def test_a_rate_csv_is_read_once_when_the_requests_are_a_list(tmp_path, monkeypatch):
    """Built as a list (not lazy: ``--trace-output``, a replayed export), the requests still
    carry the rate changes: the CSV — maybe a pipe, which cannot be read twice — is read once."""
    from blis_simpy.run.load_shape import arrival_rate_changes
    from blis_simpy.run.workload import build_workload
    from blis_simpy.workload import rate_schedule as R
    csv_path = tmp_path / "rate.csv"
    csv_path.write_text("time_s,rate\n0,5\n10,40\n20,5\n")
    data = scenario(15)
    data["workload"] = {**data["workload"], "rate_csv": str(csv_path)}
    data["workload"].pop("rate")
    d = run.prepare(data)
    reads = []
    real = R.read_rate_csv
    monkeypatch.setattr(R, "read_rate_csv", lambda *a, **k: reads.append(a) or real(*a, **k))
    reqs = build_workload(d, lazy=False)[0]
    assert isinstance(reqs, list) and len(reqs) == 300
    assert list(arrival_rate_changes(d, reqs))[:3] == [0, 10_000_000, 20_000_000]
    assert len(reads) == 1
