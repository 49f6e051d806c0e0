"""Saturation detection (docs/metrics.md, "Saturation"): the backlog's slope over the arrival
window and completed/offered over its second half, on hand-checked loads on both sides of
a capacity computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy import run
from blis_simpy.config.scenario import Scenario
from blis_simpy.metrics.saturation import MAX_BINS, BacklogProbe, probe_metrics
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
