"""Time-varying open load (docs/workloads.md, "Time-varying open load"): pieces from stages,
schedules and CSV files, exact constant arrivals across a boundary, Poisson counts per piece,
the rate CSV's located errors, and whole runs."""

from __future__ import annotations

import copy
import math

import pytest

from blis_simpy import run
from blis_simpy.errors import ConfigError
from blis_simpy.rng import numpy_rng
from blis_simpy.units import MAX_INT64
from blis_simpy.workload import rate_schedule as R
from blis_simpy.workload.rate_schedule import RatePiece


class _Stage:
    def __init__(self, rate, duration_s):
        self.rate, self.duration_s = rate, duration_s


def test_stage_and_schedule_pieces():
    assert R.stage_pieces([_Stage(2, 1), _Stage(4, 0.5)]) == [
        RatePiece(0, 1_000_000, 2.0), RatePiece(1_000_000, 1_500_000, 4.0)]
    assert R.schedule_pieces([(0.5, 3), (2, 0)]) == [
        RatePiece(500_000, 2_000_000, 3.0), RatePiece(2_000_000, MAX_INT64, 0.0)]


def test_rate_changes_are_every_boundary_once():
    """Where the rate changes (the saturation test's windows, docs/metrics.md): each start and
    end once, the open end included; nothing for no pieces."""
    assert R.rate_changes(R.schedule_pieces([(0.5, 3), (2, 0), (5, 1)])).tolist() == [
        500_000, 2_000_000, 5_000_000, MAX_INT64]
    assert R.rate_changes(R.stage_pieces([_Stage(2, 1), _Stage(4, 0.5)])).tolist() == [
        0, 1_000_000, 1_500_000]
    assert R.rate_changes([]).tolist() == []


def test_constant_arrivals_restart_at_each_boundary():
    """Rate 2 for 1 s, then 4 for 1 s: gaps of 500,000 µs up to the boundary (an arrival exactly
    at the end belongs to the piece), then 250,000 µs from the boundary."""
    pieces = R.stage_pieces([_Stage(2, 1), _Stage(4, 1)])
    assert list(R.arrival_times(pieces, "constant", None, numpy_rng(1))) == [
        500_000, 1_000_000, 1_250_000, 1_500_000, 1_750_000, 2_000_000]


def test_constant_arrivals_across_an_uneven_boundary():
    """3 req/s from 0 (gap int(1e6/3) = 333,333 µs), 2 req/s from 1 s: the gap that would
    cross 1 s is discarded; the next piece's first arrival is one of its gaps after 1 s. The
    horizon (2.2 s) ends the open last piece; the rate-0 point before it sends nothing."""
    pieces = R.schedule_pieces([(0, 3), (1, 2), (2.1, 0)])
    assert list(R.arrival_times(pieces, "constant", None, numpy_rng(1), horizon_us=2_200_000)) == [
        333_333, 666_666, 999_999, 1_500_000, 2_000_000]


def test_the_cap_and_the_horizon_stop_the_arrivals():
    """10 req/s: the constant gap is BLIS's int(1/λ) with λ = 10/1e6 per µs, and 1/1e-5 is
    99,999.99999... in binary floating point: 99,999 µs."""
    pieces = R.schedule_pieces([(0, 10)])
    assert list(R.arrival_times(pieces, "constant", None, numpy_rng(1), max_requests=3)) == [
        99_999, 199_998, 299_997]
    assert list(R.arrival_times(pieces, "constant", None, numpy_rng(1), horizon_us=250_000)) == [
        99_999, 199_998]


def test_poisson_counts_per_piece_match_the_rates():
    """Poisson arrivals restart at each boundary: each piece's count is Poisson(rate ×
    length), variance = mean, so with a fixed seed each count lies within 4 standard
    deviations (4·sqrt(mean)) of its mean; a rate-0 piece has none. (A wrong rate per piece —
    e.g. the previous piece's — would be off by hundreds of standard deviations.)"""
    rates = [(50.0, 100.0), (200.0, 100.0), (0.0, 50.0), (10.0, 200.0), (1000.0, 5.0)]
    pieces, t = [], 0
    for rate, dur in rates:
        pieces.append(RatePiece(t, t + int(dur * 1e6), rate))
        t += int(dur * 1e6)
    times = list(R.arrival_times(pieces, "poisson", None, numpy_rng(20261206)))
    assert times == sorted(times)
    for p, (rate, dur) in zip(pieces, rates, strict=True):
        n = sum(1 for x in times if p.start_us < x <= p.end_us)
        mean = rate * dur
        assert abs(n - mean) <= 4 * math.sqrt(mean), (rate, n, mean)


