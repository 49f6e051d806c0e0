"""vLLM's CPU KV offload tier (docs/kv-cache.md, "CPU offload (vLLM OffloadingConnector)").

Engine timelines are worked out by hand. Unless a test says otherwise: 8 GPU blocks of 16
tokens; blackbox latency with queueing = 100 + input tokens, OTPT = 50 µs and a step of
1000 + 10 per prefill token + 5 per decode token; the CPU tier holds 100 blocks of
100,000 bytes moved at 1 GB/s (100 µs a block) plus 10 µs per transfer job, so a job of
``n`` blocks takes ``10 + 100 n`` µs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.resolve import Deployment, resolve
from blis_simpy.errors import ConfigError
from blis_simpy.kv.cache import KVCache
from blis_simpy.kv.offload import STORING, OffloadKVCache, offload_blocks
from blis_simpy.latency.blackbox import BlackboxModel
from blis_simpy.request import QUEUED, Request
from blis_simpy.run.simulation import Simulation

IMPLS = ["reference", "fast"]
ALPHA, BETA = [100.0, 1.0, 50.0], [1000.0, 10.0, 5.0]


def _params(cpu=100, block_bytes=100_000, gbps=1.0, latency=10):
    return OffloadKVCache.Params(cpu_blocks=cpu, block_bytes=block_bytes, link_gbps=gbps,
                                 link_latency_us=latency)


def _run(impl, requests, *, total=8, bs=16, cpu=100, plain=False, **engine):
    sc = Scenario(model="test/model", latency={"model": "blackbox", "alpha_coeffs": ALPHA,
                                               "beta_coeffs": BETA},
                  engine={"total_kv_blocks": total, "block_size": bs, "implementation": impl, **engine})
    kvs = []

    def kv_factory(n, b):
        kvs.append(KVCache(n, b) if plain else OffloadKVCache(n, b, params=_params(cpu)))
        return kvs[-1]

    dep = Deployment(total_kv_blocks=total, block_size=bs, max_model_len=0,
                     latency_factory=lambda: BlackboxModel(ALPHA, BETA), kv_factory=kv_factory)
    sim = Simulation(sc, requests, deployment=dep)
    res = sim.run()
    return res.instances[0], kvs[0], sim.instances[0]


def _prefix_then_flood(rng, c_arrival=9000, c_tail=16, extra=()):
    """A (t=0): prompt P of 32 tokens, 1 output. B (t=2000): 128 tokens, no output — it takes
    all 8 GPU blocks, so P leaves the GPU. C: P + ``c_tail`` tokens, 1 output."""
    P = rng.integers(0, 1000, 32)
    reqs = [Request("request_0", 0, P, [1]),
            Request("request_1", 2000, rng.integers(0, 1000, 128), []),
            Request("request_2", c_arrival, np.concatenate((P, rng.integers(0, 1000, c_tail))), [2]),
            *extra]
    reqs.sort(key=lambda r: r.arrival_us)
    return reqs, P


# =========================================================================== unit: the tier
def test_transfer_time_is_latency_plus_bytes_over_bandwidth_rounded_up():
    kv = OffloadKVCache(8, 16, params=_params(block_bytes=100_000, gbps=1.0, latency=10))
    assert [kv.transfer_us(n) for n in (1, 2, 8)] == [110, 210, 810]
    # 3 bytes at 0.7 GB/s (700 B/µs): 3/700 µs rounds up to 1; exact, no float error
    odd = OffloadKVCache(8, 16, params=_params(block_bytes=3, gbps=0.7, latency=0))
    assert odd.transfer_us(1) == 1 and odd.transfer_us(700) == 3
    # 0.1 GB/s = 100 B/µs: 100 blocks of 100 B are exactly 100 µs (a float quotient gives 100.000...01)
    tenth = OffloadKVCache(8, 16, params=_params(block_bytes=100, gbps=0.1, latency=0))
    assert tenth.transfer_us(100) == 100


def test_sizing_from_gib_is_vllm_cpu_offloading_spec():
    """int(G x 2^30) // (block bytes on one GPU x TP)."""
    assert offload_blocks(4.0, 2 * 16 * 8 * 128 * 2 * 32, 1) == 2048      # Llama-3.1-8B, 4 GiB
    assert offload_blocks(0.001, 4096, 2) == 1_073_741 // 8192 == 131
    assert offload_blocks(1e-9, 4096, 1) == 0


