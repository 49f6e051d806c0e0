"""BLIS never cancels a scheduled Step (docs/engine.md, "Timeouts and stale steps"), with
BLIS's idle instance during a finished step (``step_model="blis"``; docs/engine.md).

When a timeout empties the running batch, the step event already pushed stays in the heap
("stale"). If by the time it fires something is running or queued again, it runs a real
step — so a new step chain started in the meantime runs *alongside* the old one and the
instance executes two interleaved step sequences. Both engines must reproduce that.

All scenarios: blackbox alpha = (0, 0, 0) (no queueing delay, OTPT 0), beta = (1000, 0, 0)
(every step takes exactly 1000 µs), block size 16, 1000 KV blocks, no admission/routing
latency. A request with L output tokens completes when PI >= input + L - 1.
"""

from __future__ import annotations

import pytest

from blis_simpy.run.simulation import Simulation
from tests.engine.helpers import make_requests, scenario

IMPLS = ["reference", "fast"]


def _run_logging_steps(sc, reqs):
    """Run, recording every Step event as (time, step_count after it)."""
    sim = Simulation(sc, reqs)
    inst = sim.instances[0]
    steps = []
    orig = inst.step

    def step(now_us):
        nxt = orig(now_us)
        steps.append((now_us, inst.step_count))
        return nxt

    inst.step = step
    res = sim.run()
    return res.instances[0], steps


@pytest.mark.parametrize("impl", IMPLS)
def test_new_arrival_after_timeout_runs_two_step_chains(impl):
    """A (t=0, 16 in, 100 out, deadline 2500); B (t=2600, 16 in, 5 out); C (t=3700, 16 in, 2 out).

    chain 1: steps at 0 (A prefill), 1000, 2000 (A decodes) -> Step pushed for 3000.
    2500: A times out; the batch is empty, the Step at 3000 becomes stale (not cancelled).
    2600: B is queued, no step is pending -> chain 2 starts with a Step at 2600 (B prefill,
          TTFT 1000) -> 3600, 4600, ...
    3000: the stale step finds B running and runs it (decode 1)      -> 4000, 5000, ...
    3600: chain 2, B decode 2.   3700: C queued.
    4000: chain 1, B decode 3, C admitted (scheduling delay 300, TTFT 4000+1000-3700 = 1300).
    4600: chain 2, B decode 4 -> PI 20 >= 16+5-1: done; C decode 1 -> PI 17 >= 16+2-1: done.
          Both leave at 5600; chain 2 ends (nothing left).
    5000: chain 1 fires on an empty instance: a no-op stale step (step_count stays 8).

    With a single chain (stale step cancelled or skipped) B would decode at 3600, 4600,
    5600, 6600 and C would be admitted at 4600 (TTFT 1900); the instance would end at 7600.
    """
    reqs = make_requests([(0, 16, 100, 2500), (2600, 16, 5), (3700, 16, 2)])
    m, steps = _run_logging_steps(scenario(alpha=(0, 0, 0), beta=(1000, 0, 0), implementation=impl, async_scheduling=False, step_model="blis"), reqs)

    assert steps == [(0, 1), (1000, 2), (2000, 3), (2600, 4), (3000, 5), (3600, 6), (4000, 7),
                     (4600, 8), (5000, 8)]
    assert m.timed_out_requests == 1 and m.completed_requests == 2
    assert m.scheduling_delay == {"request_0": 0, "request_1": 0, "request_2": 300}
    assert m.ttft == {"request_0": 1000, "request_1": 1000, "request_2": 1300}
    # E2E is TTFT + sum(ITL): B = 1000 + 4*1000, C = 1300 + 1000 (not wall-clock step times)
    assert m.e2e == {"request_1": 5000, "request_2": 2300}
    assert m.completion_time == {"request_1": 7600, "request_2": 6000}
    assert dict(m.all_itls) == {1000: 5}
    # the last RequestLeft (4600 + 1000) is the instance's last event time
    assert m.sim_ended_time == 5600
    # 8 real steps; B: scheduled at step 4, finished at 8; C: 7 -> 8
    assert m.step_samples == 8
    assert m.step_counters_sum == (8 - 4) + (8 - 7)


