"""The ``trained-physics`` backend: BLIS HEAD's default latency model, as published.

A learned linear combination of roofline basis times plus fixed overheads (BLIS
``sim/latency/trained_physics_model.go`` at f90a1e3a; the formula and the default
coefficients are written out in docs/latency-models.md, "trained-physics"). All bases are
µs with ``F = TFlopsPeak·1e6`` FLOP/µs (``TFlopsFP8`` when weights are 1 byte) and
``W = BwPeakTBs·1e6`` B/µs::

    step = β1a·pf_compute + β1b·pf_kv + β2a·dc_compute + β2b·dc_kv + β3·weight
         + β4·(tp_attn + tp_dense_ffn + moe_reduce) + β_EP·moe_dispatch
         + β5·L + β6·B + β7 + β8·nMoE·[interleaved MoE]            -> max(1, int(step))

Coefficient layout ``β[0..10]`` = β1a, β2a, β3, β4, β5, β6, β7, β8, β1b, β2b, β_EP; with 7
or 8 values the prefill and decode terms are ``β·max(compute, kv)``; 9 splits prefill, 10
splits decode too; fewer than 11 set β_EP = β4. α0 = arrival→queue delay, α1 = post-decode
overhead, α2 = per-output-token overhead (TTFT once, every ITL).

BLIS's quirks are kept on purpose (this backend exists for parity with BLIS users): the head
dimension is hidden/heads (``head_dim`` ignored), KV elements are always 2 bytes, prefill
attention uses the whole prompt length for every chunk, all E experts are read every step,
the TP all-reduce is sized on HBM bandwidth, no lm_head or sampling cost.
"""

from __future__ import annotations

import math

from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.latency.base import BatchView, ConstantOverheads, LatencyModel, check_coeffs
from blis_simpy.units import to_int64

#: ``trained_physics_coefficients`` of BLIS HEAD's defaults.yaml (β[0..10], α[0..2]).
DEFAULT_BETA = (0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825,
                481.8613888, 0.0, 1.94710771, 0.752037)
DEFAULT_ALPHA = (15563.199579, 777.3455, 45.907545)
KV_BYTES = 2.0
#: MoE dispatch backends of the all-to-all family (top-k factor); others are all-gather.
ALL_TO_ALL = frozenset({"pplx", "deepep_high_throughput", "deepep_low_latency", "mori",
                        "flashinfer_all2allv"})