def _req(rid, tokens):
    return Request(rid, 0, np.asarray(tokens), [])


def test_stores_follow_the_lru_and_evict_only_ready_unpinned_blocks():
    """Block size 4, CPU tier of 3 blocks. R1 (3 blocks) is stored at t=100 (job: 10 + 3 x 1
    = 13 µs: done 113). R2's 2 blocks, offered at 150, find R1's still being stored: refused.
    Offered again at 250, they evict the LRU head: R1's last block (R1's blocks were touched
    first-block-most-recent), then its second."""
    kv = OffloadKVCache(16, 4, params=_params(cpu=3, block_bytes=1000, gbps=1.0, latency=10))
    r1 = _req("r1", range(12))
    assert kv.allocate(r1, 0, 12)
    kv.end_step(0, 100)
    h1 = [kv.block_hash[b] for b in r1.kv_blocks]
    assert list(kv.cpu) == h1[::-1] and set(kv.cpu.values()) == {STORING}
    r2 = _req("r2", range(100, 108))
    assert kv.allocate(r2, 0, 8)
    kv.end_step(100, 150)              # R1's job not done at 100: nothing evictable
    assert kv.stats["stores_refused"] == 1 and list(kv.cpu) == h1[::-1]
    h2 = [kv.block_hash[b] for b in r2.kv_blocks]
    kv.end_step(200, 250)              # offered again after the next step: R1 is ready now
    assert kv.stats["cpu_evictions"] == 2 and list(kv.cpu) == [h1[0], h2[1], h2[0]]
    assert kv.stats["store_jobs"] == 2 and kv.stats["stored_blocks"] == 5
    assert kv._store_jobs[-1][0] == 250 + 10 + 2   # queued at the step's end
    kv.end_step(300, 350)              # nothing new filled: nothing offered
    assert kv.stats["store_jobs"] == 2
    kv.check_invariants()


def test_lookup_counts_ready_blocks_after_the_gpu_hit_and_a_load_pins_them():
    kv = OffloadKVCache(16, 4, params=_params(cpu=10, block_bytes=1000, gbps=1.0, latency=10))
    owner = _req("owner", range(12))
    kv.allocate(owner, 0, 12)
    kv.end_step(0, 10)                 # stored at 10: done 10 + 10 + 3 = 23
    owner.state = 2
    kv.release(owner)
    reader = _req("reader", list(range(12)) + [99])
    kv.advance(22)
    assert kv.lookup(reader, 0) == 0   # still being stored
    kv.advance(23)
    assert kv.lookup(reader, 0) == 3 and kv.lookup(reader, 1) == 2
    assert kv.start_load(reader, [], 3, 30)
    assert kv._loads[reader][0] == 30 + 13 and set(kv.cpu.values()) == {1}
    assert kv.waiting_for_load(reader, 42) and not kv.waiting_for_load(reader, 43)
    other = _req("other", list(range(12)) + [7])
    assert kv.lookup(other, 0) == -1   # its hit blocks are being loaded: delayed
    assert kv.next_load_done_us(30) == 43
    kv.advance(43)
    assert set(kv.cpu.values()) == {0} and kv.lookup(other, 0) == 3
    assert kv.loaded_tokens(reader) == 12
    assert kv.get_cached_blocks(other) == reader.kv_blocks   # registered on the GPU now
    kv.check_invariants()


def test_a_preempted_request_makes_its_step_wait_for_its_stores():
    """vLLM's handle_preemptions: the step waits for the victim's in-flight store jobs, whose
    blocks then count as stored."""
    kv = OffloadKVCache(16, 4, params=_params(cpu=10, block_bytes=1000, gbps=1.0, latency=10))
    r = _req("r", range(8))
    kv.allocate(r, 0, 8)
    kv.end_step(0, 100)                # job done at 100 + 12 = 112
    kv.advance(105)
    r.state = QUEUED
    kv.release(r)
    assert kv.consume_pending_transfer_latency() == 7 and kv.consume_pending_transfer_latency() == 0
    assert set(kv.cpu.values()) == {0} and kv.stats["flush_stall_us"] == 7
    assert kv._next_store[r] == 2      # kept: its blocks are not offered again


