"""The fast engine's pure-decode short path, taken or not (docs/performance.md, "Step
coalescing"): exact step counts and times on a one-request case, a pass-through override
of ``step_time_us`` with and without the class's ``short_path_safe`` claim, and the one
debug line per instance that says which path ran and why.

The case: one request at 0 µs, 16 prompt tokens, 5 output tokens, block size 16; blackbox
α = (100, 1, 50), β = (1000, 10, 5). Queueing 100 + 16 = 116 µs; step 1 at 116 µs prefills
16 tokens in 1000 + 160 = 1160 µs (ends 1276; TTFT 1276 + OTPT 50 = 1326); steps 2–5 decode
one token each in 1000 + 5 = 1005 µs, at 1276, 2281, 3286 and 4291 µs; step 5 completes
the request (pi 20 = 16 + 5 − 1). Steps 2, 3 and 4 are pure-decode steps that complete
nobody: the short path; step 5 completes and runs the ordinary way. E2E = TTFT + 4 ITL
samples of 1005 + 50 µs = 1326 + 4220 = 5546 µs.
"""

from __future__ import annotations

import logging

from blis_simpy.engine.fast import FastInstance
from blis_simpy.run.simulation import Simulation
from tests.engine.helpers import make_requests, scenario


class PassThroughSafe(FastInstance, name="test-pass-through-safe"):
    """Overrides ``step_time_us`` only to count its calls, and says the short path is safe."""

    short_path_safe = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.timed = []

    def step_time_us(self, batch) -> int:
        self.timed.append(batch.size)
        return super().step_time_us(batch)


class PassThroughUnclaimed(PassThroughSafe, name="test-pass-through-unclaimed"):
    """The same override, without the claim in its own body (a claim is not inherited)."""


def _run(instance_class=None, implementation="fast"):
    sim = Simulation(scenario(implementation=implementation, block_size=16),
                     make_requests([(0, 16, 5)]),
                     **({"instance_class": instance_class} if instance_class else {}))
    res = sim.run()
    return sim.instances[0], res.instances[0]


def _times(met) -> tuple:
    return (met.ttft["request_0"], met.e2e["request_0"], met.step_samples,
            met.total_output_tokens, met.kv_blocks_integral)


def test_the_short_path_takes_exactly_the_pure_decode_steps_that_complete_nobody():
    inst, met = _run()
    assert inst.decode_ticks == 3
    assert inst.step_count == met.step_samples == 5
    assert met.ttft["request_0"] == 1326
    assert met.e2e["request_0"] == 5546
    assert _times(met) == _times(_run(implementation="reference")[1])


def test_a_pass_through_step_time_keeps_the_short_path_when_the_class_claims_it():
    safe, met_safe = _run(PassThroughSafe)
    assert safe.decode_ticks == 3                 # as without the override
    assert safe.timed == [1, 1, 1, 1, 1]          # the override times all 5 steps
    unclaimed, met_unclaimed = _run(PassThroughUnclaimed)
    assert PassThroughSafe.short_path_safe and not PassThroughUnclaimed.short_path_safe
    assert unclaimed.decode_ticks == 0            # every step the ordinary way
    assert unclaimed.timed == [1, 1, 1, 1, 1]
    assert _times(met_safe) == _times(met_unclaimed) == _times(_run()[1])


def test_the_debug_log_says_once_per_instance_which_path_runs_and_why(caplog):
    with caplog.at_level(logging.DEBUG, logger="blis_simpy.engine"):
        _run()
        _run(PassThroughSafe)
        _run(PassThroughUnclaimed)
    lines = [r.getMessage() for r in caplog.records if "short path" in r.getMessage()]
    assert lines == [
        "instance_0: pure-decode steps take the short path, back to back; timed by the "
        "BlackboxModel model's decode function",
        "instance_0: pure-decode steps take the short path, one call each (step is "
        "overridden or wrapped); timed by the engine's step_time_us",
        "instance_0: every step the ordinary way (no pure-decode short path: engine class "
        "PassThroughUnclaimed does not claim short_path_safe)",
    ]


def test_a_kv_cache_that_does_not_claim_the_short_path_turns_it_off(caplog):
    # the tiered cache (its reloads add step time, it mirrors every step) claims it not;
    # the same case then runs every step the ordinary way, with the same results
    sim = Simulation(scenario(block_size=16, kv_cpu_blocks=100), make_requests([(0, 16, 5)]))
    with caplog.at_level(logging.DEBUG, logger="blis_simpy.engine"):
        res = sim.run()
    assert type(sim.instances[0].kv).__name__ == "TieredKVCache"
    assert sim.instances[0].decode_ticks == 0
    assert _times(res.instances[0]) == _times(_run()[1])
    assert [r.getMessage() for r in caplog.records if "short path" in r.getMessage()] == [
        "instance_0: every step the ordinary way (no pure-decode short path: KV cache "
        "TieredKVCache does not claim short_path_safe)"]
