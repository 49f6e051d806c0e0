"""roofline: hand-computed step times, FP8 peak, MoE nEff (divergences.md #8), validation."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blis_simpy.latency import LatencyModel
from blis_simpy.latency.roofline import RooflineModel, go_pow
from tests.latency.support import (
    FP8_GPU,
    H100,
    NARROW_GPU,
    SLOW_GPU,
    TOY,
    TOY_MOE,
    Req,
    decode,
    prefill,
    view,
)

# Toy dense model (tests/latency/support.py): d = 64, L = 2, H = 4, Hkv = 2, dh = 16,
# dkv = 32, dff = 128, nMat = 2, bpp = 2. SLOW_GPU: peak 1e9 FLOP/s, bw 1e9 B/s, mfu 0.5/0.25.
#
# Prefill request, seq = 0, t = 4 (ctx = 0 + (4-1)/2 = 1.5):
#   QKV+O  = L·[2t(d² + 2·d·dkv) + 2t·d²] = 2·[8·(4096 + 4096) + 8·4096]   = 196 608
#   attn   = L·4·H·t·ctx·dh               = 2·4·4·4·1.5·16                  =   3 072
#   sram   = L·(5·H·t·ctx + 2·t·d)         = 2·(5·4·4·1.5 + 2·4·64) = 2·632  =   1 264
#   mlp    = L·2t·nMat·d·dff               = 2·(8·2·64·128)                  = 262 144
#   FLOPs  = 463 088  →  compute = 463 088 / (1e9 · 0.5) s = 926.176 µs
#   bytes: acts = L·d·bpp·t = 2·64·2·4 = 1 024; kv_read = 0; kv_write = 2·L·Hkv·dh·bpp·t = 1 024
# Decode request, seq = 10, t = 1 (ctx = 10):
#   QKV+O  = 2·[2·(4096 + 4096) + 2·4096]  = 49 152
#   attn   = 2·4·4·1·10·16                 =  5 120
#   sram   = 2·(5·4·1·10 + 2·64)           =    656
#   mlp    = 2·(2·2·64·128)                = 65 536
#   FLOPs  = 120 464  →  compute = 120 464 / (1e9 · 0.25) s = 481.856 µs
#   bytes: acts = 256; kv_read = 2·2·2·16·2·10 = 2 560; kv_write = 256  → 3 072
# Weights once per step: w_layer = d(d + 2dkv) + d² + nMat·d·dff = 8 192 + 4 096 + 16 384
#   = 28 672; × L × bpp = 114 688 bytes.
PF_US = 926.176
DC_US = 481.856
WEIGHTS = 114_688


def test_registered_under_its_name():
    assert LatencyModel.lookup("roofline") is RooflineModel
    assert RooflineModel.needs_model_config


def test_dense_mixed_batch_by_hand():
    m = RooflineModel(TOY, SLOW_GPU, 1)
    assert m.flops(0, 4) == 463_088
    assert m.flops(10, 1) == 120_464
    # compute = 926.176 + 481.856 = 1408.032 µs; memory = (114 688 + 2 048 + 3 072) B / 1e9 B/s
    # = 119.808 µs; max → 1408.032 µs, truncated to 1408.
    assert m.step_time_us(view(prefill(0, 4), decode(10))) == 1408
    assert m.step_time_us(view(prefill(0, 4), decode(10))) == int(PF_US + DC_US)


def test_dense_decode_only_memory_bound_by_hand():
    m = RooflineModel(TOY, NARROW_GPU, 1)
    # compute 481.856 µs; memory = (114 688 + 3 072) B / 1e8 B/s = 1177.6 µs → 1177.
    assert m.step_time_us(view(decode(10))) == 1177
    # Two decodes, seq 10 and 30: memory = (114 688 + 3 072 + (256 + 2·2·2·16·2·30 + 256)) / 1e8
    # = (114 688 + 3 072 + 8 192) / 1e8 s = 1259.52 µs.
    assert m.step_time_us(view(decode(10), decode(30))) == 1259


def test_tensor_parallel_divides_both_terms():
    m1 = RooflineModel(TOY, NARROW_GPU, 1)
    m2 = RooflineModel(TOY, NARROW_GPU, 2)
    # TP 2 halves every term: memory 1177.6 / 2 = 588.8 µs; compute 481.856 / 2 = 240.928.
    assert m2.step_time_us(view(decode(10))) == 588
    assert m1.step_time_us(view(decode(10))) == 1177


def test_empty_and_ignored_batches_take_one_tick():
    m = RooflineModel(TOY, SLOW_GPU, 1)
    assert m.step_time_us(view()) == 1
    # PI >= input length but no output token: neither prefill nor decode (docs/latency-models.md)
    assert m.step_time_us(view(Req(pi=10, input_len=10, num_new_tokens=0, output_len=0))) == 1


def test_decode_with_zero_new_tokens_still_costs_one_token():
    """Decode requests are priced with t = 1 whatever their NumNewTokens (0 or 1)."""
    m = RooflineModel(TOY, SLOW_GPU, 1)
    assert m.step_time_us(view(decode(10, new=0))) == m.step_time_us(view(decode(10, new=1))) == 481


def test_fp8_peak_selected_for_one_byte_weights():
    fp8_model = dataclasses.replace(TOY, weight_bytes_per_param=1.0)
    # Weights 1 byte/param and the GPU has FP8: peak = 2e9 FLOP/s, compute halves:
    # 463 088 / (2e9·0.5) + 120 464 / (2e9·0.25) s = 463.088 + 240.928 = 704.016 µs.
    # memory = (57 344 + 5 120) / 1e9 s = 62.464 µs → 704.
    m = RooflineModel(fp8_model, FP8_GPU, 1)
    assert m.fp8 and m.peak == 2e12 * 1e-3
    assert m.step_time_us(view(prefill(0, 4), decode(10))) == 704
    # No native FP8 on the GPU: the BF16 peak → 1408 as in the dense test.
    assert RooflineModel(fp8_model, SLOW_GPU, 1).step_time_us(view(prefill(0, 4), decode(10))) == 1408
    # 4-bit weights on an FP8 GPU: not 1.0 byte/param → BF16 peak.
    w4 = dataclasses.replace(TOY, weight_bytes_per_param=0.5)
    assert not RooflineModel(w4, FP8_GPU, 1).fp8
    assert RooflineModel(w4, FP8_GPU, 1).step_time_us(view(prefill(0, 4), decode(10))) == 1408
    # An int8/fp8 checkpoint (bytes_per_param 1, no quantisation config) also selects FP8.
    assert RooflineModel(dataclasses.replace(TOY, bytes_per_param=1.0), FP8_GPU, 1).fp8


def test_quantised_weights_shrink_only_the_weight_bytes():
    w4 = dataclasses.replace(TOY, weight_bytes_per_param=0.5)
    m = RooflineModel(w4, NARROW_GPU, 1)
    # weights 28 672·2·0.5 = 28 672 B; KV/activations keep bpp = 2: 3 072 B.
    # memory = 31 744 / 1e8 s = 317.44 µs; compute 481.856 µs → compute-bound 481.
    assert m.weight_bytes(1) == 28_672
    assert m.step_time_us(view(decode(10))) == 481


# MoE toy: E = 4, k = 2, dexp = moe_intermediate_size = 32 (else as the dense toy).
# Two decode requests with seq 10: FLOPs each = 49 152 + 5 120 + 656 + mlp, where
#   mlp = L·2t·nMat·d·dexp·k = 2·(2·2·64·32)·2 = 32 768  → 87 696 FLOPs; compute 2·350.784 µs.
# Fixed weight term (divergences.md #8): B = 2 tokens, nEff = E·(1 − ((E−k)/E)^B) = 4·(1 − 0.25) = 3,
#   w_layer = 8 192 + 4 096 + 2·64·32·3 = 24 576 → × L × bpp = 98 304 B.
#   memory = (98 304 + 2·3 072) / 1e8 s = 1044.48 µs > compute 701.568 µs → 1044.
# BLIS checkout (B = 0): nEff = 0, w_layer = 12 288 → 49 152 B;
#   memory = (49 152 + 6 144) / 1e8 s = 552.96 µs < compute → 701.
def test_moe_weight_term_by_hand():
    fixed = RooflineModel(TOY_MOE, NARROW_GPU, 1)
    checkout = RooflineModel(TOY_MOE, NARROW_GPU, 1, moe_weight_batch_zero=True)
    assert fixed.flops(10, 1) == 87_696
    assert fixed.n_eff(2) == 3.0
    assert fixed.n_eff(0) == 0.0
    assert fixed.weight_bytes(2) == 98_304
    batch = view(decode(10), decode(10))
    assert fixed.step_time_us(batch) == 1044
    assert checkout.step_time_us(batch) == 701


def test_moe_batch_counts_prefill_tokens_and_decode_requests():
    m = RooflineModel(TOY_MOE, NARROW_GPU, 1)
    seen = []
    orig = m.weight_bytes
    m.weight_bytes = lambda b: seen.append(b) or orig(b)
    m.step_time_us(view(prefill(0, 5), prefill(3, 2), decode(10, new=0), decode(12)))
    assert seen and set(seen) == {5 + 2 + 2}


def test_moe_single_expert_is_dense():
    one = dataclasses.replace(TOY, num_local_experts=1, num_experts_per_tok=1)
    m = RooflineModel(one, SLOW_GPU, 1)
    assert not m.is_moe and m.n_eff(7) == 1.0
    assert m.step_time_us(view(prefill(0, 4), decode(10))) == 1408


def test_moe_expert_ffn_falls_back_to_intermediate():
    mix = dataclasses.replace(TOY_MOE, moe_intermediate_size=0)
    m = RooflineModel(mix, SLOW_GPU, 1)
    # mlp = 2·(2·2·64·128)·2 = 131 072 → decode FLOPs 49 152 + 5 120 + 656 + 131 072
    assert m.flops(10, 1) == 186_000


@given(st.floats(0.0, 0.999), st.integers(0, 5000))
def test_go_pow_agrees_with_pow_for_integer_exponents(x, n):
    got = go_pow(x, n)
    want = x ** n
    assert got == pytest.approx(want, rel=1e-12, abs=1e-300)


def test_go_pow_exact_cases():
    assert go_pow(0.75, 0) == 1.0
    assert go_pow(0.75, 1) == 0.75
    assert go_pow(0.75, 2) == 0.5625
    assert go_pow(0.0, 3) == 0.0
    assert go_pow(0.5, 2000) == 0.0  # underflow (2^-2000)


ODD = dataclasses.replace(TOY, hidden_size=60, num_heads=7, num_kv_heads=1, intermediate_size=100)  # dh = 60/7
QWEN = dataclasses.replace(TOY, num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=8,
                           intermediate_size=17408)
MODELS = [(TOY, SLOW_GPU, 1), (TOY, NARROW_GPU, 2), (TOY_MOE, NARROW_GPU, 2), (TOY_MOE, SLOW_GPU, 3),
          (ODD, NARROW_GPU, 1), (QWEN, H100, 1), (QWEN, H100, 4), (QWEN, H100, 3)]


@given(st.sampled_from(range(len(MODELS))), st.booleans(),
       st.lists(st.tuples(st.integers(0, 30_000), st.integers(0, 2048)), max_size=3),
       st.lists(st.tuples(st.integers(1, 60_000), st.integers(0, 1)), max_size=300))
def test_step_time_is_bit_identical_to_the_literal_formula(which, zero_b, prefills, decodes):
    """step_time_us (O(1) decode aggregates when provably exact, else the hoisted loop) must equal
    step_time_literal (the formula through flops()/memory_bytes()) on every batch."""
    cfg, gpu, tp = MODELS[which]
    m = RooflineModel(cfg, gpu, tp, moe_weight_batch_zero=zero_b)
    batch = view(*[prefill(s, t) for s, t in prefills], *[decode(s, new) for s, new in decodes])
    want = m.step_time_literal(batch)
    assert m._step_loop(batch) == want
    assert m.step_time_us(batch) == want


def test_literal_reference_matches_hand_values():
    assert RooflineModel(TOY, SLOW_GPU, 1).step_time_literal(view(prefill(0, 4), decode(10))) == 1408
    assert RooflineModel(TOY, NARROW_GPU, 1).step_time_literal(view(decode(10))) == 1177


def test_memory_bound_decode_step_skips_the_per_request_loop():
    m = RooflineModel(TOY, NARROW_GPU, 1)
    assert m._exact_bytes
    def boom(batch):
        raise AssertionError("per-request loop used")
    m._step_loop = boom
    # 1177.6 µs memory vs 481.856 µs compute: decided from the aggregates alone
    assert m.step_time_us(view(decode(10))) == 1177
    slow = RooflineModel(TOY, SLOW_GPU, 1)
    slow._step_loop = boom
    # compute-bound (481.856 µs vs memory 117.76 µs), far from a µs boundary: no loop either
    assert slow.step_time_us(view(decode(10))) == 481
    # seq 78: FLOPs = 114 944 + 552·78 = 158 000 → exactly 632 µs at 2.5e8 FLOP/s. The
    # estimate's ±1e-9 interval straddles 632, so only the exact per-request sum can decide.
    with pytest.raises(AssertionError, match="loop used"):
        slow.step_time_us(view(decode(78)))
    assert RooflineModel(TOY, SLOW_GPU, 1).step_time_us(view(decode(78))) == 632
    odd = RooflineModel(ODD, NARROW_GPU, 1)                     # dh = 60/7: bytes not integers
    assert not odd._exact_bytes
    assert not RooflineModel(TOY, NARROW_GPU, 3)._exact_bytes   # TP 3: /TP is inexact


def test_queueing_and_otpt_from_alpha():
    m = RooflineModel(TOY, SLOW_GPU, 1, alpha=(100.5, 2.25, 7.9))
    assert m.queueing_time_us(prefill(0, 10)) == 123      # to_int64(100.5 + 2.25·10) = 123
    assert m.queueing_time_us(prefill(0, 11)) == 125      # to_int64(100.5 + 24.75) = 125
    assert m.output_token_time_us() == 7
    assert m.post_decode_us() == 0
    cli = RooflineModel.from_config(TOY, SLOW_GPU, 1)
    assert cli.queueing_time_us(prefill(0, 500)) == 0 and cli.output_token_time_us() == 0


def test_from_config_ignores_beta_and_passes_options():
    m = RooflineModel.from_config(TOY_MOE, H100, 2, [0, 0, 0], [1.0, 2.0, 3.0], moe_weight_batch_zero=True)
    assert m.moe_weight_batch_zero and m.tp == 2


BAD = [
    (dict(tp=0), "tensor parallelism"),
    (dict(model=dataclasses.replace(TOY, num_heads=0)), "num_attention_heads"),
    (dict(model=dataclasses.replace(TOY, num_layers=0)), "num_hidden_layers"),
    (dict(model=dataclasses.replace(TOY, hidden_size=0)), "hidden_size"),
    (dict(model=dataclasses.replace(TOY, bytes_per_param=0.0)), "BytesPerParam"),
    (dict(model=dataclasses.replace(TOY, bytes_per_param=math.nan)), "BytesPerParam"),
    (dict(gpu=dataclasses.replace(SLOW_GPU, tflops_peak=0.0)), "TFlopsPeak"),
    (dict(gpu=dataclasses.replace(SLOW_GPU, bw_peak_tbs=math.inf)), "BwPeakTBs"),
    (dict(gpu=dataclasses.replace(SLOW_GPU, mfu_prefill=-0.1)), "mfuPrefill"),
    (dict(gpu=dataclasses.replace(SLOW_GPU, mfu_decode=0.0)), "mfuDecode"),
    (dict(model=dataclasses.replace(TOY, num_local_experts=-1)), "experts"),
    (dict(model=dataclasses.replace(TOY_MOE, num_experts_per_tok=0)), "num_experts_per_tok"),
    (dict(model=dataclasses.replace(TOY_MOE, num_experts_per_tok=5)), "num_experts_per_tok"),
    (dict(model=dataclasses.replace(TOY, num_experts_per_tok=2)), "no experts"),
    (dict(model=dataclasses.replace(TOY_MOE, moe_intermediate_size=-1)), "moe_intermediate_size"),
    (dict(model=dataclasses.replace(TOY_MOE, shared_expert_intermediate_size=-1)), "shared-expert"),
    (dict(gpu=dataclasses.replace(SLOW_GPU, memory_gib=-1.0)), "MemoryGiB"),
    (dict(gpu=dataclasses.replace(SLOW_GPU, tflops_fp8=math.nan)), "TFlopsFP8"),
    (dict(model=dataclasses.replace(TOY, weight_bytes_per_param=-0.5)), "WeightBytesPerParam"),
    (dict(alpha=(1.0, 2.0)), "alpha"),
    (dict(alpha=(1.0, -2.0, 0.0)), "alpha"),
]


@pytest.mark.parametrize("kw,needle", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_validation(kw, needle):
    args = dict(model=TOY, gpu=SLOW_GPU, tp=1, alpha=(0.0, 0.0, 0.0))
    args.update(kw)
    with pytest.raises(ValueError, match=needle):
        RooflineModel(args["model"], args["gpu"], args["tp"], args["alpha"])


def test_validation_accepts_edge_values():
    # E == 1 with any k; zero memory / FP8 / weight bytes are "unknown", not errors.
    RooflineModel(dataclasses.replace(TOY, num_local_experts=1, num_experts_per_tok=3), SLOW_GPU, 1)
    RooflineModel(TOY, dataclasses.replace(SLOW_GPU, memory_gib=0.0), 1)
    RooflineModel(dataclasses.replace(TOY_MOE, num_experts_per_tok=4), SLOW_GPU, 1)