# =========================================================================== through the engine
@pytest.mark.parametrize("impl", IMPLS)
def test_a_prefix_evicted_from_the_gpu_is_loaded_back_from_the_cpu(impl):
    """A: queued at 132, prefill 1320 µs -> TTFT 1502; its 2 prompt blocks are stored after
    that step (job 210 µs: ready at 1662). B (queued at 2228) takes all 8 GPU blocks, A's
    prompt blocks among them. C (t=9000, 48 tokens) is queued at 9148: no GPU hit, 2 CPU
    hits -> their load (210 µs) lands at 9358; nothing else runs, so the next step is at
    9358: C prefills [32, 48), 1000 + 160 = 1160 µs -> TTFT = 9358 + 1160 + 50 - 9000 = 1568
    (recomputing all 48 tokens would give 1480 + 148 + 50 = 1678)."""
    reqs, _ = _prefix_then_flood(np.random.default_rng(7))
    m, kv, _ = _run(impl, reqs)
    assert (m.ttft["request_0"], m.ttft["request_1"], m.ttft["request_2"]) == (1502, 2558, 1568)
    st = kv.offload_stats()
    assert (st["loads"], st["loaded_blocks"], st["loaded_tokens"], st["load_wait_us"]) == (1, 2, 32, 210)
    # stores: A 2, B 8, C its one computed block (the loaded ones are not stored again)
    assert (st["store_jobs"], st["stored_blocks"], st["cpu_evictions"]) == (3, 11, 0)
    assert kv.cache_hits == 0 and m.completed_requests == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_a_whole_prompt_loaded_recomputes_its_last_token(impl):
    """C = P exactly (32 tokens), queued at 9132; the load lands at 9342; vLLM recomputes
    the last token (num_computed_tokens = 31): 1000 + 10 -> TTFT = 9342 + 1010 + 50 - 9000
    = 1402."""
    reqs, _ = _prefix_then_flood(np.random.default_rng(7), c_tail=0)
    m, kv, _ = _run(impl, reqs)
    assert m.ttft["request_2"] == 1402
    assert kv.offload_stats()["stored_blocks"] == 10     # C filled nothing new


@pytest.mark.parametrize("impl", IMPLS)
def test_a_prefix_evicted_from_the_cpu_too_is_recomputed(impl):
    """A CPU tier of 8 blocks: B's 8 blocks evict A's 2 (ready since 1662) at B's step end.
    C finds nothing: it recomputes its 48 tokens, TTFT = 9148 + 1480 + 50 - 9000 = 1678.
    LRU order: B's blocks were touched first-block-most-recent, so C's 3 stored blocks evict
    B's last three; C's then lead the order, its first block most recent."""
    reqs, P = _prefix_then_flood(np.random.default_rng(7))
    b, c = list(reqs[1].prompt_block_hashes(16)), list(reqs[2].prompt_block_hashes(16))
    m, kv, _ = _run(impl, reqs, cpu=8)
    assert m.ttft["request_2"] == 1678
    st = kv.offload_stats()
    assert (st["lookups"], st["lookup_hits"], st["loads"], st["cpu_evictions"]) == (3, 0, 0, 5)
    assert list(kv.cpu) == [b[4], b[3], b[2], b[1], b[0], c[2], c[1], c[0]]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_async_scheduling_admits_one_step_later_with_the_tier_too(impl, async_scheduling):
    # A (t=0, 16 tokens, 10 outputs) is queued at 116 and prefilled 116-1276 (1000 + 160):
    # TTFT 1276 + 50 - 0 = 1326; it then decodes 1276-2281, 2281-3286, ... (1005 each).
    # B (t=1500, 16 tokens) is queued at 1616, while step 1276-2281 runs.
    #   synchronous: the step at 2281 admits it (delay 781) and lasts 1000 + 160 + 5 = 1165:
    #     first token 3446 + 50 -> TTFT 1996.
    #   async: the step at 2281 was chosen at 1276, before B was queued; the one at 3286
    #     admits it (delay 1786): first token 4451 + 50 -> TTFT 3001.
    # The CPU tier's admission path must honour the cutoff exactly as the plain one does.
    rng = np.random.default_rng(0)
    reqs = [Request("request_0", 0, rng.integers(0, 1000, 16), list(range(10))),
            Request("request_1", 1500, rng.integers(0, 1000, 16), [1, 2])]
    m, _, _ = _run(impl, reqs, async_scheduling=async_scheduling)
    assert m.ttft == {"request_0": 1326, "request_1": 3001 if async_scheduling else 1996}
    assert m.scheduling_delay == {"request_0": 116,
                                  "request_1": 1786 if async_scheduling else 781}


