"""The ``vllm`` KV capacity model: the 4090 golden figure, the log example, TP, MLA, MoE, errors."""

from __future__ import annotations

import dataclasses
import math

import pytest

import blis_simpy.kv.vllm_capacity as V
from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.models import builtin_models
from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.kv.capacity import KVCapacityError, kv_capacity_blocks
from blis_simpy.kv.sizing import blis_kv_capacity, kv_capacity
from blis_simpy.kv.vllm_capacity import GIB, MIB, vllm_kv_capacity, vllm_kv_gib

#: Llama-3.1-8B as its config.json says (written out, not taken from the catalog)
LLAMA_8B = ModelConfig(name="meta-llama/llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32,
                       num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
                       bytes_per_param=2.0, hidden_act="silu", max_position_embeddings=131072)
#: the RTX 4090 as vLLM 0.19 saw it: cudaMemGetInfo total 25,250,627,584 B ("23.52 GiB")
RTX4090 = GPUSpec("RTX-4090", 165.2, 330.3, 1.008, 0.5, 0.3, 24.0, memory_torch_gib=25_250_627_584 / GIB)
H100 = GPUSpec("H100", 989.5, 1979.0, 3.35, 0.45, 0.30, 80.0, memory_torch_gib=79.19)
LLAMA_PARAMS = 8_030_261_248


# ---------------------------------------------------------------------------- the golden run
def test_llama_3_1_8b_bf16_on_the_rtx_4090_gives_vllms_2588_blocks():
    cap = vllm_kv_capacity(LLAMA_8B, RTX4090, gpu_memory_utilization=0.9, max_num_batched_tokens=2048,
                           max_num_seqs=256, block_size=16)
    assert cap.total_bytes == 25_250_627_584
    assert cap.requested_bytes == math.ceil(25_250_627_584 * 0.9) == 22_725_564_826
    # weights: 8,030,261,248 bf16 parameters + the rotary cos/sin cache (131072 x 128 bf16)
    assert cap.weights_bytes == LLAMA_PARAMS * 2 + 131072 * 128 * 2 == 16_094_076_928   # "14.9888 GiB"
    # activation: the sampler pass over 256 rows is the peak (hidden states + bf16 logits + 28 B/logit)
    assert dict(cap.activation)["sampler"] == (2048 + 2 * 256) * 4096 * 2 + 256 * 128256 * (2 + 28)
    assert dict(cap.activation)["forward"] == 2048 * 2 * (2 * 4096 + 3 * 14336) + 2048 * 32 * 4
    assert cap.activation_bytes == 1_005_977_600
    assert cap.non_torch_bytes == 188 * MIB
    assert cap.available_bytes == 22_725_564_826 - 16_094_076_928 - 1_005_977_600 - 188 * MIB
    assert cap.block_bytes == 2 * 16 * 8 * 128 * 2 * 32 == 2 * MIB       # per GPU, all 32 layers
    assert cap.blocks == cap.available_bytes // (65536 * 32) == 2588
    assert cap.tokens == 41_408
    # the same from the catalogs
    assert vllm_kv_capacity(builtin_models().get("meta-llama/llama-3.1-8b"),
                            builtin_gpus().get("RTX-4090")).blocks == 2588


def test_the_calibrated_non_torch_constant_sits_inside_the_window_the_log_allows(monkeypatch):
    def blocks(delta):
        monkeypatch.setattr(V, "NON_TORCH_INCREASE_BYTES", 188 * MIB + delta)
        return vllm_kv_capacity(LLAMA_8B, RTX4090).blocks
    assert blocks(-int(0.85 * MIB)) == blocks(int(0.85 * MIB)) == 2588     # ~0.9 MiB either side
    assert blocks(-int(1.2 * MIB)) == 2589 and blocks(int(1.2 * MIB)) == 2587


def test_the_h100_llava_log_arithmetic():
    # total 79.19 GiB, util 0.9, weights 14.08, peak activation 1.97, non-torch 0.07 -> 55.15 GiB
    assert vllm_kv_gib(79.19, 0.9, 14.08, 1.97, 0.07) == pytest.approx(55.15, abs=0.005)