def test_expected_arrivals():
    assert R.expected_arrivals(R.stage_pieces([_Stage(2, 1), _Stage(4, 0.5)]), MAX_INT64) == 4.0
    assert R.expected_arrivals(R.schedule_pieces([(0, 2)]), MAX_INT64) == math.inf
    assert R.expected_arrivals(R.schedule_pieces([(0, 2)]), 3_000_000) == 6.0
    assert R.expected_arrivals(R.schedule_pieces([(0, 2), (1, 0)]), MAX_INT64) == 2.0


def test_rate_csv(tmp_path):
    p = tmp_path / "day.csv"
    p.write_text("hour,time_s,rate\nmidnight,0,1.5\n\n1am,3600,0\n")
    assert R.read_rate_csv(str(p)) == [(0.0, 1.5), (3600.0, 0.0)]


@pytest.mark.parametrize("text, line, field, problem", [
    ("t,rate\n0,1\n", 1, None, "the header must name the columns time_s and rate"),
    ("time_s,rate\n", 1, None, "no rows after the header"),
    ("time_s,rate\n0,1\n5,x\n", 3, "rate", "not a number: 'x'"),
    ("time_s,rate\n0,1\n5\n", 3, "rate", "not a number: ''"),
    ("time_s,rate\n0,1\n5,2\n5,3\n", 4, "time_s", "5 is not after the previous row's 5"),
    ("time_s,rate\n-1,1\n", 2, "time_s", "must be in [0, 1e+08], got -1"),
    ("time_s,rate\n0,1e10\n", 2, "rate", "must be in [0, 1e+09], got 1e10"),
    ("time_s,rate\n0,nan\n", 2, "rate", "must be in [0, 1e+09], got nan"),
])
def test_bad_rate_csv_rows_are_located(tmp_path, text, line, field, problem):
    p = tmp_path / "r.csv"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        R.read_rate_csv(str(p))
    assert (e.value.file, e.value.line, e.value.field) == (str(p), line, field)
    assert e.value.problem.startswith(problem)


def test_rate_csv_row_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "MAX_LOAD_PIECES", 3)
    p = tmp_path / "r.csv"
    p.write_text("time_s,rate\n" + "".join(f"{i},1\n" for i in range(4)))
    with pytest.raises(ConfigError) as e:
        R.read_rate_csv(str(p))
    assert (e.value.line, e.value.problem) == (5, "more than 3 rows")


BASE = {
    "model": "meta-llama/llama-3.1-8b-instruct",
    "latency": {"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1000, 0, 0]},
    "engine": {"total_kv_blocks": 1000},
    "workload": {"kind": "distribution",
                 "prompt_tokens": {"mean": 30, "stdev": 10, "min": 10, "max": 50},
                 "output_tokens": {"mean": 3, "stdev": 3, "min": 3, "max": 3}},
}


def _out(workload, **top):
    sc = copy.deepcopy(BASE)
    sc["workload"].update(workload)
    sc.update(top)
    return run.execute(run.prepare(sc, {}))


def test_a_staged_run_offers_the_distribution_requests_at_the_schedule_times():
    out = _out({"stages": [{"rate": 2, "duration_s": 1}, {"rate": 4, "duration_s": 1}]})
    reqs = list(out.requests)
    assert [r.arrival_us for r in reqs] == [500_000, 1_000_000, 1_250_000, 1_500_000, 1_750_000,
                                            2_000_000]
    plain = _out({"num_requests": 6})        # the same requests, BLIS's constant spacing
    assert [(r.id, r.input_len) for r in reqs] == [(r.id, r.input_len) for r in plain.requests]
    assert out.report.cluster.completed_requests == 6


def test_a_written_num_requests_caps_a_schedule():
    out = _out({"rate_schedule": [{"at_s": 0, "rate": 10}], "num_requests": 4})
    assert [r.arrival_us for r in out.requests] == [99_999, 199_998, 299_997, 399_996]


def test_a_schedule_until_the_horizon(tmp_path):
    p = tmp_path / "day.csv"
    p.write_text("time_s,rate\n0,4\n0.5,0\n")
    out = _out({"rate_csv": str(p)}, horizon_us=10_000_000)
    assert [r.arrival_us for r in out.requests] == [250_000, 500_000]


def test_an_open_ended_schedule_needs_a_horizon_or_a_cap():
    with pytest.raises(ConfigError, match="the last rate never ends"):
        _out({"rate_schedule": [{"at_s": 0, "rate": 1}]})


def test_too_many_arrivals_are_refused():
    with pytest.raises(ConfigError, match="more than the 10000000 a workload may have"):
        _out({"stages": [{"rate": 1e9, "duration_s": 1e8}]})


def test_piece_times_round_to_the_nearest_us():
    """2.01 s x 1e6 is 2009999.9999999998 in floating point: the boundary is 2 010 000 us, not
    the truncated 2 009 999."""
    pieces = R.schedule_pieces([(0.0, 5.0), (2.01, 10.0)])
    assert [(p.start_us, p.end_us) for p in pieces][:2] == [(0, 2_010_000), (2_010_000, MAX_INT64)]