@pytest.mark.parametrize("impl", IMPLS)
def test_other_requests_run_while_a_request_waits_for_its_load(impl):
    """D (t=5000, 16 tokens, 10 outputs) prefills at 5116 (1160 µs) and decodes from 6276 in
    steps of 1005 µs. C (t=6500, 48 tokens) is queued at 6648; at the step of 7281 its 2 CPU
    hits start loading (lands at 7491) and D's step still lasts 1005 µs. At 8286 C prefills
    [32, 48) beside D's token: 1000 + 160 + 5 = 1165 -> TTFT(C) = 8286 + 1165 + 50 - 6500 =
    3001, and that ITL of D is 1215; D's 8 others are 1055. Synchronous scheduling (under
    async scheduling C, queued during the step of 6276, is first seen at 8286: one step later)."""
    rng = np.random.default_rng(7)
    d = Request("request_3", 5000, rng.integers(0, 1000, 16), rng.integers(0, 1000, 10))
    reqs, _ = _prefix_then_flood(rng, c_arrival=6500, extra=(d,))
    m, kv, _ = _run(impl, reqs, async_scheduling=False)
    assert m.ttft["request_3"] == 1326 and m.ttft["request_2"] == 3001
    assert dict(m.all_itls) == {1055: 8, 1215: 1}
    assert kv.offload_stats()["load_wait_us"] == 210


# =========================================================================== random workloads
_SPECS = st.lists(st.tuples(st.integers(0, 40_000), st.integers(1, 90), st.integers(0, 30),
                            st.sampled_from(["", "g1", "g2"])), min_size=1, max_size=25)


def _random_requests(specs, seed):
    rng = np.random.default_rng(seed)
    prefixes = {g: rng.integers(0, 500, 40) for g in ("g1", "g2")}
    out = []
    for i, (arr, n_in, n_out, g) in enumerate(specs):
        inp = rng.integers(0, 500, n_in)
        if g:
            inp = np.concatenate((prefixes[g], inp))
        out.append(Request(f"request_{i}", arr, inp, rng.integers(0, 500, n_out)))
    out.sort(key=lambda r: r.arrival_us)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=_SPECS, seed=st.integers(0, 2**16), total=st.integers(9, 24), cpu=st.integers(1, 40),
       preemption=st.sampled_from(["vllm", "blis"]))
def test_both_engines_agree_and_the_tiers_stay_consistent(specs, seed, total, cpu, preemption):
    """Random prefix-sharing workloads on small GPU and CPU tiers (preemptions, CPU
    evictions, loads): both engines give the same per-request results and counters; the
    run's invariant checks pass (GPU block conservation, CPU tier within capacity, no
    negative pin); no count is negative and every block in the tier was stored once."""
    got = []
    for impl in IMPLS:
        m, kv, inst = _run(impl, _random_requests(specs, seed), total=total, bs=8, cpu=cpu,
                           preemption_model=preemption)
        st_ = kv.offload_stats()
        assert all(v >= 0 for v in st_.values())
        assert st_["cpu_blocks_used"] <= cpu and st_["peak_cpu_blocks"] <= cpu
        assert st_["cpu_blocks_used"] == st_["stored_blocks"] - st_["cpu_evictions"]
        assert kv.used == 0 and not kv._loads and not kv._dirty
        got.append((dict(m.ttft), dict(m.e2e), dict(m.itl), m.completed_requests, m.preemption_count,
                    st_, list(kv.cpu)))
    assert got[0] == got[1]