def test_pieces_add_up_and_the_summary_names_them():
    cap = vllm_kv_capacity(LLAMA_8B, RTX4090)
    assert cap.weights_bytes == sum(b for _, b in cap.weights)
    assert cap.activation_bytes == max(b for _, b in cap.activation)
    assert cap.summary() == ("vllm: total 23.52 GiB x 0.9 − weights 14.99 − activation 0.94 − "
                             "non-torch 0.18 = 5.06 GiB")
    d = cap.to_dict()
    assert d["blocks"] == 2588 and d["tokens"] == 41_408 and d["weights"]["lm_head"] == 128256 * 4096 * 2
    assert d["available_gib"] == pytest.approx(cap.available_bytes / GIB)


def test_driver_memory_falls_back_to_the_datasheet_figure():
    nominal = dataclasses.replace(RTX4090, memory_torch_gib=0.0)
    assert vllm_kv_capacity(LLAMA_8B, nominal).total_bytes == 24 * GIB


# ---------------------------------------------------------------------------- batch limits
def test_fewer_sequences_shrink_the_sampler_peak():
    small = vllm_kv_capacity(LLAMA_8B, RTX4090, max_num_seqs=128)
    assert dict(small.activation)["sampler"] == (2048 + 256) * 4096 * 2 + 128 * 128256 * 30
    assert small.blocks == (small.requested_bytes - small.weights_bytes - small.activation_bytes
                            - 188 * MIB) // (2 * MIB) > 2588
    # 16 tokens but 256 allowed sequences: the profile run has 16 requests
    tiny = vllm_kv_capacity(LLAMA_8B, RTX4090, max_num_batched_tokens=16)
    assert dict(tiny.activation)["sampler"] == (16 + 32) * 4096 * 2 + 16 * 128256 * 30


def test_a_big_token_budget_makes_the_forward_pass_the_peak():
    cap = vllm_kv_capacity(LLAMA_8B, H100, max_num_batched_tokens=16384)
    fwd = 16384 * 2 * (2 * 4096 + 3 * 14336) + 16384 * 32 * 4
    assert dict(cap.activation)["forward"] == fwd == cap.activation_bytes


# ---------------------------------------------------------------------------- tensor parallel
def test_tp2_divides_the_weights_and_the_block_per_gpu():
    one, two = vllm_kv_capacity(LLAMA_8B, RTX4090), vllm_kv_capacity(LLAMA_8B, RTX4090, tp=2)
    norms = (2 * 32 + 1) * 4096 * 2
    assert two.weights_bytes == (LLAMA_PARAMS * 2 - norms) // 2 + norms + 131072 * 128 * 2
    assert two.block_bytes * 2 == one.block_bytes == 2 * MIB                # 4 of 8 KV heads per GPU
    assert two.activation_bytes == one.activation_bytes                     # full-vocab sampler on each
    assert two.blocks == two.available_bytes // MIB == 12_834
    # one GPU's free bytes over one GPU's block: BLIS's formula sums both GPUs' memory over the
    # per-GPU block, so at TP 2 it counts about twice vLLM's blocks
    h_vllm, h_blis = vllm_kv_capacity(LLAMA_8B, H100, tp=2), kv_capacity_blocks(LLAMA_8B, H100, 2, 16)
    assert h_vllm.blocks == h_vllm.available_bytes // MIB == 64_143 and h_blis == 125_278


def test_kv_heads_are_replicated_beyond_tp_equal_to_the_kv_head_count():
    eight, sixteen = (vllm_kv_capacity(LLAMA_8B, H100, tp=t) for t in (8, 16))
    assert eight.block_bytes == sixteen.block_bytes == 2 * 16 * 1 * 128 * 2 * 32
    weights_k_v = 32 * 2 * 4096 * 128 * 2                              # one KV head's K and V, all layers
    q_o_16 = 32 * 2 * 4096 * 2 * 128 * 2
    assert dict(sixteen.weights)["attention"] == weights_k_v + q_o_16


