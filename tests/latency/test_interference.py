"""The co-location interference wrapper (docs/disaggregation.md, INV-P2-3)."""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blis_simpy.latency import BlackboxModel
from blis_simpy.latency.base import BatchView, LatencyModel
from blis_simpy.latency.interference import (
    MAX_INTERFERENCE_FACTOR,
    InterferenceModel,
    interference_multiplier,
)
from tests.latency.support import Req, decode, prefill, view


class Fixed(LatencyModel):
    """A test model: constant step time and overheads (no name: not registered)."""

    def __init__(self, step=1000):
        self.step = step
        self.calls = 0

    def step_time_us(self, batch):
        self.calls += 1
        return self.step

    def queueing_time_us(self, req):
        return 11 + req.input_len

    def output_token_time_us(self):
        return 22

    def post_decode_us(self):
        return 33


def batch(p: int, q: int) -> BatchView:
    """``p`` prefill-phase requests then ``q`` decode-phase ones."""
    return view(*([prefill(0, 32)] * p + [decode(100, 1, 50)] * q))


def wrapped(fp, fd, step=1000):
    return InterferenceModel(Fixed(step), fp, fd)


# --------------------------------------------------------------------------- spec examples
@pytest.mark.parametrize(("f", "p", "q", "expected"), [
    (0.5, 2, 2, 1.25), (1.0, 2, 2, 1.5), (100.0, 1, 1, 51.0), (1.0, 1, 3, 1.25), (1.0, 3, 1, 1.25),
])
def test_spec_examples(f, p, q, expected):
    m = wrapped(f, f)
    assert m.multiplier(batch(p, q)) == expected
    assert m.step_time_us(batch(p, q)) == 1000 * expected
    assert m.last_multiplier == expected


def test_factor_100_is_at_most_51():
    worst = max(interference_multiplier(p, n, 100.0, 100.0) for n in range(1, 41) for p in range(n + 1))
    assert worst == 51.0
    assert interference_multiplier(3, 7, 100.0, 100.0) == 1 + 100 * 3 / 7


def test_phase_pure_and_empty_batches_are_exactly_one():
    m = wrapped(100, 100)
    for b in (batch(4, 0), batch(0, 4), batch(1, 0), batch(0, 1), BatchView()):
        assert m.multiplier(b) == 1.0
        assert m.step_time_us(b) == 1000 and m.last_multiplier == 1.0


def test_majority_phase_picks_the_factor():
    # prefill-dominant (3 vs 1) uses the prefill factor, decode-dominant the decode one
    assert wrapped(1.0, 0.0).step_time_us(batch(3, 1)) == 1250
    assert wrapped(0.0, 1.0).step_time_us(batch(3, 1)) == 1000
    assert wrapped(0.0, 1.0).step_time_us(batch(1, 3)) == 1250
    assert wrapped(1.0, 0.0).step_time_us(batch(1, 3)) == 1000


def test_tie_uses_the_larger_factor_either_way():
    assert wrapped(0.2, 0.8).multiplier(batch(2, 2)) == 1 + 0.8 * 2 / 4
    assert wrapped(0.8, 0.2).multiplier(batch(2, 2)) == 1 + 0.8 * 2 / 4
    assert wrapped(0.0, 0.6).step_time_us(batch(1, 1)) == 1300


def test_counts_requests_not_tokens_and_reads_the_batch_view():
    # one 4000-token prefill among 3 decodes is a 1-of-4 minority, whatever its tokens
    b = view(prefill(0, 4000), decode(10), decode(20), decode(30))
    assert len(b.prefill) == 1 and b.size == 4
    assert wrapped(0.0, 2.0).multiplier(b) == 1.5
    # a request with no output left (pi ≥ input, no outputs) is not prefill-phase: q side
    done = view(prefill(0, 8), Req(pi=8, input_len=8, num_new_tokens=0, output_len=0))
    assert len(done.prefill) == 1 and done.size == 2
    assert wrapped(1.0, 1.0).multiplier(done) == 1.5