def test_the_fast_engine_keeps_its_pure_decode_short_path_with_offload():
    def reqs():
        rng = np.random.default_rng(3)
        return [Request(f"request_{i}", 100 * i, rng.integers(0, 500, 20), rng.integers(0, 500, 60))
                for i in range(4)]
    runs = {impl: _run(impl, reqs(), total=64, bs=8) for impl in IMPLS}
    ticks = runs["fast"][2].decode_ticks
    assert ticks > 50 and ticks == _run("fast", reqs(), total=64, bs=8, plain=True)[2].decode_ticks
    (mr, kr, _), (mf, kf, _) = runs["reference"], runs["fast"]
    assert dict(mr.itl) == dict(mf.itl) and kr.offload_stats() == kf.offload_stats()
    # 20 prompt + 60 output tokens, but the KV of the last output token is never computed:
    # 79 computed tokens, 9 full blocks a request
    assert kf.offload_stats()["stored_blocks"] == 4 * (79 // 8)


# =========================================================================== configuration
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 128, "vocab_size": 1000, "torch_dtype": "bfloat16",
        "max_position_embeddings": 4096}
LAB = {"tflops_peak": 100.0, "bw_peak_tbs": 1.0, "mfu_prefill": 0.5, "mfu_decode": 0.3,
       "memory_gib": 8.0, "host_link_gbps": 25.0}


def _tiny_scenario(tmp_path, **engine):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return Scenario(model="lab/tiny", hardware="LAB", tp=engine.pop("tp", 1),
                    model_config_folder=str(tmp_path), gpus={"LAB": LAB},
                    latency={"model": "roofline"}, engine={"total_kv_blocks": 100, **engine})


@pytest.mark.parametrize("tp,dtype,blocks,block_bytes", [
    (1, "auto", 131_072, 8192),     # 2 layers x 2 (K, V) x 16 tokens x 4 heads x 16 dims x 2 bytes
    (2, "auto", 131_072, 4096),     # 2 KV heads per GPU; the budget split over 2 ranks
    (1, "fp8", 262_144, 4096),
])
def test_the_scenario_sizes_the_tier_from_gib_and_the_model(tmp_path, tp, dtype, blocks, block_bytes):
    dep = resolve(_tiny_scenario(tmp_path, kv_cpu_gib=1.0, kv_cache_dtype=dtype, tp=tp,
                                 kv_cpu_latency_us=7), quiet=True)
    kv = dep.new_kv_cache()
    assert type(kv) is OffloadKVCache
    assert (kv.cpu_capacity, kv.block_bytes, kv.link_latency_us) == (blocks, block_bytes, 7)
    assert kv.transfer_us(1) == 7 + -(-block_bytes // 25_000)
    assert any("CPU KV offload tier: 1 GiB" in n for n in dep.notes)


@pytest.mark.parametrize("engine,gpu,message", [
    ({"kv_cpu_gib": 1e-6}, {}, "holds no KV block"),
    ({"kv_cpu_gib": 1.0}, {"host_link_gbps": 0.0}, "has no host_link_gbps"),
    ({"kv_cpu_gib": 1.0, "kv_cache": "gpu"}, {}, "needs the offload KV cache"),
])
def test_an_unusable_tier_is_one_located_error(tmp_path, engine, gpu, message):
    sc = _tiny_scenario(tmp_path, **engine)
    if gpu:
        sc = sc.model_copy(update={"gpus": {"LAB": Scenario(gpus={"LAB": {**LAB, **gpu}}).gpus["LAB"]}})
    with pytest.raises(ConfigError, match=message) as exc:
        resolve(sc, quiet=True)
    assert exc.value.field == "engine.kv_cpu_gib"


def test_one_cpu_tier_at_a_time(tmp_path):
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="choose one CPU tier") as exc:
        Scenario(engine={"kv_cpu_gib": 1.0, "kv_cpu_blocks": 10})
    assert exc.value.errors()[0]["loc"] == ("engine", "kv_cpu_gib")
    with pytest.raises(ValidationError, match="prefill/decode pools"):
        Scenario(engine={"kv_cpu_gib": 1.0}, cluster={"num_instances": 2},
                 disaggregation={"prefill_instances": 1, "decode_instances": 1})
    for bad in (-1.0, float("inf"), 70000.0):
        with pytest.raises(ValidationError):
            Scenario(engine={"kv_cpu_gib": bad})
