"""KV capacity auto-calculation (docs/kv-capacity.md): golden values, MoE, every validation rule."""

from __future__ import annotations

import dataclasses

import pytest

from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.models import builtin_models
from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.kv.capacity import KVCapacityError, block_bytes, kv_capacity_blocks, total_params

#: the spec's worked example, written out (not taken from the catalog)
QWEN3_14B = ModelConfig(name="qwen3-14b-like", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=8,
                        intermediate_size=17408, vocab_size=151936, bytes_per_param=2.0, hidden_act="silu")
H100 = GPUSpec("H100", 989.5, 1979.0, 3.35, 0.45, 0.30, 80.0)
A100 = GPUSpec("A100-SXM", 312.0, 0.0, 2.039, 0.38, 0.18, 80.0)


def test_golden_qwen3_14b_like_on_h100_tp2_is_89941():
    assert kv_capacity_blocks(QWEN3_14B, H100, 2, 16, 0.9) == 89_941


def test_golden_b18b_qwen3_14b_on_a100_tp1_is_15909():
    assert kv_capacity_blocks(QWEN3_14B, A100, 1, 16, 0.9) == 15_909
    # the same from the catalogs (what `--model qwen/qwen3-14b --hardware A100-SXM` resolves)
    assert kv_capacity_blocks(builtin_models().get("qwen/qwen3-14b"), builtin_gpus().get("A100-SXM"), 1, 16) == 15_909


def test_dense_parameter_count_by_hand():
    # embed + 40·(attn + mlp + norms) + lm_head + hidden
    embed = 151936 * 5120
    attn = 5120 * (5120 + 2 * 1024) + 5120 * 5120
    mlp = 3 * 5120 * 17408
    assert total_params(QWEN3_14B) == embed + 40 * (attn + mlp + 2 * 5120) + embed + 5120 == 14_768_296_960
    tied = dataclasses.replace(QWEN3_14B, tie_word_embeddings=True)
    assert total_params(QWEN3_14B) - total_params(tied) == embed
    assert block_bytes(QWEN3_14B, 2, 16) == 40 * 2 * 128 * 8 * 2 // 2 * 16 == 1_310_720


def test_moe_capacity_mixtral_on_h100_tp2():
    mx = builtin_models().get("mistralai/mixtral-8x7b-v0.1")
    # all 8 experts' 3-matrix MLPs plus the router (E·hidden) in every layer
    embed = 32000 * 4096
    attn = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    mlp = 3 * 4096 * 14336 * 8 + 8 * 4096
    params = embed + 32 * (attn + mlp + 2 * 4096) + embed + 4096
    assert total_params(mx) == params == 46_702_792_704
    # 144 GiB usable − 86.99 GiB weights − 8 GiB MoE activations − 1.2 GiB non-torch, / 1 MiB blocks
    free = 80 * 0.9 * 2 - (int(params * 2.0) / 2**30 + 8.0 + 0.6 * 2)
    assert kv_capacity_blocks(mx, H100, 2, 16, 0.9) == int(free * 2**30) // (32 * 2 * 128 * 8 * 2 // 2 * 16) == 48_956
    dense_twin = dataclasses.replace(mx, num_local_experts=0, num_experts_per_tok=0)
    assert kv_capacity_blocks(dense_twin, H100, 2, 16, 0.9) > 48_956 + 8 * 1024   # 7 experts and 2.5 GiB less


def test_moe_with_shared_experts_deepseek_v3():
    ds = builtin_models().get("deepseek-ai/deepseek-v3")
    h, e = 7168, 256
    attn = h * (h + 2 * 7168) + h * h                   # MHA-sized: 128 KV heads of 7168/128
    mlp = 3 * h * 2048 * e + 3 * h * 2048 + e * h       # routed + shared + router
    assert total_params(ds) == 129280 * h * 2 + 61 * (attn + mlp + 2 * h) + h
    with pytest.raises(KVCapacityError, match="does not fit"):
        kv_capacity_blocks(ds, H100, 8, 16, 0.9)         # 656 GiB of FP8 weights > 576 GiB
    b200 = builtin_gpus().get("B200")
    assert kv_capacity_blocks(ds, b200, 8, 16, 0.9) > 0


def test_gpu_memory_utilization_and_block_size_scale_the_result():
    lo = kv_capacity_blocks(QWEN3_14B, H100, 2, 16, 0.5)
    assert 0 < lo < 89_941
    assert kv_capacity_blocks(QWEN3_14B, H100, 2, 32, 0.9) == 89_941 // 2


def _bad(**changes):
    return dataclasses.replace(QWEN3_14B, **changes)


@pytest.mark.parametrize("model, gpu, tp, bs, util, problem", [
    (QWEN3_14B, H100, 1, 16, 0.0, "utilization must be in"),
    (QWEN3_14B, H100, 1, 16, 1.5, "utilization must be in"),
    (QWEN3_14B, H100, 1, 16, float("nan"), "utilization must be in"),
    (QWEN3_14B, H100, 0, 16, 0.9, "TP must be > 0"),
    (QWEN3_14B, H100, 1, 0, 0.9, "block size must be > 0"),
    (_bad(num_heads=0), H100, 1, 16, 0.9, "num_attention_heads must be > 0"),
    (_bad(vocab_size=0), H100, 1, 16, 0.9, "vocab_size must be > 0"),
    (_bad(intermediate_size=0), H100, 1, 16, 0.9, "intermediate_size must be > 0"),
    (_bad(bytes_per_param=0.0), H100, 1, 16, 0.9, "bytes per parameter"),
    (QWEN3_14B, dataclasses.replace(H100, memory_gib=0.0), 1, 16, 0.9, "memory must be finite"),
    (_bad(weight_bytes_per_param=float("inf")), H100, 1, 16, 0.9, "weight bytes per parameter"),
    (_bad(num_heads=48), H100, 1, 16, 0.9, "not divisible by num_attention_heads"),
    (_bad(hidden_act="gelu"), H100, 1, 16, 0.9, "hidden_act 'gelu' is not supported"),
    (QWEN3_14B, H100, 3, 16, 0.9, "num_key_value_heads 8 is not divisible by TP 3"),
    (_bad(moe_count_missing=True), H100, 1, 16, 0.9, "set --total-kv-blocks explicitly"),
    (QWEN3_14B, dataclasses.replace(H100, memory_gib=24.0), 1, 16, 0.9, "does not fit"),
])
def test_invalid_inputs_are_errors(model, gpu, tp, bs, util, problem):
    with pytest.raises(KVCapacityError, match=problem):
        kv_capacity_blocks(model, gpu, tp, bs, util)


def test_fewer_kv_heads_than_tp_is_allowed_and_optimistic():
    two_kv = _bad(num_kv_heads=2)
    assert kv_capacity_blocks(two_kv, H100, 8, 16, 0.9) > kv_capacity_blocks(two_kv, H100, 2, 16, 0.9)