def test_rounds_half_away_from_zero_and_floors_at_one():
    assert wrapped(1.0, 1.0, step=3).step_time_us(batch(1, 1)) == 5    # 4.5 -> 5 (banker's: 4)
    assert wrapped(1.0, 1.0, step=5).step_time_us(batch(1, 1)) == 8    # 7.5 -> 8
    assert wrapped(0.5, 0.5, step=1).step_time_us(batch(1, 1)) == 1    # 1.25 -> 1
    assert wrapped(1.0, 1.0, step=0).step_time_us(batch(1, 1)) == 1    # max(1, 0)
    assert wrapped(1.0, 1.0, step=0).step_time_us(batch(2, 0)) == 1


def test_int64_overflow_returns_base(caplog):
    m = wrapped(100.0, 100.0, step=2**62)
    with caplog.at_level(logging.ERROR, logger="blis_simpy.latency"):
        assert m.step_time_us(batch(1, 1)) == 2**62
    assert "overflow" in caplog.text
    assert wrapped(1.0, 1.0, step=2**61).step_time_us(batch(1, 1)) == 3 * 2**60


def test_last_multiplier_tracks_each_call():
    m = wrapped(1.0, 1.0)
    assert m.last_multiplier == 1.0                # before any call
    m.step_time_us(batch(1, 1))
    assert m.last_multiplier == 1.5
    m.step_time_us(batch(1, 3))
    assert m.last_multiplier == 1.25
    m.step_time_us(batch(0, 3))
    assert m.last_multiplier == 1.0
    m.multiplier(batch(1, 1))                      # pure query: no change
    assert m.last_multiplier == 1.0


def test_overheads_are_delegated():
    inner = Fixed()
    m = InterferenceModel(inner, 3.0, 4.0)
    r = type("R", (), {"input_len": 5})()
    assert m.queueing_time_us(r) == 16
    assert m.output_token_time_us() == 22
    assert m.post_decode_us() == 33
    m.step_time_us(batch(1, 1))
    assert inner.calls == 1


def test_wraps_a_real_backend():
    bb = BlackboxModel([0, 0, 0], [100, 1, 2])
    b = view(prefill(0, 50), decode(60), decode(70), decode(80))
    base = bb.step_time_us(b)
    assert base == 100 + 50 + 3 * 2
    assert InterferenceModel(bb, 0.0, 1.0).step_time_us(b) == round(base * 1.25)


@pytest.mark.parametrize("bad", [-0.001, math.nan, math.inf, -math.inf, MAX_INTERFERENCE_FACTOR + 1e-9])
def test_factor_validation(bad):
    with pytest.raises(ValueError):
        InterferenceModel(Fixed(), bad, 0.0)
    with pytest.raises(ValueError):
        InterferenceModel(Fixed(), 0.0, bad)


def test_bounds_are_inclusive():
    InterferenceModel(Fixed(), 0.0, 0.0)
    InterferenceModel(Fixed(), MAX_INTERFERENCE_FACTOR, MAX_INTERFERENCE_FACTOR)


def test_not_a_selectable_latency_backend():
    assert InterferenceModel not in set(LatencyModel._registry.values())
    assert not any("interference" in n for n in LatencyModel.names())
    assert InterferenceModel.name == ""


# --------------------------------------------------------------------------- INV-P2-3
factor = st.one_of(st.just(0.0), st.floats(1e-6, MAX_INTERFERENCE_FACTOR))


@given(p=st.integers(0, 64), q=st.integers(0, 64), fp=factor, fd=factor,
       step=st.integers(1, 10**9))
def test_inv_p2_3_multiplier_properties(p, q, fp, fd, step):
    """m ≥ 1; m == 1 iff the batch is phase-pure or the deciding factor is 0; the step
    never gets shorter. (Factors below 1e-6 are excluded: 1 + f·k/n rounds to 1.0 in float
    when f·k/n < 2⁻⁵³.)"""
    m = wrapped(fp, fd, step)
    b = batch(p, q)
    mult = m.multiplier(b)
    deciding = fp if p > q else fd if q > p else max(fp, fd)
    assert mult >= 1.0
    assert (mult == 1.0) == (p == 0 or q == 0 or deciding == 0.0)
    assert mult <= 1 + MAX_INTERFERENCE_FACTOR / 2
    t = m.step_time_us(b)
    assert t >= step
    assert m.last_multiplier == mult
    if step * (mult - 1) >= 1.5:
        assert t > step
