"""``trained-physics``: BLIS HEAD's published formula and default coefficients.

The three sanity figures are the worked examples of BLIS HEAD's model on Llama-3.1-8B and
an H100 (989.5 TFLOPS, 3.35 TB/s), docs/latency-models.md "trained-physics":
32 decodes at context 1000 ≈ 9.41 ms at TP 1 and ≈ 5.36 ms at TP 2; one 1024-token prefill
≈ 9.16 ms.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.models import builtin_models
from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.latency.base import BatchView
from blis_simpy.latency.trained_physics import DEFAULT_BETA, TrainedPhysicsModel

LLAMA = builtin_models().get("meta-llama/llama-3.1-8b-instruct")
H100 = builtin_gpus().get("H100")
DECODE32 = BatchView(decode_count=32, decode_tokens=32, decode_pi_sum=32_000, size=32)
PREFILL = BatchView.of([NS(pi=0, input_len=1024, num_new_tokens=1024, output_len=10)])


def test_decode_sanity_figures():
    m = TrainedPhysicsModel(LLAMA, H100, 1)
    x = m.basis(DECODE32)
    assert x["weight"] == pytest.approx(4167, abs=1)      # T_weight
    assert x["dc_kv"] == pytest.approx(1253, abs=1)
    # 1.3625·4167 + 1.9471·1253 + 32.095·32 + 4.4168·32 + 126.02
    assert m.step_time_us(DECODE32) == 9412
    assert TrainedPhysicsModel(LLAMA, H100, 2).step_time_us(DECODE32) == 5356


def test_prefill_sanity_figure():
    m = TrainedPhysicsModel(LLAMA, H100, 1)
    assert m.basis(PREFILL)["pf_compute"] == pytest.approx(15279, abs=1)
    assert m.step_time_us(PREFILL) == 9159


def test_alphas_enter_outside_the_step():
    m = TrainedPhysicsModel(LLAMA, H100, 1)
    assert (m.queueing_time_us(NS(input_len=5000)), m.post_decode_us(),
            m.output_token_time_us()) == (15563, 777, 45)


def test_seven_betas_take_the_max_of_compute_and_kv():
    beta = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    m = TrainedPhysicsModel(LLAMA, H100, 1, beta=beta)
    x = m.basis(DECODE32)
    assert m.step_time_us(DECODE32) == int(max(x["dc_compute"], x["dc_kv"]))
    m10 = TrainedPhysicsModel(LLAMA, H100, 1, beta=beta + [0.0, 1.0, 1.0])
    assert m10.step_time_us(DECODE32) == int(x["dc_compute"] + x["dc_kv"])


def test_head_dim_is_ignored_as_in_blis():
    """Qwen3 declares head_dim 128; BLIS's step time uses hidden/heads = 5120/40 = 128 for
    Qwen3-14B but 5120/64 = 80 for Qwen3-32B."""
    q32 = builtin_models().get("qwen/qwen3-32b")
    assert TrainedPhysicsModel(q32, H100, 1).dh == 80


def test_moe_charges_every_expert_and_ep_dispatch_needs_dp():
    moe = ModelConfig(num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=2, intermediate_size=16,
                      vocab_size=32, bytes_per_param=2.0, num_local_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=4)
    g = GPUSpec(name="u", tflops_peak=1e-6, tflops_fp8=0, bw_peak_tbs=1e-6, mfu_prefill=1, mfu_decode=1,
                memory_gib=1)
    m = TrainedPhysicsModel(moe, g, 1)
    # L·d·(2d + 2dkv)·2/TP + nMoE·E·3·d·f_moe·2 = 2·8·32·2 + 2·4·3·8·4·2
    assert m.basis(DECODE32)["weight"] == 2 * 8 * 32 * 2 + 2 * 4 * 3 * 8 * 4 * 2
    assert m.basis(DECODE32)["ep"] == 0
    m2 = TrainedPhysicsModel(moe, g, 1, dp=2)
    # nMoE·(N/DP)·(G−1)/G·2·d·2 with N = 32, G = 2
    assert m2.basis(DECODE32)["ep"] == 2 * 16 * 0.5 * 2 * 8 * 2


def test_defaults_and_validation():
    assert len(DEFAULT_BETA) == 11
    with pytest.raises(ValueError, match="divisible by TP"):
        TrainedPhysicsModel(LLAMA, H100, 3)
    with pytest.raises(ValueError, match="at least 7"):
        TrainedPhysicsModel(LLAMA, H100, 1, beta=[1.0] * 6)