@pytest.mark.parametrize("impl", IMPLS)
def test_timeout_with_queued_work_pushes_a_second_chain(impl):
    """max_num_running_reqs = 1. A (t=0, 16 in, 100 out, deadline 2500); B (t=100, 16 in, 5 out).

    Steps at 0 (A prefill), 1000, 2000 (A decodes; B waits: the batch is full) -> Step at 3000.
    2500: A times out, the batch empties, B is queued and no step is pending -> the Timeout
          pushes a Step at 2500 (chain 2): B prefill, scheduling delay 2400,
          TTFT 2500+1000-100 = 3400 -> 3500, 4500, ...
    3000: the stale step runs B's decode 1 -> 4000, 5000.
    3500, 4000: decodes 2, 3.  4500: decode 4 -> done, leaves at 5500.  5000: no-op.
    """
    reqs = make_requests([(0, 16, 100, 2500), (100, 16, 5)])
    sc = scenario(alpha=(0, 0, 0), beta=(1000, 0, 0), implementation=impl, async_scheduling=False, step_model="blis", max_num_running_reqs=1)
    m, steps = _run_logging_steps(sc, reqs)

    assert steps == [(0, 1), (1000, 2), (2000, 3), (2500, 4), (3000, 5), (3500, 6), (4000, 7),
                     (4500, 8), (5000, 8)]
    assert m.scheduling_delay == {"request_0": 0, "request_1": 2400}
    assert m.ttft["request_1"] == 3400
    assert m.e2e == {"request_1": 3400 + 4 * 1000}
    assert m.sim_ended_time == 5500
    assert m.step_samples == 8
    assert m.timed_out_requests == 1 and m.completed_requests == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_stale_step_with_nothing_to_do_is_a_no_op(impl):
    """A (t=0, 16 in, 100 out, deadline 1500): steps at 0, 1000 -> Step at 2000; timeout at
    1500 empties the instance; the step at 2000 fires, counts nothing and schedules nothing."""
    reqs = make_requests([(0, 16, 100, 1500)])
    m, steps = _run_logging_steps(scenario(alpha=(0, 0, 0), beta=(1000, 0, 0), implementation=impl, async_scheduling=False, step_model="blis"), reqs)
    assert steps == [(0, 1), (1000, 2), (2000, 2)]
    assert m.step_samples == 2
    # the stale step is still an instance event: it moves the instance clock
    assert m.sim_ended_time == 2000
    assert m.timed_out_requests == 1 and m.still_running == 0 and m.still_queued == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_stale_step_and_new_chain_at_the_same_tick_both_run(impl):
    """A (t=0, 16 in, 100 out, deadline 2500); B (t=3000, 16 in, 3 out).

    Steps at 0, 1000, 2000 (A) -> Step at 3000, stale after A's timeout at 2500.
    3000: B's Queued (instance priority 1) runs before the stale Step (priority 2); no step
          is pending, so it pushes a second Step at 3000, behind the stale one (FIFO).
    3000 (stale step): B prefill, TTFT 1000 -> Step at 4000.
    3000 (new chain):  B decode 1 (PI 17)    -> Step at 4000 (pushed second).
    4000 (first):  B decode 2 -> PI 18 >= 16+3-1: done, leaves at 5000.
    4000 (second): nothing left: a no-op.
    """
    reqs = make_requests([(0, 16, 100, 2500), (3000, 16, 3)])
    m, steps = _run_logging_steps(scenario(alpha=(0, 0, 0), beta=(1000, 0, 0), implementation=impl, async_scheduling=False, step_model="blis"), reqs)
    assert steps == [(0, 1), (1000, 2), (2000, 3), (3000, 4), (3000, 5), (4000, 6), (4000, 6)]
    assert m.ttft["request_1"] == 1000
    assert m.e2e == {"request_1": 1000 + 2 * 1000}
    assert m.sim_ended_time == 5000
    assert m.step_samples == 6


@pytest.mark.parametrize("impl", IMPLS)
def test_with_the_step_holding_the_engine_a_timeout_starts_no_second_chain(impl):
    """The first case above with ``step_model="vllm"`` (the default): the step running when A
    times out at 2500 holds the engine until 3000 and forms the next batch there.

    2600: B is queued; a step is pending (the one ending at 3000), so nothing starts.
    3000: B prefill (scheduling delay 400, TTFT 3000+1000-2600 = 1400) -> 4000.
    3700: C queued.  4000: B decode 1, C admitted (delay 300, TTFT 1300) -> 5000.
    5000: B decode 2, C decode 1 -> C done.  6000, 7000: B decodes 3, 4 -> done.
    8000: the step that held the engine after the last one finds nothing: a no-op.
    One chain: B's E2E is 1400 + 4 x 1000 (5000 with BLIS's two chains)."""
    reqs = make_requests([(0, 16, 100, 2500), (2600, 16, 5), (3700, 16, 2)])
    m, steps = _run_logging_steps(scenario(alpha=(0, 0, 0), beta=(1000, 0, 0), implementation=impl,
                                           async_scheduling=False, step_model="vllm"), reqs)
    assert steps == [(0, 1), (1000, 2), (2000, 3), (3000, 4), (4000, 5), (5000, 6), (6000, 7),
                     (7000, 8), (8000, 8)]
    assert m.timed_out_requests == 1 and m.completed_requests == 2
    assert m.scheduling_delay == {"request_0": 0, "request_1": 400, "request_2": 300}
    assert m.ttft == {"request_0": 1000, "request_1": 1400, "request_2": 1300}
    assert m.e2e == {"request_1": 5400, "request_2": 2300}
