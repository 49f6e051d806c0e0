"""Data-parallel ranks of one engine: lockstep for MoE models, independent ranks for dense
ones, the front door's rank choice (blis_simpy.engine.dp).

Every run here uses ``tests.engine.helpers.TinyLatency``, a hand-checkable latency model:

* ``step_time_us(view) = 1000 + 100 * (prefill tokens + decode tokens)`` µs, so the dummy
  batch of an idle rank (one decode token) takes 1100 µs;
* ``lockstep_step_time_us(views) = max over ranks of step_time_us (dummy for idle ranks) + 10``
  (a fixed 10 µs "collective"), so a test can tell the group's duration from one rank's;
* no queueing delay, no per-token or post-decode overhead; no admission/routing latency.

A request with input ``n`` and output ``L`` gets its first token in the step that computes
its last prompt token (TTFT = end of that step − arrival) and completes at the end of the
step in which its progress reaches ``n + max(L, 1) − 1``; E2E = TTFT + its ITL samples
(each the duration of one decode step).
"""

from __future__ import annotations

import pytest

from blis_simpy.engine.dp import DPEngine
from tests.engine.helpers import DENSE, MOE, build_dp, make_requests

IMPLS = ["reference", "fast"]


# A (t=100, 4 in, 3 out), B (t=500, 2 in, 2 out), C (t=10000, 1 in, 1 out)
SPECS = [(100, 4, 3), (500, 2, 2), (10_000, 1, 1)]


@pytest.mark.parametrize("impl", IMPLS)
def test_moe_ranks_step_in_lockstep(impl):
    """Two MoE ranks, one lockstep clock.

    t=100   A arrives; both ranks score 0 -> rank 0. The idle group wakes at 100.
            step 1: rank 0 prefills A (4 tokens: 1400), rank 1 is idle (dummy: 1100)
            D = max(1400, 1100) + 10 = 1410. A: TTFT = 100 + 1410 - 100 = 1410.
    t=500   B arrives; rank 0 scores 4*0 + 1 (A running) = 1, rank 1 scores 0 -> rank 1.
            The group is mid-step: B waits for the next lockstep step (no step of its own).
    t=1510  step 2: A decodes (1100), B prefills 2 tokens (1200): D = 1210.
            A: ITL 1210. B: TTFT = 1510 + 1210 - 500 = 2220.
    t=2720  step 3: both decode (1100 each): D = 1110. A reaches 4+3-1 = 6: done,
            E2E = 1410 + 1210 + 1110 = 3730 (ends 3830). B reaches 2+2-1 = 3: done,
            E2E = 2220 + 1110 = 3330 (ends 3830). The group goes idle.
    t=10000 C arrives; both ranks score 0 -> rank 0. step 4: C prefills 1 token (1100),
            rank 1 dummy (1100): D = 1110. C: TTFT = E2E = 1110 (one output token).
    Four lockstep steps; rank 1 ran the dummy batch twice (steps 1 and 4).
    """
    sim = build_dp(MOE, impl=impl, requests=make_requests(SPECS))
    (engine,) = sim.engines
    group = engine.lockstep
    assert group is not None
    res = sim.run()
    r0, r1 = res.instances
    assert (r0.instance_id, r0.dp_engine, r0.dp_rank) == ("instance_0", 0, 0)
    assert (r1.instance_id, r1.dp_engine, r1.dp_rank) == ("instance_1", 0, 1)
    assert r0.ttft == {"request_0": 1410, "request_2": 1110}
    assert r0.e2e == {"request_0": 3730, "request_2": 1110}
    assert r1.ttft == {"request_1": 2220}
    assert r1.e2e == {"request_1": 3330}
    assert r0.completion_time == {"request_0": 3830, "request_2": 11_110}
    assert r1.completion_time == {"request_1": 3830}
    assert dict(r0.all_itls) == {1210: 1, 1110: 1}
    assert dict(r1.all_itls) == {1110: 1}
    assert (group.steps, group.dummy_rank_steps) == (4, 2)
    # idle ranks do no bookkeeping: rank 1 counted only the two steps it had work in
    assert [i.step_count for i in sim.instances] == [4, 2]
    assert (r0.sim_ended_time, r1.sim_ended_time) == (11_110, 3830)