def test_tp_must_divide_the_heads():
    with pytest.raises(KVCapacityError, match="not divisible by TP 3"):
        vllm_kv_capacity(LLAMA_8B, H100, tp=3)
    with pytest.raises(KVCapacityError, match="one must divide the other"):
        vllm_kv_capacity(dataclasses.replace(LLAMA_8B, num_kv_heads=6, num_heads=48), H100, tp=4)


# ---------------------------------------------------------------------------- MLA and MoE
def test_mla_keeps_one_latent_vector_per_token_not_sharded():
    ds = builtin_models().get("deepseek-ai/deepseek-v3")
    assert (ds.kv_lora_rank, ds.qk_rope_head_dim, ds.num_layers) == (512, 64, 61)
    assert V.page_bytes(ds, 1, 16, 2.0) == V.page_bytes(ds, 8, 16, 2.0) == 16 * (512 + 64) * 2
    b200 = builtin_gpus().get("B200")
    cap = vllm_kv_capacity(ds, b200, tp=8)
    assert cap.block_bytes == 61 * 16 * 576 * 2 and cap.blocks == cap.available_bytes // 18_432 // 61
    assert dict(cap.weights)["rope cache"] == ds.max_position_embeddings * 64 * 2


def test_moe_expert_parallel_on_or_off_holds_the_same_bytes_when_it_divides():
    q = builtin_models().get("qwen/qwen3-30b-a3b")              # 128 experts of 768, 48 layers
    off = vllm_kv_capacity(q, H100, tp=2, dp=2)
    on = vllm_kv_capacity(q, H100, tp=2, dp=2, expert_parallel=True)
    routed = 48 * (128 // 4) * 3 * 2048 * 768 * 2               # 32 whole experts per GPU
    assert dict(on.weights)["routed experts"] == dict(off.weights)["routed experts"] == routed
    assert dict(on.weights)["router"] == 48 * 128 * 2048 * 2    # replicated
    assert on.weights_bytes == off.weights_bytes and on.block_bytes == off.block_bytes
    # DP shards only the experts: attention and embeddings stay per TP
    assert dict(off.weights)["attention"] == dict(vllm_kv_capacity(q, H100, tp=2).weights)["attention"]


def test_moe_expert_parallel_puts_whole_experts_on_the_busiest_rank():
    mx = builtin_models().get("mistralai/mixtral-8x7b-v0.1")    # 8 experts over 3 DP ranks
    on = dict(V.weight_pieces(mx, 1, 3, True))["routed experts"]
    off = dict(V.weight_pieces(mx, 1, 3, False))["routed experts"]
    assert on == 32 * 3 * 3 * 4096 * 14336 * 2                  # ceil(8 / 3) = 3 experts
    assert off == 32 * 8 * 3 * 4096 * 4779 * 2                  # ceil(14336 / 3) per expert
    assert on > off


def test_dense_layers_of_an_moe_model_use_the_dense_ffn():
    mav = builtin_models().get("meta-llama/llama-4-maverick-17b-128e-instruct-fp8")
    assert (mav.num_moe_layers, mav.dense_intermediate_size) == (24, 16384)
    w = dict(V.weight_pieces(mav, 8, 1, False))
    assert w["dense MLP"] == int(24 * 3 * 5120 * (16384 // 8) * mav.effective_weight_bytes_per_param)


# ---------------------------------------------------------------------------- dtypes
def test_quantised_linear_layers_keep_bf16_embeddings():
    fp8 = builtin_models().get("redhatai/phi-4-fp8-dynamic")
    assert (fp8.bytes_per_param, fp8.effective_weight_bytes_per_param) == (2.0, 1.0)
    w = dict(V.weight_pieces(fp8, 1, 1, False))
    assert w["embedding"] == 100352 * 5120 * 2
    assert w["dense MLP"] == 40 * 3 * 5120 * 17920 * 1


def test_fp8_kv_cache_halves_the_block():
    bf16 = kv_capacity("vllm", LLAMA_8B, RTX4090)
    fp8 = kv_capacity("vllm", LLAMA_8B, RTX4090, kv_cache_dtype="fp8")
    assert fp8.block_bytes * 2 == bf16.block_bytes and fp8.blocks == fp8.available_bytes // MIB


# ---------------------------------------------------------------------------- errors
def test_a_model_that_does_not_fit_names_the_gib_shortfall_and_a_tp_that_fits():
    seventy = builtin_models().get("meta-llama/llama-3.1-70b")
    with pytest.raises(KVCapacityError) as e:
        vllm_kv_capacity(seventy, RTX4090)
    msg = str(e.value)
    assert "does not fit on RTX-4090 at TP 1: short by 111.42 GiB per GPU" in msg
    assert "TP 8 (8 GPUs) would fit" in msg and "\n" not in msg


def test_room_for_no_block_is_an_error():
    tight = dataclasses.replace(RTX4090, memory_torch_gib=(16_094_076_928 + 1_005_977_600 + 188 * MIB
                                                           + MIB) / 0.9 / GIB)
    with pytest.raises(KVCapacityError, match="no room for one KV block"):
        vllm_kv_capacity(LLAMA_8B, tight)


@pytest.mark.parametrize("kw, problem", [
    ({"gpu_memory_utilization": 0.0}, "utilization must be in"),
    ({"tp": 0}, "TP must be > 0"),
    ({"dp": 0}, "DP must be > 0"),
    ({"block_size": 0}, "block size must be > 0"),
    ({"max_num_seqs": 0}, "max_num_seqs must be > 0"),
    ({"kv_bytes_per_element": 0.0}, "KV bytes per element"),
])
def test_invalid_inputs(kw, problem):
    with pytest.raises(KVCapacityError, match=problem):
        vllm_kv_capacity(LLAMA_8B, RTX4090, **kw)


# ---------------------------------------------------------------------------- over the catalog
def test_every_catalog_model_and_gpu_is_consistent():
    gpus = builtin_gpus()
    for name, entry in builtin_models().entries.items():
        m = entry.config
        for g in gpus.names():
            for tp in (1, 2, 4, 8):
                try:
                    cap = vllm_kv_capacity(m, gpus.get(g), tp=tp)
                except KVCapacityError as exc:
                    why = ("does not fit", "not divisible by TP", "one must divide", "no room for one")
                    assert any(w in str(exc) for w in why), (name, g, tp, exc)
                    continue
                assert cap.available_bytes == (cap.requested_bytes - cap.weights_bytes
                                               - cap.activation_bytes - cap.non_torch_bytes)
                assert cap.blocks * cap.block_bytes <= cap.available_bytes < (cap.blocks + 1) * cap.block_bytes
                assert cap.blocks > 0 and cap.weights_bytes > 0, (name, g, tp)


# ---------------------------------------------------------------------------- the blis model
def test_the_blis_model_is_bit_identical_to_blis():
    qwen = ModelConfig(name="qwen3-14b-like", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=8,
                       intermediate_size=17408, vocab_size=151936, bytes_per_param=2.0, hidden_act="silu")
    h100 = GPUSpec("H100", 989.5, 1979.0, 3.35, 0.45, 0.30, 80.0)
    a100 = GPUSpec("A100-SXM", 312.0, 0.0, 2.039, 0.38, 0.18, 80.0)
    assert kv_capacity("blis", qwen, h100, tp=2).blocks == kv_capacity_blocks(qwen, h100, 2, 16) == 89_941
    cap = blis_kv_capacity(qwen, a100, 1, 16)
    assert cap.blocks == 15_909 and cap.capacity_model == "blis"
    assert cap.activation_bytes == int(5.5 * GIB) and cap.non_torch_bytes == int(0.15 * GIB)
    assert cap.total_bytes == 80 * GIB and cap.blocks == cap.available_bytes // cap.block_bytes
