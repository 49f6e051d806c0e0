"""Recompute preemption: vLLM v1's model (default) and BLIS's (``preemption_model: blis``).

The hand-checked case. Blackbox latency with no queueing delay, OTPT 50 µs, step =
1000 + 10 · prefill tokens + 5 · decode tokens. KV cache: 4 blocks of 4 tokens. Two
requests arrive at 0, each with a 4-token prompt and 8 output tokens (a request completes
when pi reaches 4 + 8 − 1 = 11).

* Step 1 [0, 1080): both prompts (8 tokens), one block each. TTFT = 1080 + 50 = 1130.
* Steps 2–5 (1010 µs each, two decode tokens): ends 2090, 3100, 4110, 5120; each decode
  opens a second block in step 2; ITL 1060. Both are at pi 8, having emitted 5 tokens.
* Step 6 at 5120: request_0 needs a third block, none is free: the tail, request_1, is
  preempted at pi P = 8 (its blocks freed; its prompt block keeps its hash). No admission
  in a step that preempted. request_0 decodes alone: 1005 µs, ITL 1055.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from blis_simpy.engine.limits import EngineLimits
from blis_simpy.run.simulation import Simulation
from tests.engine.helpers import make_requests, scenario
from tests.engine.test_fast_vs_reference import preemption_heavy

IMPLS = ["reference", "fast"]


class _Recorder:
    """Wraps a latency model and records each step's batch entries."""

    def __init__(self, inner, log):
        self.inner, self.log = inner, log

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step_time_us(self, batch):
        self.log.append(list(batch.entries()))
        return self.inner.step_time_us(batch)


def _tiny(impl: str, model: str):
    sc = scenario(alpha=(0, 0, 50), implementation=impl, block_size=4, total_kv_blocks=4,
                  preemption_model=model)
    sim = Simulation(sc, make_requests([(0, 4, 8), (0, 4, 8)]))
    log: list = []
    sim.instances[0].latency = _Recorder(sim.instances[0].latency, log)
    return sim.run().instances[0], log, sim.instances[0].metrics.registry["request_1"]


@pytest.mark.parametrize("impl", IMPLS)
def test_vllm_recomputes_prompt_and_outputs_as_a_prefill(impl):
    """Steps 7–8 (1005 µs): request_0 decodes to pi 11 and completes at 8135; request_1
    cannot be readmitted (its cached prompt block + 2 fresh blocks > the 0 free).
    Step 9 at 8135: request_1 recomputes P + 1 = 9 tokens (prompt + its 5 outputs): its
    prompt block is a prefix-cache hit, 5 tokens are prefilled (1000 + 50 = 1050 µs);
    reaching pi 9 emits its 6th token at 9185, ITL = 9185 − 5120 + 50 = 4115 (the gap since
    its 5th token, plus OTPT as every sample). Steps 10–11 (1005 µs) decode to pi 11: done
    at 11195 with 8 tokens emitted in all."""
    m, log, r1 = _tiny(impl, "vllm")
    assert m.preemption_count == 1
    assert log[8] == [(True, 0, 5, 4)]              # one prefill chunk of 5 after 4 cached
    assert log[9] == [(False, 9, 1, 4)]             # then it decodes from pi 9
    assert m.cache_hit_rate == 1 / 8                # its prompt block; 7 blocks were fresh
    assert m.ttft == {"request_0": 1130, "request_1": 1130}        # not overwritten
    assert m.scheduling_delay == {"request_0": 0, "request_1": 0}  # the first scheduling
    assert m.sim_ended_time == 11195
    # E2E = TTFT + the ITL samples: the last step's end plus one OTPT per token (8 x 50)
    assert m.e2e == {"request_0": 1130 + 4 * 1060 + 3 * 1055,
                     "request_1": 1130 + 4 * 1060 + 4115 + 2 * 1055}
    assert m.e2e["request_1"] == 11195 + 8 * 50 == m.completion_time["request_1"]
    assert m.itl["request_1"] == (4 * 1060 + 4115 + 2 * 1055) / 7
    assert dict(m.all_itls) == {1060: 8, 1055: 5, 4115: 1}
    assert m.total_output_tokens == 7 + 7           # L - 1 each: no token emitted twice
    assert m.step_counters_sum == (8 - 1) + (11 - 1)
    if impl == "reference":
        assert r1.itl == [1060, 1060, 1060, 1060, 4115, 1055, 1055]
    assert r1.first_itl_us == 1060