@pytest.mark.parametrize("impl", IMPLS)
def test_dense_ranks_step_independently(impl):
    """The same requests on a dense model: the ranks share only the front door.

    rank 0: A at 100 (prefill 1400: TTFT 1400), 1500 (decode 1100), 2600 (decode 1100):
            done at 3700, E2E 3600. C at 10000: 1100 -> TTFT = E2E = 1100.
    rank 1: B placed there at 500 (rank 0 scores 1): steps at 500 (prefill 2: 1200,
            TTFT 1200) and 1700 (decode 1100): done at 2800, E2E 2300 — rank 1 steps at
            500, not on rank 0's clock, and nobody pays for dummy batches or the +10.
    """
    sim = build_dp(DENSE, impl=impl, requests=make_requests(SPECS))
    assert sim.engines[0].lockstep is None
    res = sim.run()
    r0, r1 = res.instances
    assert r0.ttft == {"request_0": 1400, "request_2": 1100}
    assert r0.e2e == {"request_0": 3600, "request_2": 1100}
    assert r1.ttft == {"request_1": 1200}
    assert r1.e2e == {"request_1": 2300}
    assert r1.completion_time == {"request_1": 2800}


def test_arrival_during_queueing_delay_counts_as_waiting_and_joins_the_group_step():
    """Three MoE ranks; X (t=0, 8 in, 4 out), Y and Z (both t=0, 2 in, 1 out).

    All arrive at t=0 and pass the front door before any is queued: X -> rank 0 (all 0),
    Y -> rank 1 (rank 0 scores 4: X waits in the queueing delay), Z -> rank 2.
    step 1 at 0: prefills of 8, 2, 2 tokens: 1800, 1200, 1200 -> D = 1810.
    X: TTFT 1810; Y, Z: TTFT = E2E = 1810 (done: one output token).
    steps 2..4 at 1810, 2920, 4030: X decodes (1100) while ranks 1 and 2 run dummies
    (1100): D = 1110 each. X: E2E = 1810 + 3 * 1110 = 5140.
    """
    sim = build_dp(MOE, dp=3, requests=make_requests([(0, 8, 4), (0, 2, 1), (0, 2, 1)]))
    res = sim.run()
    assert [m.ttft for m in res.instances] == [{"request_0": 1810}, {"request_1": 1810},
                                              {"request_2": 1810}]
    assert [m.e2e for m in res.instances] == [{"request_0": 5140}, {"request_1": 1810},
                                             {"request_2": 1810}]
    g = sim.engines[0].lockstep
    assert (g.steps, g.dummy_rank_steps) == (4, 6)


def test_ranks_have_their_own_limits_and_kv_pool():
    """max_num_running_reqs = 1 is per rank: with dp 2, two requests run at once (one per
    rank); each rank has its own KV cache of the deployment's block count."""
    sim = build_dp(MOE, requests=make_requests([(0, 16, 2), (0, 16, 2)]), max_num_running_reqs=1,
                kv_blocks=7)
    a, b = sim.instances
    assert a.kv is not b.kv and a.kv.total_blocks == b.kv.total_blocks == 7
    assert a.limits.max_num_running_reqs == b.limits.max_num_running_reqs == 1
    res = sim.run()
    # both prefilled in step 1 (16 tokens each: 2600, D 2610), decoded in step 2 (1110)
    assert [m.e2e for m in res.instances] == [{"request_0": 3720}, {"request_1": 3720}]


# ------------------------------------------------------------------------ front door
class _Rank:
    def __init__(self, delayed: int, queued: int, running: int):
        self.in_queueing_delay = delayed
        self.waitq = [None] * queued
        self.running = [None] * running


def _door(*loads) -> DPEngine:
    door = DPEngine.__new__(DPEngine)
    door.ranks = [_Rank(*ld) for ld in loads]
    return door


@pytest.mark.parametrize(("loads", "winner"), [
    # (in queueing delay, queued, running) per rank -> the rank the front door picks
    (((0, 0, 5), (0, 1, 0), (0, 0, 3)), 2),   # scores 5, 4, 3
    (((0, 1, 0), (0, 0, 3)), 1),              # one waiting (4) loses to three running (3)
    (((1, 0, 0), (0, 0, 3)), 1),              # a request in the queueing delay waits too
    (((1, 0, 0), (0, 0, 4)), 0),              # 4 vs 4: tie -> the lower rank
    (((0, 0, 2), (0, 0, 2), (0, 0, 2)), 0),   # all equal -> rank 0
    (((0, 0, 1), (0, 0, 0), (0, 0, 0)), 1),   # two idle ranks -> the lower one
    (((0, 2, 0), (1, 0, 4)), 0),              # 8 vs 4 + 4 = 8: tie -> rank 0
])
def test_front_door_picks_the_least_loaded_rank(loads, winner):
    """vLLM's DP load balancing: smallest 4 * waiting + running, ties to the lowest rank;
    which rank the cluster's router chose does not matter."""
    door = _door(*loads)
    for routed in door.ranks:
        assert door.pick(routed) is door.ranks[winner]
