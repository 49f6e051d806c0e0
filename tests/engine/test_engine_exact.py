"""Tiny cases worked out by hand: exact integer-µs times through the whole engine.

Latency model for all cases (blackbox, docs/latency-models.md):
    queueing = 100 + 1.0 * input_len     (α0, α1)
    OTPT     = 50                        (α2)
    step     = 1000 + 10 * prefill tokens + 5 * decode tokens   (β0, β1, β2)
Block size 16 unless stated. Both engine implementations must give the same numbers.
"""

from __future__ import annotations

import pytest

from tests.engine.helpers import make_requests, run, scenario

IMPLS = ["reference", "fast"]


@pytest.mark.parametrize("impl", IMPLS)
def test_single_request_timeline(impl):
    # arrival 0, 32 prompt tokens, 3 output tokens.
    # Queued at 0 + 100 + 32 = 132 -> Step 1 at 132: prefill 32 tokens, step 1000 + 320 = 1320.
    #   TTFT = 132 + 1320 + 50 = 1502.
    # Step 2 at 1452: one decode token, 1000 + 5 = 1005 -> ITL 1055 (pi 33).
    # Step 3 at 2457: decode, pi 34 = 32 + 3 - 1 -> complete; RequestLeft at 3462.
    # E2E = 1502 + 2 * 1055 = 3612.
    res = run(scenario(implementation=impl), make_requests([(0, 32, 3)]))
    m = res.instances[0]
    assert m.ttft == {"request_0": 1502}
    assert m.scheduling_delay == {"request_0": 132}
    assert m.e2e == {"request_0": 3612}
    assert m.completion_time == {"request_0": 3612}
    assert m.itl == {"request_0": 1055.0}
    assert dict(m.all_itls) == {1055: 2}
    assert m.total_output_tokens == 2          # BLIS counts decode steps only (L - 1)
    assert m.total_input_tokens == 32
    assert m.sim_ended_time == 3462
    # 2 prompt blocks + 1 decode block, all fresh: hit rate 0; the peak is 3 blocks.
    assert m.peak_kv_blocks == 3 and m.cache_hit_rate == 0.0
    # KV integral: 2 blocks during step 1 (1320 us), 3 during steps 2 and 3 (1005 us each)
    assert m.kv_blocks_integral == 2 * 1320 + 3 * 1005 + 3 * 1005


@pytest.mark.parametrize("impl", IMPLS)
def test_prefix_cache_hit_skips_cached_tokens(impl):
    # Two requests share a 32-token prefix (2 full blocks); the second has 16 own tokens
    # and arrives long after the first finished, so both prefix blocks are cache hits.
    # Request 1: input 48 -> queued at 100000 + 100 + 48 = 100148; only 16 uncached tokens:
    #   step 1000 + 160 = 1160 -> TTFT = 148 + 1160 + 50 = 1358; L = 1 completes at once.
    reqs = make_requests([(0, 0, 1, 0, "p"), (100_000, 16, 1, 0, "p")], prefixes={"p": 32})
    m = run(scenario(implementation=impl), reqs).instances[0]
    assert m.ttft["request_1"] == 1358
    assert m.e2e["request_1"] == 1358         # one output token: no ITL, no post-decode
    # request_0: 2 prompt blocks + its output-token block (misses); request_1: 2 hits, then
    # one fresh block for its 16 own tokens and one for its output token.
    assert (m.cache_hit_rate) == pytest.approx(2 / 7)


@pytest.mark.parametrize("impl", IMPLS)
def test_chunked_prefill_by_threshold(impl):
    # 100-token prompt, long-prefill threshold 40: chunks 40, 40, 20.
    # queued at 200; steps at 200 (1400), 1600 (1400), 3000 (1200) -> TTFT 3000+1200+50-0.
    sc = scenario(implementation=impl, long_prefill_token_threshold=40)
    m = run(sc, make_requests([(0, 100, 1)])).instances[0]
    assert m.ttft["request_0"] == 4250
    assert m.step_samples == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_token_budget_splits_prefill(impl):
    # Budget 64 tokens per step, 150-token prompt: chunks 64, 64, 22.
    # queued at 250; steps: 250 (1640), 1890 (1640), 3530 (1220) -> TTFT = 4750 + 50 = 4800.
    sc = scenario(implementation=impl, max_num_scheduled_tokens=64)
    m = run(sc, make_requests([(0, 150, 1)])).instances[0]
    assert m.ttft["request_0"] == 4800


