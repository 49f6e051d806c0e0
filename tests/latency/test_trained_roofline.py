"""trained-roofline: hand-checked step times, overheads, 7 betas and the MoE threshold
(divergences.md #10, #9), checks."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from blis_simpy.latency import LatencyModel
from blis_simpy.latency.trained_roofline import DEFAULT_ALPHA, DEFAULT_BETA, TrainedRooflineModel
from tests.latency.support import SLOW_GPU, TOY, TOY_MOE, Req, decode, prefill, view

# Toy model: L = 2, d = 64, H = 4, Hkv = 2 → dh = 64 // 4 = 16, dkv = 32; dff = 128; b = 2.
# SLOW_GPU: F = 0.001·1e6 = 1000 FLOP/µs, W = 0.001·1e6 = 1000 B/µs. TP = 1.
# β1…β7 = 1, 1, 1, 0, 10, 5, 3.
BETA = (1.0, 1.0, 1.0, 0.0, 10.0, 5.0, 3.0)
ALPHA = (100.7, 200.9, 3.5)
# Batch: a prefill chunk (PI 4, 4 new tokens, input length 8) and a decode request at PI 10.
#   T_pf = 4, T_dc = 1, S = 10
#   A_pf = 4·(H/TP)·t·(s + t/2)·dh = 4·4·4·(8 + 2)·16 = 10 240       (s = input length!)
#   pf_compute = [L·2·T_pf·d·(2d+2dkv)/TP + L·A_pf + L·T_pf·k_eff·6·d·dff/TP] / F
#              = [2·2·4·64·192 + 2·10 240 + 2·4·1·6·64·128] / 1000
#              = [196 608 + 20 480 + 393 216] / 1000 = 610.304 µs
#   pf_kv      = L·2·(dkv/TP)·T_pf·b / W = 2·2·32·4·2 / 1000 = 1.024 µs
#   dc_compute = [2·2·1·64·192 + 2·4·4·10·16 + 2·1·1·6·64·128] / 1000
#              = [49 152 + 5 120 + 98 304] / 1000 = 152.576 µs
#   dc_kv      = L·2·(dkv/TP)·b·(S + T_dc) / W = 2·2·32·2·11 / 1000 = 2.816 µs
#   t_weight   = [L·d·(2d+2dkv)·b/TP + L·1·3·d·dff·b/TP] / W = [49 152 + 98 304] / 1000 = 147.456
#   step = 610.304 + 152.576 + 147.456 + 0 + 10·2 + 5·2 + 3 = 943.336 → 943
BATCH = (prefill(4, 4, input_len=8), decode(10))


def model(cfg=TOY, gpu=SLOW_GPU, tp=1, **kw):
    return TrainedRooflineModel(cfg, gpu, tp, ALPHA, BETA, **kw)


def test_registered_and_defaults():
    assert LatencyModel.lookup("trained-roofline") is TrainedRooflineModel
    assert len(DEFAULT_BETA) == 7 and DEFAULT_BETA[4] == 43.500541908701074
    assert DEFAULT_ALPHA[1] == 1849.5902371340574


def test_dense_step_by_hand():
    m = model()
    assert m.step_time_us(view(*BATCH)) == 943
    # a request that is neither prefill nor decode still counts in len(batch): + β6 = 5
    idle = Req(pi=10, input_len=10, num_new_tokens=0, output_len=0)
    assert m.step_time_us(view(*BATCH, idle)) == 948


def test_memory_bound_terms_by_hand():
    # W = 1 B/µs: pf = max(610.304, 1024) = 1024, dc = max(152.576, 2816) = 2816,
    # t_weight = 147 456 → 1024 + 2816 + 147 456 + 33 = 151 329
    gpu = dataclasses.replace(SLOW_GPU, bw_peak_tbs=1e-6)
    assert model(gpu=gpu).step_time_us(view(*BATCH)) == 151_329


def test_moe_step_by_hand():
    # E = 4, k = 2 → k_eff = 2; dff stays intermediate_size = 128 (not the expert dim).
    #   pf_compute = [196 608 + 20 480 + 2·4·2·6·64·128] / 1000 = 1003.52
    #   dc_compute = [49 152 + 5 120 + 2·1·2·6·64·128] / 1000 = 250.88
    #   n_eff = min(4, max(2, (4 + 1)·2)) = 4
    #   t_weight = [49 152 + 2·4·3·64·128·2] / 1000 = 442.368
    #   step = 1003.52 + 250.88 + 442.368 + 33 = 1729.768 → 1729
    assert model(TOY_MOE).step_time_us(view(*BATCH)) == 1729
    # one decode only: n_eff = min(4, max(2, 1·2)) = 2
    m = model(TOY_MOE)
    assert m.t_weight(1) == pytest.approx((49_152 + 2 * 2 * 3 * 64 * 128 * 2) / 1000)


def test_single_expert_is_dense_under_both_thresholds():
    one = dataclasses.replace(TOY, num_local_experts=1, num_experts_per_tok=1)
    assert not model(one).is_moe
    assert model(one, checkout_moe_threshold=True).is_moe
    # n_eff = min(1, …) = 1 and k_eff = 1: the two rules give the same time (divergences.md #9)
    assert model(one).step_time_us(view(*BATCH)) == model(one, checkout_moe_threshold=True).step_time_us(
        view(*BATCH)) == 943


def test_empty_batch_is_one_tick():
    assert model().step_time_us(view()) == 1


def test_overheads():
    m = model()
    assert m.queueing_time_us(prefill(0, 5000)) == 100      # α0, not scaled by input length
    assert m.post_decode_us() == 200         # α1
    assert m.output_token_time_us() == 3         # α2


def test_seven_betas_are_enough_and_extra_ones_ignored():
    TrainedRooflineModel.from_config(TOY, SLOW_GPU, 1)                       # defaults: 7
    m = TrainedRooflineModel(TOY, SLOW_GPU, 1, ALPHA, BETA + (99.0, 99.0, 99.0))
    assert m.step_time_us(view(*BATCH)) == 943
    with pytest.raises(ValueError, match="at least 7"):
        TrainedRooflineModel(TOY, SLOW_GPU, 1, ALPHA, BETA[:6])


def test_quantised_model_warns(caplog):
    q = dataclasses.replace(TOY, weight_bytes_per_param=0.5, name="x/y-w4a16")
    with caplog.at_level(logging.WARNING, logger="blis_simpy"):
        m = model(q)
    assert any("quantis" in r.getMessage() for r in caplog.records)
    assert m.step_time_us(view(*BATCH)) == 943          # quantisation ignored (b = 2)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="blis_simpy"):
        model()
    assert not caplog.records


@pytest.mark.parametrize("cfg,tp,needle", [
    (TOY, 0, "tensor parallelism"),
    (dataclasses.replace(TOY, intermediate_size=0), 1, "intermediate_size"),
    (dataclasses.replace(TOY, num_layers=0), 1, "num_hidden_layers"),
    (TOY, 3, "num_attention_heads .* divisible"),
    (dataclasses.replace(TOY, num_heads=8, hidden_size=128, num_kv_heads=3), 2, "num_key_value_heads"),
])
def test_validation(cfg, tp, needle):
    with pytest.raises(ValueError, match=needle):
        model(cfg, tp=tp)


def test_gpu_validation():
    with pytest.raises(ValueError, match="BwPeakTBs"):
        model(gpu=dataclasses.replace(SLOW_GPU, bw_peak_tbs=0.0))
    with pytest.raises(ValueError, match="TFlopsPeak"):
        model(gpu=dataclasses.replace(SLOW_GPU, tflops_peak=float("inf")))