@pytest.mark.parametrize("impl", IMPLS)
def test_blis_regenerates_outputs(impl):
    """BLIS: request_1 restarts at pi 0. Step 7 at 6125: its 4-token prompt is fully cached,
    so it is admitted with no new token (docs/engine.md) and reaches pi 4 at 7130: a second
    TTFT 7180 and scheduling delay 6125 overwrite the first. It then decodes all 7 tokens
    again (step 8: 1010 µs with request_0's last; steps 9–14: 1005 µs alone), keeping its 4
    earlier ITL samples: 11 samples, done at 8140 + 6 · 1005 = 14170."""
    m, log, r1 = _tiny(impl, "blis")
    assert m.preemption_count == 1
    assert log[6] == [(False, 9, 1, 4), (True, 0, 0, 4)]
    assert m.ttft == {"request_0": 1130, "request_1": 7180}
    assert m.scheduling_delay == {"request_0": 0, "request_1": 6125}
    assert m.sim_ended_time == 14170
    assert m.e2e == {"request_0": 1130 + 4 * 1060 + 2 * 1055 + 1060,
                     "request_1": 7180 + 5 * 1060 + 6 * 1055}
    assert m.itl["request_1"] == (5 * 1060 + 6 * 1055) / 7        # 11 samples over L - 1
    assert m.total_output_tokens == 7 + 11
    assert m.step_counters_sum == (8 - 1) + (14 - 7)
    if impl == "reference":
        assert r1.itl == [1060] * 5 + [1055] * 6


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=preemption_heavy())
def test_vllm_every_request_emits_each_token_once(w):
    """Under vllm every completed request has exactly L − 1 ITL samples, whatever its
    preemptions, and E2E = TTFT + its samples (no post-decode overhead here)."""
    specs, groups, engine, seed = w
    for impl in IMPLS:
        reqs = make_requests(specs, seed=seed, prefixes=groups)
        m = Simulation(scenario(implementation=impl, **engine), reqs).run().instances[0]
        assert m.completed_requests == len(specs)
        need = sum(r.output_len - 1 for r in reqs)
        assert m.total_output_tokens == need == sum(m.all_itls.values())
        for r in reqs:
            assert m.e2e[r.id] == m.completion_time[r.id] - r.arrival_us
            assert m.scheduling_delay[r.id] < m.ttft[r.id] == r.ttft_us
            if impl == "reference":
                assert len(r.itl) == r.output_len - 1
                assert m.e2e[r.id] == r.ttft_us + sum(r.itl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("model", ["vllm", "blis"])
def test_a_recompute_longer_than_the_cache_is_dropped(impl, model):
    """3 blocks of 4 tokens. request_0 (4-token prompt, group g) finishes at once and leaves
    its block cached. At 100 ms request_1 (the same 4 tokens) is fully cached, so it is
    admitted with no new token and no KV (docs/engine.md); request_2 (12-token prompt) takes
    all 3 blocks and emits its first token at pi 12. Next step request_1 needs a block:
    request_2 is preempted at pi 12. Under vllm its recompute needs 13 tokens = 4 blocks,
    more than the cache: it is dropped as unservable instead of waiting forever (with no
    horizon the engine would step for ever). Under blis it restarts, is alone once request_1
    is done, and is dropped when it needs a 4th block."""
    reqs = make_requests([(0, 0, 1, 0, "g"), (100_000, 0, 3, 0, "g"), (100_000, 12, 5)],
                         prefixes={"g": 4})
    sc = scenario(alpha=(0, 0, 0), implementation=impl, block_size=4, total_kv_blocks=3,
                  preemption_model=model)
    m = Simulation(sc, reqs, horizon_us=10_000_000).run().instances[0]
    assert (m.completed_requests, m.dropped_unservable, m.still_queued) == (2, 1, 0)
    assert m.preemption_count == (1 if model == "vllm" else 2)
    assert set(m.ttft) == {"request_0", "request_1"}
    assert m.step_samples == (4 if model == "vllm" else 6)


def test_preemption_model_is_checked():
    assert EngineLimits().preemption_model == "vllm"
    with pytest.raises(ValueError, match="preemption model"):
        EngineLimits(preemption_model="sglang")
