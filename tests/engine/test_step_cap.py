"""The longest engine step (``MAX_STEP_US``, one hour): both engines stop at the same step with
the same one-line error, and a step of exactly the cap still runs (docs/scenarios.md, "Limits")."""

from __future__ import annotations

import pytest

from blis_simpy.config.scenario import MAX_DELAY_US, Scenario
from blis_simpy.deploy.resolve import Deployment
from blis_simpy.engine.limits import MAX_STEP_US
from blis_simpy.errors import ConfigError
from blis_simpy.latency.base import BatchView, LatencyModel
from blis_simpy.run.simulation import Simulation
from tests.engine.helpers import DENSE, MOE, TinyLatency, build_dp, make_requests


class DecodeOverCap(LatencyModel):
    """1 000 µs for a step with prefill work; a pure-decode step lasts ``DECODE_US``."""

    DECODE_US = MAX_STEP_US + 1

    def step_time_us(self, batch: BatchView) -> int:
        return 1000 if batch.prefill_tokens else self.DECODE_US


class DecodeAtCap(DecodeOverCap):
    DECODE_US = MAX_STEP_US


def _sim(latency, impl: str, specs) -> Simulation:
    sc = Scenario(model="test/tiny", engine={"implementation": impl, "total_kv_blocks": 100,
                                                "async_scheduling": False},
                  latency={"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1, 0, 0]})
    dep = Deployment(total_kv_blocks=100, block_size=16, max_model_len=0, latency_factory=latency,
                     model_config=DENSE, tp=1)
    return Simulation(sc, make_requests(specs), deployment=dep)


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_a_step_past_the_cap_stops_both_engines_alike(impl):
    with pytest.raises(ConfigError) as e:
        _sim(DecodeOverCap, impl, [(0, 20, 5), (10, 20, 5)]).run()
    assert e.value.field == "latency"
    # prefill of request_0 at t=0, then request_1's prefill with request_0's first decode at
    # t=1000 (1000 us each); the first pure-decode step begins at t=2000
    assert e.value.problem == (
        f"instance_0: the step at t=2000 us lasts {MAX_STEP_US + 1} us, more than the "
        f"{MAX_STEP_US} us (one hour) an engine step may last: the latency coefficients or KV "
        "transfer costs are not realistic")


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_a_step_of_exactly_the_cap_runs(impl):
    m = _sim(DecodeAtCap, impl, [(0, 20, 3)]).run().instances[0]
    # one prefill step (1000 us) and two decode steps of exactly the cap
    assert m.completed_requests == 1
    assert m.sim_ended_time == 1000 + 2 * MAX_STEP_US


def test_lockstep_dp_steps_are_capped_too():
    class Huge(TinyLatency):
        def lockstep_step_time_us(self, views):
            return MAX_STEP_US + 5

    sim = build_dp(MOE, dp=2, requests=make_requests([(0, 10, 2)]))
    for eng in sim.cluster.instances:
        eng.latency = Huge()
    for group in {id(i.lockstep): i.lockstep for i in sim.cluster.instances if i.lockstep}.values():
        group.latency = Huge()
    with pytest.raises(ConfigError, match=f"lasts {MAX_STEP_US + 5} us"):
        sim.run()


def test_the_delay_bound_of_the_scenario_is_the_step_cap():
    assert MAX_DELAY_US == MAX_STEP_US == 3_600_000_000
