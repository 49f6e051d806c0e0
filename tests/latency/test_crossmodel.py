"""crossmodel: hand-checked step times, the MoE threshold (divergences.md #9), validation."""

from __future__ import annotations

import dataclasses

import pytest

from blis_simpy.catalog.types import ModelConfig
from blis_simpy.latency import LatencyModel
from blis_simpy.latency.crossmodel import DEFAULT_ALPHA, DEFAULT_BETA, CrossModel
from tests.latency.support import H100, decode, prefill, view

# Qwen3-14B-like: L = 40, H = 40, Hkv = 8, d = 5120 → kv_dim_scaled = 40·8·128 / TP · 1e-6
QWEN = ModelConfig(name="qwen/qwen3-14b", num_layers=40, hidden_size=5120, num_heads=40,
                   num_kv_heads=8, intermediate_size=17408, bytes_per_param=2.0)
# β = 116.110, 1226.868, 19.943, 9445.157 (crossmodel_defaults)
BATCH = (prefill(0, 100), decode(700), decode(800), decode(900))   # 100 prefill + 3 decode tokens


def test_registered_and_defaults():
    assert LatencyModel.lookup("crossmodel") is CrossModel
    assert DEFAULT_BETA == (116.110, 1226.868, 19.943, 9445.157)
    assert DEFAULT_ALPHA == (13732.0, 0.0, 860.6)


def test_dense_tp1_by_hand():
    m = CrossModel.from_config(QWEN, H100, 1)
    assert m.kv_dim_scaled == pytest.approx(0.04096, rel=1e-15)
    # 116.110·40 + 1226.868·3·0.04096 + 19.943·103·0 + 9445.157·0
    # = 4644.4 + 150.75753984 = 4795.15753984 → 4795
    assert m.step_time_us(view(*BATCH)) == 4795
    # a decode request with 0 new tokens contributes nothing to decode_tokens:
    # 4644.4 + 1226.868·2·0.04096 = 4744.905… → 4744
    assert m.step_time_us(view(prefill(0, 100), decode(700), decode(800), decode(900, new=0))) == 4744
    # empty batch: β0·L alone = 4644.4 → 4644 (the engine never asks, but the formula holds)
    assert m.step_time_us(view()) == 4644


def test_moe_and_tp_terms_by_hand():
    moe = dataclasses.replace(QWEN, num_local_experts=8, num_experts_per_tok=2)
    # + 19.943·(100 + 3) = 2054.129 → 6849.28653984 → 6849
    assert CrossModel.from_config(moe, H100, 1).step_time_us(view(*BATCH)) == 6849
    # TP 2: kv_dim_scaled = 0.02048; 4644.4 + 1226.868·3·0.02048 + 9445.157 = 14164.9357… → 14164
    assert CrossModel.from_config(QWEN, H100, 2).step_time_us(view(*BATCH)) == 14164


def test_single_expert_threshold_a7():
    one = dataclasses.replace(QWEN, num_local_experts=1, num_experts_per_tok=1)
    ours = CrossModel.from_config(one, H100, 1)
    blis = CrossModel.from_config(one, H100, 1, checkout_moe_threshold=True)
    assert ours.is_moe == 0.0 and blis.is_moe == 1.0
    assert ours.step_time_us(view(*BATCH)) == 4795          # dense (divergences.md #9)
    assert blis.step_time_us(view(*BATCH)) == 6849          # checkout: E > 0 counts as MoE
    none = CrossModel.from_config(QWEN, H100, 1, checkout_moe_threshold=True)
    assert none.step_time_us(view(*BATCH)) == 4795          # E = 0 is dense under both rules


def test_overheads():
    m = CrossModel.from_config(QWEN, H100, 1, alpha=(13732.0, 1.5, 860.6))
    assert m.queueing_time_us(prefill(0, 11)) == 13748      # 13732 + 1.5·11 = 13748.5
    assert m.output_token_time_us() == 860
    assert m.post_decode_us() == 0


def test_kv_heads_zero_means_heads():
    mha = dataclasses.replace(QWEN, num_kv_heads=0)
    assert CrossModel.from_config(mha, H100, 1).kv_dim_scaled == pytest.approx(40 * 40 * 128 * 1e-6)


@pytest.mark.parametrize("model,tp,beta,needle", [
    (QWEN, 0, DEFAULT_BETA, "tensor parallelism"),
    (dataclasses.replace(QWEN, num_layers=0), 1, DEFAULT_BETA, "num_hidden_layers"),
    (dataclasses.replace(QWEN, num_heads=0), 1, DEFAULT_BETA, "num_attention_heads"),
    (dataclasses.replace(QWEN, hidden_size=0), 1, DEFAULT_BETA, "hidden_size"),
    (QWEN, 1, (1.0, 2.0, 3.0), "at least 4"),
    (QWEN, 1, (1.0, 2.0, float("nan"), 3.0), "finite"),
])
def test_validation(model, tp, beta, needle):
    with pytest.raises(ValueError, match=needle):
        CrossModel(model, tp, DEFAULT_ALPHA, beta)
