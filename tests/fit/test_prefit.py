"""The step-level pre-fit: tick arithmetic by hand, and recovery of known costs."""

from __future__ import annotations

import pytest

from blis_simpy.config.scenario import LatencyConfig, Scenario
from blis_simpy.deploy.resolve import resolve
from blis_simpy.fit import prefit
from blis_simpy.fit.prefit import StepObs, decode_steps, model_steps, prefit_steps
from blis_simpy.fit.space import space_for
from blis_simpy.measured.run import MeasuredRun, RealRequest, Tick


def _req(i: int, first_s: float, last_s: float, n_in: int, tpot_ms: float) -> RealRequest:
    return RealRequest(f"r{i}", 0, n_in, 100, first_s, last_s, first_s * 1000, last_s * 1000, tpot_ms, i)


def test_decode_steps_by_hand():
    ticks = [Tick(1.0, 0.0, 400.0, 10, 0), Tick(2.0, 0.0, 500.0, 10, 0),     # kept
             Tick(3.0, 900.0, 500.0, 10, 0),                                  # prompt tokens: no
             Tick(4.0, 0.0, 500.0, 14, 0),                                    # running 10 -> 14: no
             Tick(5.0, 0.0, 0.0, 14, 0)]                                      # nothing generated: no
    reqs = [_req(0, 1.0, 3.0, 100, 10.0),     # decoding at t = 1.5 s: 100 + 0.5 s / 10 ms = 150
            _req(1, 1.2, 1.4, 300, 5.0),      # finished before the midpoint: left out
            _req(2, 0.5, 2.0, 200, 20.0)]     # 200 + 1.0 s / 20 ms = 250
    run = MeasuredRun("t", None, reqs, None, None, ticks, 0.0)
    obs = decode_steps(run)
    assert obs == [StepObs(2.0, 10.0, 200.0, 20_000.0)]      # 10 requests / 500 tok/s = 20 ms


def test_prefit_recovers_known_costs(monkeypatch):
    """Steps of two deployments (an 8B model on one GPU, a 70B model over TP 4) made with known
    costs: the weights differ by model, so their memory cost is told apart from the fixed
    per-step cost, and TP 4 pins the collectives. (Without the pull towards the start, which
    would bias the recovered values a little.)"""
    monkeypatch.setattr(prefit, "PRIOR_WEIGHT", 0.0)
    s = Scenario(model="meta-llama/llama-3.1-8b", hardware="H100", tp=1,
                 latency=LatencyConfig(model="physics", coefficients="default"))
    big = Scenario(model="meta-llama/llama-3.1-70b", hardware="H100", tp=4,
                   latency=LatencyConfig(model="physics", coefficients="default"))
    space = space_for(s)
    assert space.dep is not None and resolve(s, quiet=True).gpu.name == "H100"
    dep70 = resolve(big, quiet=True)
    truth = [1.0, 1.2, 1.5, 800.0, 30.0, 0.7]
    shape = [(b, c, d) for b in (1, 4, 16, 40, 90, 128) for c in (300, 1500, 4000) for d in (None, dep70)]
    fake = [StepObs(float(i), float(b), float(c), 0.0, deployment=d) for i, (b, c, d) in enumerate(shape)]
    steps = model_steps(space, fake, truth)
    obs = [StepObs(o.t_s, o.batch, o.context, float(v), deployment=o.deployment)
           for o, v in zip(fake, steps, strict=True)]
    got = prefit_steps(space, obs)
    assert got is not None and got.observations == len(obs)
    assert got.x[0] == 1.0                                     # compute is not pre-fitted
    for i, want in enumerate(truth[1:], 1):
        assert got.x[i] == pytest.approx(want, rel=0.02), (space.params[i].name, got.x[i])
    assert got.mape_after_pct < 0.05 < got.mape_before_pct
    assert prefit_steps(space, obs[:4]) is None                # too few ticks


def test_prefit_keeps_a_cost_the_data_cannot_see_at_its_start():
    """TP 1 steps say nothing of the collectives; the pull towards the start keeps them there,
    and it costs the step fit (almost) nothing."""
    s = Scenario(model="meta-llama/llama-3.1-8b", hardware="H100", tp=1,
                 latency=LatencyConfig(model="physics", coefficients="default"))
    space = space_for(s)
    truth = [1.0, 1.1, 1.3, 500.0, 20.0, 1.0]
    fake = [StepObs(float(i), float(b), float(c), 0.0) for i, (b, c) in
            enumerate((b, c) for b in (1, 8, 32, 64, 128) for c in (500, 2000))]
    steps = model_steps(space, fake, truth)
    obs = [StepObs(o.t_s, o.batch, o.context, float(v)) for o, v in zip(fake, steps, strict=True)]
    got = prefit_steps(space, obs)
    assert got.x[5] == space.x0()[5] == 1.0
    assert got.mape_after_pct < 2.0 and got.mape_before_pct > 15.0     # 18.7 % -> 1.1 %


def _space8b():
    return space_for(Scenario(model="meta-llama/llama-3.1-8b", hardware="H100", tp=1,
                              latency=LatencyConfig(model="physics", coefficients="default")))


def test_fixed_point_step_is_the_batch_the_load_builds():
    """A stage measured at batch 40 and step 10 ms carries a load of 40 / 10,000 requests per
    µs of step. Under a set, the implied batch b solves b = 0.004·step(b): the returned step
    satisfies it (to the bisection's precision), and a set whose step at the measured batch is
    exactly the measured one gives back the measured step."""
    space = _space8b()
    x = space.x0()
    at40 = float(model_steps(space, [StepObs(0.0, 40.0, 1000.0, 0.0)], x)[0])
    k = 40.0 / at40
    obs = StepObs(0.0, 40.0, 1000.0, at40, max_batch=128.0)
    (fp,) = prefit.fixed_point_steps(space, [obs], x)
    assert fp == pytest.approx(at40, rel=1e-9)                 # the measurement is its own root
    # a load 10 % heavier builds a bigger batch; its step is the model's at b = k'·step
    heavy = StepObs(0.0, 40.0, 1000.0, at40 / 1.1, max_batch=128.0)
    (fp2,) = prefit.fixed_point_steps(space, [heavy], x)
    b = 1.1 * k * fp2
    assert 40.0 < b < 128.0
    assert fp2 == pytest.approx(prefit._decode_us(space.dep.new_latency_model(), b, 1000.0), rel=1e-6)
    # a load the cap cannot serve: the step at the cap, scaled by the excess (> the cap's step)
    over = StepObs(0.0, 40.0, 1000.0, at40 / 10.0, max_batch=128.0)
    (fp3,) = prefit.fixed_point_steps(space, [over], x)
    top = prefit._decode_us(space.dep.new_latency_model(), 128.0, 1000.0)
    assert fp3 == pytest.approx(top * (400.0 / at40) * top / 128.0)
    assert fp3 > top
    # without a cap (a log tick) or at the cap: the step at the measured batch
    assert prefit.fixed_point_steps(space, [StepObs(0.0, 40.0, 1000.0, 1.0)], x)[0] == pytest.approx(at40)


def test_decode_step_is_linear_between_whole_batches():
    m = _space8b().dep.new_latency_model()
    a, b = prefit._decode_us(m, 10.0, 500.0), prefit._decode_us(m, 11.0, 500.0)
    assert prefit._decode_us(m, 10.25, 500.0) == pytest.approx(0.75 * a + 0.25 * b)
