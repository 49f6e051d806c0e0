"""The trained alpha/beta ``blackbox`` latency model (docs/latency-models.md).

step_time_us     = max(1, to_int64(β0 + β1·Σ prefill NumNewTokens + β2·Σ decode NumNewTokens))
queueing_time_us = to_int64(α0 + α1·len(input))
OTPT             = to_int64(α2);  post_decode = 0
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blis_simpy.latency.base import BatchView, LatencyModel
from blis_simpy.latency.blackbox import BlackboxModel
from blis_simpy.request import Request


def _req(rid, n_in, n_out, *, pi=0, new=0):
    r = Request(rid, 0, list(range(n_in)), list(range(n_out)))
    r.pi = pi
    r.num_new_tokens = new
    return r


def _batch(prefill_new=(), decode_new=()):
    """A batch with one prefill-phase request per entry of ``prefill_new`` (its scheduled
    tokens) and one decode-phase request per entry of ``decode_new`` (0 or 1)."""
    reqs = [_req(f"p{i}", 100, 5, pi=0, new=n) for i, n in enumerate(prefill_new)]
    reqs += [_req(f"d{i}", 10, 5, pi=10, new=n) for i, n in enumerate(decode_new)]
    return BatchView.of(reqs)


def _sums(m, prefill_tokens: int, decode_tokens: int) -> int:
    """``m``'s step time for a batch holding these token sums (one prefill chunk of
    ``prefill_tokens``, ``decode_tokens`` decoders)."""
    pre = [SimpleNamespace(num_new_tokens=prefill_tokens)] if prefill_tokens else []
    return m.step_time_us(BatchView(prefill=pre, decode_count=decode_tokens, decode_tokens=decode_tokens,
                                 size=len(pre) + decode_tokens))


def test_registered_under_blackbox():
    assert LatencyModel.lookup("blackbox") is BlackboxModel


# ---------------------------------------------------------------------------- step time
def test_step_time_truncates_beta0():
    m = BlackboxModel([0, 0, 0], [1000.9, 0, 0])
    assert m.step_time_us(_batch()) == 1000          # truncated, not rounded to 1001


def test_step_time_linear_in_prefill_and_decode_tokens():
    m = BlackboxModel([0, 0, 0], [1000.0, 2.5, 0.25])
    # prefill: 3 + 5 = 8 tokens -> 20.0; decode: 1 + 1 + 0 = 2 tokens -> 0.5
    # 1000 + 20 + 0.5 = 1020.5 -> 1020
    b = _batch(prefill_new=(3, 5), decode_new=(1, 1, 0))
    assert b.prefill_tokens == 8 and b.decode_tokens == 2
    assert m.step_time_us(b) == 1020


def test_step_time_truncates_the_float_sum():
    m = BlackboxModel([0, 0, 0], [100.0, 0.3, 0.3])
    # 100 + 0.3*3 + 0.3*3 = 101.8 (float: 101.79999999999998) -> 101; round would give 102
    assert m.step_time_us(_batch(prefill_new=(3,), decode_new=(1, 1, 1))) == 101


def test_step_time_prefill_and_decode_use_their_own_coefficient():
    m = BlackboxModel([0, 0, 0], [10.0, 100.0, 1.0])
    assert m.step_time_us(_batch(prefill_new=(1,))) == 110
    assert m.step_time_us(_batch(decode_new=(1,))) == 11


@pytest.mark.parametrize(("beta", "expected"), [
    ([0, 0, 0], 1),        # empty work -> floored to 1 µs
    ([0.5, 0, 0], 1),      # truncates to 0 -> floored
    ([0.999, 0, 0], 1),
    ([1.0, 0, 0], 1),
    ([1.999, 0, 0], 1),
    ([2.0, 0, 0], 2),
])
def test_step_time_floor_at_one(beta, expected):
    m = BlackboxModel([0, 0, 0], beta)
    assert m.step_time_us(_batch()) == expected


def test_requests_outside_prefill_and_decode_are_ignored():
    # a zero-output request that finished its prompt is neither prefill nor decode
    m = BlackboxModel([0, 0, 0], [10.0, 100.0, 1000.0])
    done = _req("z", 4, 0, pi=4, new=1)
    assert m.step_time_us(BatchView.of([done])) == 10


def test_extra_coefficients_are_ignored():
    m3 = BlackboxModel([1, 2, 3], [10, 20, 30])
    m5 = BlackboxModel([1, 2, 3, 99, 99], [10, 20, 30, 99, 99])
    assert _sums(m5, 2, 3) == _sums(m3, 2, 3) == 10 + 40 + 90
    r = _req("r", 7, 1)
    assert m5.queueing_time_us(r) == m3.queueing_time_us(r) == 1 + 14
    assert m5.output_token_time_us() == 3


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=3, max_size=3),
       st.integers(0, 10_000), st.integers(0, 10_000))
def test_step_time_property(beta, p, d):
    m = BlackboxModel([0, 0, 0], beta)
    got = _sums(m, p, d)
    assert got == max(1, math.trunc(beta[0] + beta[1] * p + beta[2] * d))
    assert got >= 1


# ---------------------------------------------------------------------------- alpha terms
def test_queueing_time_truncated():
    m = BlackboxModel([100.7, 1.5, 50.9], [1, 0, 0])
    # 100.7 + 1.5*3 = 105.2 -> 105
    assert m.queueing_time_us(_req("a", 3, 1)) == 105
    # 100.7 + 1.5*0 -> 100 (empty prompt)
    assert m.queueing_time_us(_req("b", 0, 1)) == 100
    # 100.7 + 1.5*1 = 102.2 -> 102
    assert m.queueing_time_us(_req("c", 1, 0)) == 102


def test_queueing_time_depends_on_input_length_only():
    m = BlackboxModel([0, 2.0, 0], [1, 0, 0])
    assert m.queueing_time_us(_req("a", 10, 0)) == m.queueing_time_us(_req("b", 10, 500)) == 20


def test_otpt_truncated_and_post_decode_zero():
    assert BlackboxModel([0, 0, 50.9], [1, 0, 0]).output_token_time_us() == 50
    assert BlackboxModel([0, 0, 0.99], [1, 0, 0]).output_token_time_us() == 0
    assert BlackboxModel([0, 0, 50.9], [1, 0, 0]).post_decode_us() == 0


def test_results_are_ints():
    m = BlackboxModel([1.5, 0.5, 2.5], [3.5, 0.5, 0.5])
    for v in (_sums(m, 1, 1), m.queueing_time_us(_req("a", 3, 1)),
              m.output_token_time_us()):
        assert type(v) is int


# ---------------------------------------------------------------------------- validation
GOOD = [1.0, 2.0, 3.0]


@pytest.mark.parametrize("bad", [
    [],
    [1.0],
    [1.0, 2.0],                       # fewer than 3
    [1.0, -0.001, 3.0],               # negative
    [-1.0, 2.0, 3.0],
    [1.0, 2.0, math.nan],             # NaN
    [1.0, math.inf, 3.0],             # inf
    [1.0, 2.0, 3.0, -math.inf],       # a bad extra entry is still rejected
])
@pytest.mark.parametrize("which", ["alpha", "beta"])
def test_coefficient_validation(bad, which):
    args = {"alpha": GOOD, "beta": GOOD, which: bad}
    with pytest.raises(ValueError, match=which):
        BlackboxModel(args["alpha"], args["beta"])


def test_zero_coefficients_are_valid():
    m = BlackboxModel([0, 0, 0], [0, 0, 0])
    assert _sums(m, 5, 5) == 1


def test_the_pure_decode_step_function_is_the_step_time_for_any_context():
    m = BlackboxModel([100.0, 1.0, 50.0], [1000.0, 10.0, 5.5])
    for size, count in ((1, 1), (7, 5), (300, 300)):
        f = m.decode_step_fn(size, count)
        for pi in (0, 17, 123_456, 9_999_999):
            v = BatchView(decode_count=count, decode_tokens=count, decode_pi_sum=pi, size=size)
            assert f(pi) == m.step_time_us(v) == int(1000.0 + 5.5 * count)

    class Own(BlackboxModel):
        def step_time_us(self, batch):
            return 1 + batch.decode_pi_sum

    assert Own([0.0, 0.0, 0.0], [1.0, 0.0, 0.0]).decode_step_fn(4, 4) is None