class TrainedPhysicsModel(ConstantOverheads, LatencyModel, name="trained-physics"):
    """BLIS HEAD's trained-physics step time."""

    needs_model_config = True

    def __init__(self, model: ModelConfig, gpu: GPUSpec, tp: int = 1, alpha=DEFAULT_ALPHA,
                 beta=DEFAULT_BETA, *, dp: int = 1, moe_backend: str = "allgather_reducescatter"):
        if not isinstance(tp, int) or tp <= 0 or not isinstance(dp, int) or dp <= 0:
            raise ValueError(f"trained-physics: TP and DP must be > 0, got TP {tp}, DP {dp}")
        for label, v in (("num_hidden_layers", model.num_layers), ("hidden_size", model.hidden_size),
                         ("num_attention_heads", model.num_heads)):
            if v <= 0:
                raise ValueError(f"trained-physics: model {label} must be > 0, got {v}")
        H = model.num_heads
        hkv = model.num_kv_heads or H
        if H % tp or hkv % tp:
            raise ValueError(f"trained-physics: attention heads ({H}) and KV heads ({hkv}) must be "
                             f"divisible by TP ({tp})")
        for label, v in (("TFlopsPeak", gpu.tflops_peak), ("BwPeakTBs", gpu.bw_peak_tbs)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"trained-physics: {label} must be finite and > 0, got {v}")
        self.alpha = check_coeffs("alpha", alpha, 3)
        b = check_coeffs("beta", beta, 7)
        self.n_beta = n = len(b)
        b = (b + [0.0] * 11)[:11]
        if n < 11:
            b[10] = b[3]
        self.beta = b
        self.model, self.gpu, self.tp, self.dp = model, gpu, tp, dp

        L = model.num_layers
        d = float(model.hidden_size)
        dh = d / H
        dkv = hkv * dh
        E = model.num_local_experts
        self.is_moe = moe = E >= 2
        s = model.interleave_moe_layer_step
        self.interleaved = moe and s > 0
        if self.interleaved:
            n_moe = L // (s + 1)
        else:
            n_moe = L if moe else 0
        n_dense = L - n_moe
        f_moe = float(model.moe_intermediate_size or model.intermediate_size)
        f_dense = float(model.dense_intermediate_size or model.intermediate_size)
        f_sh = float(model.shared_expert_intermediate_size)
        k_eff = float(max(1, model.num_experts_per_tok))
        group = tp * dp if moe else tp
        wbpp = model.effective_weight_bytes_per_param
        act = model.bytes_per_param or 2.0
        fp8 = wbpp == 1.0 and gpu.tflops_fp8 > 0
        self.F = (gpu.tflops_fp8 if fp8 else gpu.tflops_peak) * 1e6
        self.W = gpu.bw_peak_tbs * 1e6
        tpdp = float(tp * dp)
        self.L, self.n_moe, self.n_dense, self.d, self.dh = L, n_moe, n_dense, d, dh
        self.h = H / tp
        # FLOPs per token (projections + FFNs), per GPU
        self._tok_flops = (L * 2 * d * (2 * d + 2 * dkv) / tpdp
                           + n_moe * (k_eff / group) * 6 * d * f_moe
                           + n_moe * 6 * d * f_sh / tpdp + n_dense * 6 * d * f_dense / tpdp)
        self._kv_tok = L * 2 * (dkv / tpdp) * KV_BYTES
        wb = wbpp or act
        self._t_weight = (L * d * (2 * d + 2 * dkv) * wb / tp + n_moe * (E / group) * 3 * d * f_moe * wb
                          + n_moe * 3 * d * f_sh * wb / tp + n_dense * 3 * d * f_dense * wb / tp) / self.W
        ar = 2.0 * (tp - 1) / tp * d * act / self.W if tp > 1 else 0.0    # V(1, 1)
        self._tp_per_tok = ar * (L / dp + n_dense / dp + (n_moe if moe and dp == 1 and tp > 1 else 0))
        if moe and dp > 1:
            kf = k_eff if moe_backend in ALL_TO_ALL else 1.0
            self._ep_per_tok = n_moe * (1.0 / dp) * kf * (group - 1) / group * 2 * d * act / self.W
        else:
            self._ep_per_tok = 0.0
        self._fixed = b[4] * L + b[6] + (b[7] * n_moe if self.interleaved else 0.0)
        self._dc_ctx_flops = L * 4 * self.h * dh / dp
        self.set_overheads(self.alpha)

    @classmethod
    def from_config(cls, model: ModelConfig, gpu: GPUSpec, tp: int, alpha=None, beta=None, *,
                    dp: int = 1, **_ignored) -> TrainedPhysicsModel:
        """Build from catalog records; ``None`` coefficients select BLIS HEAD's defaults."""
        return cls(model, gpu, tp, DEFAULT_ALPHA if alpha is None else alpha,
                   DEFAULT_BETA if beta is None else beta, dp=dp)

    def basis(self, batch: BatchView) -> dict[str, float]:
        """The basis times (µs) of one step, before the coefficients."""
        t_pf = 0
        a_pf = 0.0
        b_pf = 0
        for r in batch.prefill:
            t = r.num_new_tokens
            if t <= 0:
                continue
            b_pf += 1
            t_pf += t
            a_pf += 4 * self.h * t * (r.input_len + t / 2) * self.dh
        if batch.decode_tokens == batch.decode_count:
            n_dc, ctx = batch.decode_count, batch.decode_pi_sum
        else:
            n_dc = ctx = 0
            for is_pf, pi, nn, _ in batch.entries():
                if not is_pf and nn > 0:
                    n_dc += 1
                    ctx += pi
        n = t_pf + n_dc
        F, W = self.F, self.W
        return {
            "pf_compute": (t_pf * self._tok_flops + self.L * a_pf / self.dp) / F if t_pf else 0.0,
            "pf_kv": self._kv_tok * t_pf / W,
            "dc_compute": (n_dc * self._tok_flops + self._dc_ctx_flops * ctx) / F if n_dc else 0.0,
            "dc_kv": self._kv_tok * (ctx + n_dc) / W if n_dc else 0.0,
            "weight": self._t_weight,
            "tp": self._tp_per_tok * n,
            "ep": self._ep_per_tok * n,
            "batch": float(b_pf + n_dc),
        }

    def step_time_us(self, batch: BatchView) -> int:
        if batch.size == 0:
            return 1
        x = self.basis(batch)
        b = self.beta
        n = self.n_beta
        pf = (b[0] * x["pf_compute"] + b[8] * x["pf_kv"] if n >= 9
              else b[0] * max(x["pf_compute"], x["pf_kv"]))
        dc = (b[1] * x["dc_compute"] + b[9] * x["dc_kv"] if n >= 10
              else b[1] * max(x["dc_compute"], x["dc_kv"]))
        step = (pf + dc + b[2] * x["weight"] + b[3] * x["tp"] + b[10] * x["ep"]
                + b[5] * x["batch"] + self._fixed)
        t = to_int64(step)
        return t if t > 1 else 1


__all__ = ["DEFAULT_ALPHA", "DEFAULT_BETA", "TrainedPhysicsModel"]
