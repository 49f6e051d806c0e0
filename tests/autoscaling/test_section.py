"""The "autoscaling" section from a hand-made record: intervals, attainment, GPU-hours, cost."""

from __future__ import annotations

from blis_simpy.cluster.autoscaler import AutoscaleRecord
from blis_simpy.metrics.autoscale import autoscale_report


def record() -> AutoscaleRecord:
    rec = AutoscaleRecord("queue-depth", 1_000_000, 250_000, 1, 3, 2)
    rec.changes = [(0, 1, 0, 0), (1_000_000, 1, 1, 0), (1_250_000, 2, 0, 0)]
    # instance 0 over [0, 2.5 s]; instance 1 from the decision at 1 s to the end
    rec.spans = [(0, 0, 0, 2_500_000), (1, 1_000_000, 1_250_000, 2_500_000)]
    rec.decisions = [(1_000_000, 2, 4), (2_000_000, 2, 9)]   # (t, chosen, arrived so far)
    rec.scale_ups = 1
    rec.end_us = 2_500_000
    return rec


def test_intervals_attainment_gpu_hours_and_cost_by_hand():
    # completed requests (arrival µs, met every target): 3 of the 4 in [0, 1 s), 4 of the 5
    # in [1 s, 2 s) of which 2 met, the 1 in [2 s, end] met
    done = [(0, True), (10, True), (999_999, False),
            (1_000_000, True), (1_500_000, False), (1_600_000, True), (1_999_999, False),
            (2_000_000, True)]
    a = autoscale_report(record(), 10, done, judged=True, gpu_hour_usd=3.0)
    assert a.intervals == [
        {"start_us": 0, "end_us": 1_000_000, "instances": 1, "arrived": 4, "completed": 3,
         "met": 2, "attainment_pct": 50.0},
        {"start_us": 1_000_000, "end_us": 2_000_000, "instances": 2, "arrived": 5, "completed": 4,
         "met": 2, "attainment_pct": 40.0},
        {"start_us": 2_000_000, "end_us": 2_500_000, "instances": 2, "arrived": 1, "completed": 1,
         "met": 1, "attainment_pct": 100.0}]
    # (2.5 s + 1.5 s) x 2 GPUs = 8 GPU-s = 8 / 3600 GPU-hours; at 3 USD: 1/150 USD
    assert a.gpu_hours == 8_000_000 / 3_600_000_000
    assert a.cost_usd == a.gpu_hours * 3.0
    assert a.peak_instances == 2
    assert a.mean_instances == 8_000_000 / (2_500_000 * 2)
    d = a.to_dict()
    assert list(d)[:6] == ["policy", "interval_us", "loading_delay_us", "min_instances",
                           "max_instances", "gpus_per_instance"]


def test_without_slo_or_per_request_data_attainment_is_null():
    a = autoscale_report(record(), 10, None, judged=True, gpu_hour_usd=None)
    assert [r["arrived"] for r in a.intervals] == [4, 5, 1]
    assert {r["completed"] for r in a.intervals} == {None}
    assert {r["attainment_pct"] for r in a.intervals} == {None}
    assert a.cost_usd is None
    b = autoscale_report(record(), 10, [(0, True)], judged=False, gpu_hour_usd=None)
    assert b.intervals[0]["completed"] == 1 and b.intervals[0]["attainment_pct"] is None