@pytest.mark.parametrize("impl", IMPLS)
def test_timeout_while_decoding(impl):
    # Same timeline as the single-request case, with a deadline at 2000 us: the request
    # has its TTFT (1502) and is decoding when the deadline fires. It is not completed.
    res = run(scenario(implementation=impl), make_requests([(0, 32, 3, 2000)]))
    m = res.instances[0]
    assert m.timed_out_requests == 1 and m.completed_requests == 0
    assert m.ttft == {"request_0": 1502} and m.e2e == {}
    # the pending step at 2457 still fires (never cancelled) and finds nothing to do
    assert m.sim_ended_time == 2457


@pytest.mark.parametrize("impl", IMPLS)
def test_max_model_len_guards(impl):
    # M = 64: input 64 has no room for output; 40 + 30 > 64 is too long; 40 + 24 fits.
    reqs = make_requests([(0, 64, 1), (10, 40, 30), (20, 40, 24)])
    m = run(scenario(implementation=impl, max_model_len=64), reqs).instances[0]
    assert m.dropped_unservable == 2
    assert set(m.registry) == {"request_2"}
    assert m.completed_requests == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_length_cap_when_budget_auto_filled(impl):
    # max_output_len 0 means "no client budget": it is auto-filled to M - input = 24, but
    # the pre-sampled output is longer (40), so the request is force-completed at pi = M - 1.
    reqs = make_requests([(0, 40, 40)])
    reqs[0].max_output_len = 0
    m = run(scenario(implementation=impl, max_model_len=64), reqs).instances[0]
    assert m.length_capped_requests == 1 and m.completed_requests == 1
    # decode steps take pi from 40 to M - 1 = 63: 23 ITL samples (BLIS: M - 1 - input)
    assert m.total_output_tokens == 23
    assert sum(m.all_itls.values()) == 23


@pytest.mark.parametrize("impl", IMPLS)
def test_running_cap_queues_the_rest(impl):
    # Cap 1: the second request waits for the first to finish before it is scheduled.
    # request_0 (input 16, 2 outputs): queued 116; steps at 116 (1160), 1276 (1005) -> done,
    # its completion step ends at 2281, where request_1 (queued at 216) is admitted.
    sc = scenario(implementation=impl, max_num_running_reqs=1)
    m = run(sc, make_requests([(0, 16, 2), (100, 16, 2)])).instances[0]
    assert m.scheduling_delay == {"request_0": 116, "request_1": 2281 - 100}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_async_scheduling_admits_one_step_later(impl, async_scheduling):
    # Every step lasts 1000 µs (β0 only; no queueing delay or OTPT). A arrives at 0 on an idle
    # engine: step 0-1000 prefills it (TTFT 1000), then it decodes 1000-2000, 2000-3000, ...
    # B is queued at 1500, while step 1000-2000 runs.
    #   synchronous (BLIS): the step at 2000 admits it -> first token at 3000: TTFT 1500.
    #   async (vLLM): the step at 2000 was chosen when the step before it started (1000), before
    #     B was queued; the step at 3000 (chosen at 2000) admits it -> first token 4000: TTFT 2500.
    # C arrives at 100000 on an idle engine: admitted at once either way (TTFT 1000).
    sc = scenario(alpha=(0.0, 0.0, 0.0), beta=(1000.0, 0.0, 0.0), implementation=impl,
                  async_scheduling=async_scheduling)
    m = run(sc, make_requests([(0, 16, 10), (1500, 16, 2), (100_000, 16, 2)])).instances[0]
    assert m.ttft["request_0"] == 1000 and m.ttft["request_2"] == 1000
    assert m.ttft["request_1"] == (2500 if async_scheduling else 1500)
    assert m.scheduling_delay["request_1"] == (1500 if async_scheduling else 500)
    # A decodes every step either way: 9 more tokens, one per 1000 µs
    assert m.e2e["request_0"] == 10_000
