"""The step-level pre-fit: tick arithmetic by hand, and recovery of known costs."""

from __future__ import annotations

import pytest

from blis_simpy.build.resolve import resolve
from blis_simpy.config.scenario import LatencyConfig, Scenario
from blis_simpy.fit.prefit import StepObs, decode_steps, model_steps, prefit_steps
from blis_simpy.fit.space import space_for
from blis_simpy.observed.run import ObservedRun, RealRequest, Tick


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
    run = ObservedRun("t", None, reqs, None, None, ticks, 0.0)
    obs = decode_steps(run)
    assert obs == [StepObs(2.0, 10.0, 200.0, 20_000.0)]      # 10 requests / 500 tok/s = 20 ms


def test_prefit_recovers_known_costs():
    s = Scenario(model="meta-llama/llama-3.1-8b", hardware="RTX-4090", tp=1,
                 latency=LatencyConfig(model="physics", coefficients="default"))
    space = space_for(s)
    assert space.dep is not None and resolve(s, quiet=True).gpu.name == "RTX-4090"
    truth = [1.0, 1.2, 800.0, 30.0]
    shape = [(b, c) for b in (1, 4, 16, 40, 90, 128) for c in (300, 1500, 4000)]
    fake = [StepObs(float(i), float(b), float(c), 0.0) for i, (b, c) in enumerate(shape)]
    steps = model_steps(space, fake, truth)
    obs = [StepObs(o.t_s, o.batch, o.context, float(v)) for o, v in zip(fake, steps, strict=True)]
    got = prefit_steps(space, obs)
    assert got is not None and got.observations == len(obs)
    assert got.x[0] == 1.0                                     # compute is not pre-fitted
    assert got.x[1] == pytest.approx(1.2, rel=0.01)
    assert got.x[2] == pytest.approx(800.0, rel=0.05)
    assert got.x[3] == pytest.approx(30.0, rel=0.05)
    assert got.mape_after_pct < 0.05 < got.mape_before_pct
    assert prefit_steps(space, obs[:4]) is None                # too few ticks
