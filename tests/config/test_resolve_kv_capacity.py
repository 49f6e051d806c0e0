"""KV auto-sizing in the resolver: ``engine.kv_capacity_model`` vllm (default) or blis, pools, DP."""

from __future__ import annotations

import pytest

from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.models import builtin_models
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.pools import resolve_pools
from blis_simpy.deploy.resolve import resolve
from blis_simpy.errors import ConfigError
from blis_simpy.kv.vllm_capacity import vllm_kv_capacity

LLAMA = "meta-llama/llama-3.1-8b"


def sc(model=LLAMA, hardware="RTX-4090", tp=1, **kw) -> Scenario:
    return Scenario.model_validate({"model": model, "hardware": hardware, "tp": tp,
                                    "latency": {"model": "roofline"}, **kw})


def test_vllm_is_the_default_and_reproduces_the_4090_run():
    d = resolve(sc(), quiet=True)
    assert d.total_kv_blocks == 2588 and d.kv_source == "vllm"
    assert d.kv_capacity.blocks == 2588 and d.kv_capacity.capacity_model == "vllm"
    note = next(n for n in d.notes if n.startswith("total_kv_blocks"))
    assert note == ("total_kv_blocks 2588: auto-calculated for 1 x RTX-4090, block size 16 (vllm: total "
                    "23.52 GiB x 0.9 − weights 14.99 − activation 0.94 − non-torch 0.18 = 5.06 GiB)")
    assert d.max_model_len == 2588 * 16                         # capped to what the KV holds


def test_the_engine_limits_feed_the_profile_run():
    d = resolve(sc(engine={"max_num_running_reqs": 128, "max_num_scheduled_tokens": 4096}), quiet=True)
    m, g = builtin_models().get(LLAMA), builtin_gpus().get("RTX-4090")
    want = vllm_kv_capacity(m, g, max_num_seqs=128, max_num_batched_tokens=4096)
    assert d.total_kv_blocks == want.blocks and d.kv_capacity == want
    fp8 = resolve(sc(engine={"kv_cache_dtype": "fp8"}), quiet=True)
    assert fp8.total_kv_blocks == vllm_kv_capacity(m, g, kv_bytes_per_element=1.0).blocks
    util = resolve(sc(engine={"gpu_memory_utilization": 0.95, "block_size": 32}), quiet=True)
    assert util.total_kv_blocks == vllm_kv_capacity(m, g, gpu_memory_utilization=0.95, block_size=32).blocks


def test_dp_and_expert_parallel_come_from_the_scenario():
    q = "qwen/qwen3-30b-a3b"
    d = resolve(sc(model=q, hardware="H100", tp=2, dp=2, enable_expert_parallel=True), quiet=True)
    want = vllm_kv_capacity(builtin_models().get(q), builtin_gpus().get("H100"), tp=2, dp=2,
                            expert_parallel=True)
    assert d.total_kv_blocks == want.blocks and d.kv_capacity.dp == 2
    assert any("per DP rank (DP 2)" in n for n in d.notes)


def test_a_model_that_does_not_fit_is_a_config_error_not_a_fallback():
    with pytest.raises(ConfigError) as e:
        resolve(sc(model="meta-llama/llama-3.1-70b"), quiet=True)
    assert e.value.field == "hardware"
    assert "short by 111.42 GiB per GPU" in e.value.problem and "\n" not in str(e.value)


def test_blis_keeps_its_formula_but_not_its_fallback():
    d = resolve(sc(model="qwen/qwen3-14b", hardware="A100-SXM", engine={"kv_capacity_model": "blis"}),
                quiet=True)
    assert d.total_kv_blocks == 15_909 and d.kv_source == "blis" and d.kv_capacity.capacity_model == "blis"
    # a model that does not fit is refused (BLIS falls back to 1,000,000 blocks and runs anyway)
    with pytest.raises(ConfigError, match="the model does not fit: short by"):
        resolve(sc(model="meta-llama/llama-3.1-70b", engine={"kv_capacity_model": "blis"}), quiet=True)


@pytest.mark.parametrize("capacity_model", ["vllm", "blis"])
def test_a_tp_that_does_not_divide_the_heads_is_refused(capacity_model):
    # Qwen3-14B has 40 attention heads; TP 16 was accepted by BLIS's formula (8 KV heads < 16)
    with pytest.raises(ConfigError) as e:
        resolve(sc(model="qwen/qwen3-14b", hardware="H100", tp=16,
                   engine={"kv_capacity_model": capacity_model}), quiet=True)
    assert e.value.field == "tp"
    assert e.value.problem == "qwen/qwen3-14b has 40 attention heads: TP 16 does not divide them (vLLM needs it to)"


def test_an_auto_capacity_past_the_block_cap_is_refused():
    # TP 40 x 80 GiB at one token a block: 740,030,389 blocks, over MAX_KV_BLOCKS (100,000,000)
    with pytest.raises(ConfigError, match="740030389 blocks auto-calculated for 40 x H100, more than the "
                                          "100000000 a run can hold"):
        resolve(sc(model="qwen/qwen3-14b", hardware="H100", tp=40,
                   engine={"kv_capacity_model": "blis", "block_size": 1}), quiet=True)


def test_explicit_blocks_and_catalog_rows_still_win():
    d = resolve(sc(engine={"total_kv_blocks": 500}), quiet=True)
    assert (d.total_kv_blocks, d.kv_capacity, d.kv_source) == (500, None, "explicit")
    d = resolve(sc(model="qwen/qwen3-14b", hardware="H100"), quiet=True)
    assert (d.total_kv_blocks, d.kv_capacity, d.kv_source) == (17_600, None, "catalog")


# ---------------------------------------------------------------------------- PD pools
def _pools(gpus=None, **pool) -> Scenario:
    return sc(model="qwen/qwen3-14b", hardware="H100", cluster={"num_instances": 2}, gpus=gpus or {},
              disaggregation={"prefill_instances": 1, "decode_instances": 1, "decider": {"policy": "always"},
                              **pool})


def test_pools_auto_size_with_the_selected_model():
    plan = resolve_pools(_pools(decode_pool={"tp": 2}), quiet=True)
    dc = plan.deployments["decode"]
    want = vllm_kv_capacity(builtin_models().get("qwen/qwen3-14b"), builtin_gpus().get("H100"), tp=2)
    assert dc.total_kv_blocks == want.blocks == 46_048 and dc.kv_capacity == want
    assert plan.deployments["prefill"].total_kv_blocks == 17_600          # the catalog row
    assert (dc.kv_source, plan.deployments["prefill"].kv_source) == ("vllm", "catalog")


def test_a_pool_that_does_not_fit_is_a_config_error_on_its_key():
    gpus = {"TINY": {"tflops_peak": 100, "bw_peak_tbs": 1, "mfu_prefill": 0.5, "mfu_decode": 0.3,
                     "memory_gib": 8}}
    with pytest.raises(ConfigError) as e:
        resolve_pools(_pools(gpus, prefill_pool={"hardware": "TINY"}), quiet=True)
    assert e.value.field == "disaggregation.prefill_pool.hardware"
    assert "does not fit on TINY at TP 1: short by" in e.value.problem
