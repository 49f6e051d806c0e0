"""Hooks see the same, materialised request state under both ledgers.

The fast engine advances decoding requests lazily (engine/lazy_ledger.py): between steps
their stored ``pi``, ``kv_len`` and ITL samples lag behind. An ``on_step_end`` hook must
not see that: an instance whose hook is overridden has every running and completed request
brought up to date before the hook runs, so a hook summing request progress sees exactly
what it sees on the reference engine (eager ledger) — and observing must not change any
result.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_simpy.engine.fast import FastInstance
from blis_simpy.engine.instance import Instance
from blis_simpy.run.simulation import Simulation
from tests.engine.helpers import make_requests, scenario
from tests.engine.test_fast_vs_reference import FIELDS, preemption_heavy, workloads


def _state(r) -> tuple:
    return (r.id, r.state, r.pi, r.kv_len, r.num_new_tokens, r.computed_tokens, len(r.itl),
            sum(r.itl), r.ttft_set)


class ReferenceProgress(Instance):
    """Records, at the end of every step, each running and completed request's progress
    and the sums a progress hook would compute (pi, output tokens, ITL samples)."""

    def on_step_end(self, now_us: int, step_us: int, completed: list) -> None:
        reqs = [*self.running, *completed]
        if not hasattr(self, "seen"):
            self.seen = []
        self.seen.append((now_us, step_us, sum(r.pi for r in reqs),
                          sum(max(r.pi - r.input_len, 0) for r in reqs),
                          sum(len(r.itl) for r in reqs),
                          [_state(r) for r in self.running], [_state(r) for r in completed]))


class FastProgress(FastInstance):
    on_step_end = ReferenceProgress.on_step_end


def _observe(cls, specs, groups, engine, seed, horizon):
    sim = Simulation(scenario(**engine), make_requests(specs, seed=seed, prefixes=groups),
                     horizon_us=horizon, instance_class=cls)
    res = sim.run()
    return getattr(sim.instances[0], "seen", []), res.instances[0]


def test_a_progress_hook_sees_every_decode_step_on_the_fast_engine():
    """One request, 4 prompt tokens, 4 outputs (it completes at pi 4 + 4 - 1 = 7): step 1
    prefills (pi 4, first token), steps 2-3 decode (pi 5, 6: one ITL sample each), step 4
    decodes to pi 7 and completes. Every step: 1000 + 10 * 4 or 1000 + 5 µs."""
    for cls in (ReferenceProgress, FastProgress):
        seen, m = _observe(cls, [(0, 4, 4)], {}, {"alpha": (0, 0, 0)}, 1, None)
        assert [(s[0], s[2], s[3], s[4]) for s in seen] == [
            (0, 4, 0, 0), (1040, 5, 1, 1), (2045, 6, 2, 2), (3050, 7, 3, 3)], cls
        assert [s[5] for s in seen][1:3] == [[("request_0", 1, 5, 5, 1, 5, 1, 1005, True)],
                                            [("request_0", 1, 6, 6, 1, 6, 2, 2010, True)]]
        assert seen[3][6] == [("request_0", 2, 7, 0, 1, 7, 3, 3015, True)]   # KV released
        assert m.completed_requests == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_hooks_see_identical_state_under_both_ledgers(w):
    specs, groups, engine, seed, horizon = w
    ref_seen, ref_m = _observe(ReferenceProgress, specs, groups, engine, seed, horizon)
    fast_seen, fast_m = _observe(FastProgress, specs, groups, engine, seed, horizon)
    assert len(fast_seen) == len(ref_seen)
    for i, (f, r) in enumerate(zip(fast_seen, ref_seen, strict=True)):
        assert f == r, f"step {i} differs"
    # observing changes no result: the fast engine without the hook gives the same metrics
    plain = Simulation(scenario(**engine), make_requests(specs, seed=seed, prefixes=groups),
                       horizon_us=horizon).run().instances[0]
    for f in FIELDS:
        assert getattr(fast_m, f) == getattr(plain, f) == getattr(ref_m, f), f


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=preemption_heavy(), model=st.sampled_from(["vllm", "blis"]))
def test_hooks_see_identical_state_under_preemption(w, model):
    """Preempted requests leave the batch materialised and come back recomputing."""
    specs, groups, engine, seed = w
    engine = {**engine, "preemption_model": model}
    ref_seen, _ = _observe(ReferenceProgress, specs, groups, engine, seed, None)
    fast_seen, _ = _observe(FastProgress, specs, groups, engine, seed, None)
    assert fast_seen == ref_seen
