"""Length and arrival samplers (docs/workloads.md, "Samplers")."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_simpy.errors import ConfigError
from blis_simpy.workload.arrivals import (
    ConstantArrival,
    GammaArrival,
    PoissonArrival,
    WeibullArrival,
    gamma_variate,
    make_arrival_sampler,
    weibull_cv,
    weibull_shape_from_cv,
)
from blis_simpy.workload.lengths import MAX_TOKENS, EmpiricalSampler, empirical_sampler, make_length_sampler


class FakeRng:
    """Replays fixed values; fails if a sampler draws something it should not."""

    def __init__(self, normal=(), uniform=(), expo=()):
        self.normal, self.uniform, self.expo = list(normal), list(uniform), list(expo)

    def standard_normal(self):
        return self.normal.pop(0)

    def random(self):
        return self.uniform.pop(0)

    def standard_exponential(self):
        return self.expo.pop(0)

    def exhausted(self):
        return not (self.normal or self.uniform or self.expo)


def gauss(mean, sd, lo, hi):
    return make_length_sampler("gaussian", {"mean": mean, "std_dev": sd, "min": lo, "max": hi})


# ------------------------------------------------------------------------------ lengths

@settings(max_examples=40, deadline=None)
@given(mean=st.floats(-1e4, 1e4), sd=st.floats(0, 1e4), lo=st.integers(-50, 500),
       width=st.integers(1, 5000), seed=st.integers(0, 2**32))
def test_gaussian_clamped_and_at_least_one(mean, sd, lo, width, seed):
    s = gauss(mean, sd, lo, lo + width)
    rng = np.random.default_rng(seed)
    for _ in range(50):
        v = s.sample(rng)
        assert isinstance(v, int)
        assert max(1, lo) <= v <= max(1, lo + width)


def test_gaussian_rounds_half_away_and_clamps():
    s = gauss(10, 1, 2, 20)
    rng = FakeRng(normal=[0.5, -0.5, 100.0, -100.0, 1.4999])
    assert [s.sample(rng) for _ in range(5)] == [11, 10, 20, 2, 11]   # 10.5→11, 9.5→10
    s = gauss(-0.5, 0, -5, 5)
    assert s.sample(FakeRng(normal=[0.0])) == 1                        # -0.5→-1, floored at 1


def test_gaussian_min_equals_max_draws_nothing():
    rng = FakeRng()
    assert gauss(100, 50, 7.9, 7.2).sample(rng) == 7                   # min/max truncated
    assert rng.exhausted()


def test_exponential_and_constant():
    s = make_length_sampler("exponential", {"mean": 100})
    assert s.sample(FakeRng(expo=[0.125])) == 13                        # 12.5 → 13
    assert s.sample(FakeRng(expo=[0.001])) == 1
    rng = np.random.default_rng(4)
    assert abs(np.mean([s.sample(rng) for _ in range(20000)]) - 100) < 3
    c = make_length_sampler("constant", {"value": 7.9})
    empty = FakeRng()
    assert c.sample(empty) == 7 and empty.exhausted()
    assert make_length_sampler("constant", {"value": -3}).sample(empty) == 1


def test_pareto_lognormal_branches():
    p = make_length_sampler("pareto_lognormal",
                            {"alpha": 2, "xm": 50, "mu": 3, "sigma": 0.5, "mix_weight": 0.3})
    # pareto branch: 50 / 0.25^(1/2) = 100
    assert p.sample(FakeRng(uniform=[0.1, 0.25])) == 100
    # U = 0 ⇒ smallest positive float ⇒ astronomically large, clipped at the 2^24 token cap
    assert p.sample(FakeRng(uniform=[0.1, 0.0])) == MAX_TOKENS == 2**24
    # lognormal branch: exp(3 + 0.5·1) = 33.115 → 33
    assert p.sample(FakeRng(uniform=[0.9], normal=[1.0])) == 33
    huge = make_length_sampler("pareto_lognormal",
                               {"alpha": 2, "xm": 50, "mu": 3, "sigma": 1e308, "mix_weight": 0})
    assert huge.sample(FakeRng(uniform=[0.5], normal=[1.0])) == 1      # exp overflows: inf ⇒ 1


def test_empirical_cdf_and_sampling():
    s = empirical_sampler({"10": 1, "30": 0, "20": 3, "5": -1, 40: 4.0})
    assert s.keys == (10, 20, 40)
    assert s.cdf == pytest.approx((0.125, 0.5, 1.0)) and s.cdf[-1] == 1.0
    # first key whose CDF >= U
    assert [s.sample(FakeRng(uniform=[u])) for u in (0.0, 0.125, 0.126, 0.5, 0.99)] == [10, 10, 20, 20, 40]
    rng = np.random.default_rng(0)
    draws = [s.sample(rng) for _ in range(8000)]
    assert abs(draws.count(40) / 8000 - 0.5) < 0.03
    one = FakeRng()
    assert empirical_sampler({"128.0": 0.3}).sample(one) == 128 and one.exhausted()
    assert EmpiricalSampler((), ()).sample(one) == 1
    assert empirical_sampler({"7": 0.5, "7.9": 0.5}).keys == (7,)


def test_length_parameter_errors_name_the_field():
    with pytest.raises(ConfigError) as ei:
        make_length_sampler("gaussian", {"mean": 1, "min": 1, "max": 2}, "client[0].input_distribution")
    assert ei.value.problem == 'distribution requires parameter "std_dev"'
    assert ei.value.field == "client[0].input_distribution.params"
    with pytest.raises(ConfigError) as ei:
        make_length_sampler("exponential", {"mean": math.inf}, "d")
    assert ei.value.field == "d.params.mean"
    with pytest.raises(ConfigError) as ei:
        make_length_sampler("zipf", {}, "d")
    assert ei.value.field == "d.type"
    with pytest.raises(ConfigError) as ei:
        make_length_sampler("empirical", {"abc": 1}, "d")
    assert ei.value.field == "d.params"


# ------------------------------------------------------------------------------ arrivals

def test_constant_arrival_first_at_iat():
    a = make_arrival_sampler("constant", 3 / 1e6)          # 3 req/s
    assert isinstance(a, ConstantArrival)
    rng = FakeRng()
    t, times = 0, []
    for _ in range(3):
        t += a.iat(rng)
        times.append(t)
    assert times == [333333, 666666, 999999] and rng.exhausted()


def test_iat_floor_and_rate_floor():
    assert make_arrival_sampler("constant", 5.0).iat(None) == 1      # 0.2 µs ⇒ 1
    # λ floored at 1e-15; 1/1e-15 = 999999999999999.9 in binary, truncated like Go
    assert make_arrival_sampler("constant", 0.0).iat(None) == 999_999_999_999_999
    assert make_arrival_sampler("poisson", 1e6).iat(FakeRng(expo=[0.5])) == 1


def test_poisson_mean():
    a = make_arrival_sampler("poisson", 1e-3)               # mean 1000 µs
    rng = np.random.default_rng(1)
    x = np.array([a.iat(rng) for _ in range(20000)])
    assert abs(x.mean() - 1000) < 25
    assert x.min() >= 1


@pytest.mark.parametrize("cv", [0.5, 2.0, 3.5])
def test_gamma_mean_and_cv(cv):
    a = make_arrival_sampler("gamma", 1e-4, cv)             # mean 10 000 µs
    assert isinstance(a, GammaArrival) and a.shape == pytest.approx(1 / cv**2)
    rng = np.random.default_rng(2)
    x = np.array([a.iat(rng) for _ in range(30000)], dtype=float)
    assert x.mean() == pytest.approx(1e4, rel=0.08)
    assert x.std() / x.mean() == pytest.approx(cv, rel=0.12)


def test_gamma_falls_back_to_poisson_for_huge_cv(caplog):
    a = make_arrival_sampler("gamma", 1e-4, 11.0)
    assert isinstance(a, PoissonArrival)
    assert "using poisson" in caplog.text


@pytest.mark.parametrize("shape", [0.3, 1.0, 4.5])
def test_gamma_variate_mean(shape):
    rng = np.random.default_rng(9)
    x = np.array([gamma_variate(rng, shape) for _ in range(20000)])
    assert x.mean() == pytest.approx(shape, rel=0.05)
    assert x.var() == pytest.approx(shape, rel=0.1)


@settings(max_examples=60, deadline=None)
@given(cv=st.floats(0.02, 10.4))
def test_weibull_shape_solves_cv(cv):
    k, ok = weibull_shape_from_cv(cv)
    assert ok and 0.1 <= k <= 100
    assert abs(weibull_cv(k) - cv) < 0.001


def test_weibull_known_points_and_sampling():
    k, ok = weibull_shape_from_cv(1.0)                       # exponential
    assert ok and k == pytest.approx(1.0, abs=0.01)
    k, ok = weibull_shape_from_cv(0.01)                      # below cv(100): no convergence
    assert not ok and k == pytest.approx(100, abs=1e-6)
    a = make_arrival_sampler("weibull", 1e-4, 2.0)
    assert isinstance(a, WeibullArrival)
    rng = np.random.default_rng(5)
    x = np.array([a.iat(rng) for _ in range(30000)], dtype=float)
    assert x.mean() == pytest.approx(1e4, rel=0.08)
    assert x.std() / x.mean() == pytest.approx(2.0, rel=0.15)
    assert WeibullArrival(1.0, 1000.0).iat(FakeRng(uniform=[0.0])) > 10**5  # U=0 guarded


def test_arrival_errors_name_the_field():
    for process, cv, fld in [("weibull", 10.5, "a.cv"), ("gamma", -1.0, "a.cv"),
                             ("gamma", math.nan, "a.cv"), ("bursty", None, "a.process")]:
        with pytest.raises(ConfigError) as ei:
            make_arrival_sampler(process, 1e-3, cv, "a")
        assert ei.value.field == fld
