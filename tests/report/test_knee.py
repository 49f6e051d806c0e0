"""The knee detector on synthetic latency-vs-rate curves with a known knee."""

from __future__ import annotations

import math

import pytest

from blis_simpy.report.knee import knee

RATES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


def test_hockey_stick_knee_is_the_first_rate_past_twice_the_low_load_latency():
    # flat 100 ms up to rate 6, then it climbs: 150 at 7 (1.5x), 250 at 8 (2.5x)
    lat = [100, 100, 101, 102, 104, 110, 150, 250, 600, 2000]
    assert knee(RATES, lat) == (8.0, 250.0)
    assert knee(RATES, lat, factor=1.4) == (7.0, 150.0)
    assert knee(RATES, lat, factor=10) == (10.0, 2000.0)


def test_mm1_queue_knee():
    # M/M/1 with service rate 10: latency 1 / (mu - lambda); at rate 1 it is 1/9 s,
    # twice that (2/9) is reached at lambda = 5.5, so the first swept rate above is 6
    lat = [1 / (10 - r) for r in [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert knee([1, 2, 3, 4, 5, 6, 7, 8, 9], lat) == (6.0, pytest.approx(0.25))


def test_order_and_non_finite_points():
    rates = [8, 1, 4, 2, 6]
    lat = [900, 100, 150, 100, math.nan]
    assert knee(rates, lat) == (8.0, 900.0)          # sorted by rate; NaN ignored


@pytest.mark.parametrize(("rates", "lat"), [
    (RATES, [100] * 10),                 # flat: no knee within the sweep
    ([1], [100]),                        # one point
    ([1, 2, 3], [0, 5, 10]),             # no positive low-load latency
    ([], []),
])
def test_no_knee(rates, lat):
    assert knee(rates, lat) is None


def test_bad_factor():
    with pytest.raises(ValueError):
        knee(RATES, RATES, factor=1.0)
