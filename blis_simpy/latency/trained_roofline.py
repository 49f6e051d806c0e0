"""The ``trained-roofline`` backend (docs/latency-models.md): roofline basis functions × learned betas.

Architecture (frozen at construction): ``dh = d // H`` (integer), ``dkv = Hkv·dh``
(``Hkv = 0 ⇒ H``), ``dff = intermediate_size``, ``k_eff = max(1, k)``, ``E`` experts,
``F = TFlopsPeak·1e6`` FLOP/µs, ``W = BwPeakTBs·1e6`` B/µs, ``b = 2`` bytes per element (FP16
always: quantisation is ignored, with a warning). Per step, with ``t_i``/``s_i`` the new tokens
and input length of prefill request i::

    T_pf = Σ t_i ;  T_dc = #decode requests ;  S = Σ PI over decode requests
    A_pf = Σ_i 4·(H/TP)·t_i·(s_i + t_i/2)·dh
    pf_compute = [L·2·T_pf·d·(2d+2dkv)/TP + L·A_pf + L·T_pf·k_eff·6·d·dff/TP] / F   (0 if T_pf = 0)
    pf_kv      = L·2·(dkv/TP)·T_pf·b / W                                              (0 if T_pf = 0)
    dc_compute = [L·2·T_dc·d·(2d+2dkv)/TP + L·4·(H/TP)·S·dh + L·T_dc·k_eff·6·d·dff/TP] / F (0 if T_dc = 0)
    dc_kv      = L·2·(dkv/TP)·b·(S + T_dc) / W                                        (0 if T_dc = 0)
    n_eff      = 1 (dense) ;  MoE: min(E, max(k_eff, (T_pf + T_dc)·k_eff))
    t_weight   = [L·d·(2d+2dkv)·b/TP + L·n_eff·3·d·dff·b/TP] / W
    step = β1·max(pf_compute, pf_kv) + β2·max(dc_compute, dc_kv) + β3·t_weight + β4·0
         + β5·L + β6·len(batch) + β7                  → max(1, to_int64(step)) µs

Overheads: ``queueing_time_us = to_int64(α0)`` (not scaled by input length),
``post_decode_us = to_int64(α1)``, ``OTPT = to_int64(α2)``.

``T_pf``, ``T_dc`` and ``S`` are integer sums, so the batch's O(1) aggregates give exactly
BLIS's values; only ``A_pf`` loops (over the prefill requests, in batch order).

Construction (what the resolution code calls)::

    TrainedRooflineModel.from_config(model: ModelConfig, gpu: GPUSpec, tp: int,
                                     alpha=None, beta=None, *, checkout_moe_threshold=False)

* ``beta`` needs ≥ 7 entries (β1…β7; divergences.md #10: BLIS's ``replay`` wrongly wants 10), ``alpha``
  ≥ 3; all finite and ≥ 0. ``None`` selects ``trained_roofline_defaults``.
* MoE ⇔ more than one expert (divergences.md #9); ``checkout_moe_threshold=True`` uses BLIS
  checkout's ``E > 0``. For this backend the two agree on every input: with ``E = 1`` the MoE
  ``n_eff = min(1, …) = 1``, the dense value.

Invalid inputs raise :class:`ValueError`.
"""

from __future__ import annotations

import logging
import math

from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.latency.base import BatchView, ConstantOverheads, LatencyModel, check_coeffs
from blis_simpy.units import to_int64

log = logging.getLogger("blis_simpy")

#: ``trained_roofline_defaults`` of BLIS's defaults.yaml.
DEFAULT_BETA = (0.7726491335309499, 1.127489556719325, 1.0559901872766853, 0.0,
                43.500541908701074, 48.80613214319187, 0.0)
DEFAULT_ALPHA = (9315.338771116985, 1849.5902371340574, 1.7079389122469397)

#: bytes per element: the basis functions assume FP16/BF16 whatever the checkpoint.
BYTES_PER_ELEMENT = 2.0


class TrainedRooflineModel(ConstantOverheads, LatencyModel, name="trained-roofline"):
    """Learned weights over prefill/decode roofline terms, weight reads, layers and batch size."""

    needs_model_config = True

    def __init__(self, model: ModelConfig, gpu: GPUSpec, tp: int, alpha=DEFAULT_ALPHA,
                 beta=DEFAULT_BETA, *, checkout_moe_threshold: bool = False):
        if not isinstance(tp, int) or tp <= 0:
            raise ValueError(f"trained-roofline: tensor parallelism must be > 0, got {tp}")
        for label, v in (("num_hidden_layers", model.num_layers), ("num_attention_heads", model.num_heads),
                         ("hidden_size", model.hidden_size), ("intermediate_size", model.intermediate_size)):
            if v <= 0:
                raise ValueError(f"trained-roofline: model {label} must be > 0, got {v}")
        hkv_i = model.num_kv_heads or model.num_heads
        if model.num_heads % tp:
            raise ValueError(f"trained-roofline: num_attention_heads ({model.num_heads}) must be "
                             f"divisible by TP ({tp})")
        if hkv_i % tp:
            raise ValueError(f"trained-roofline: num_key_value_heads ({hkv_i}) must be divisible by TP ({tp})")
        for label, v in (("TFlopsPeak", gpu.tflops_peak), ("BwPeakTBs", gpu.bw_peak_tbs)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"trained-roofline: {label} must be finite and > 0, got {v}")
        self.alpha = check_coeffs("alpha", alpha, 3)
        self.beta = check_coeffs("beta", beta, 7)[:7]
        self.model = model
        self.gpu = gpu
        self.tp = tp
        wbpp = model.weight_bytes_per_param
        if wbpp > 0 and wbpp != model.bytes_per_param:
            log.warning("trained-roofline: model %s has quantised weights (%g bytes/param); the "
                        "basis functions assume %g-byte weights and ignore quantisation",
                        model.name or "?", wbpp, BYTES_PER_ELEMENT)

        E = model.num_local_experts
        self.is_moe = E > 0 if checkout_moe_threshold else E > 1
        L = float(model.num_layers)
        d = float(model.hidden_size)
        dh = float(model.hidden_size // model.num_heads)
        dkv = float(hkv_i) * dh
        dff = float(model.intermediate_size)
        tpf = float(tp)
        h_tp = float(model.num_heads // tp)
        self.k_eff = float(max(1, model.num_experts_per_tok))
        self.E = float(E)
        self.L, self.d, self.dh, self.dkv, self.dff, self.h_tp, self.tpf = L, d, dh, dkv, dff, h_tp, tpf
        self.F = gpu.tflops_peak * 1e6
        self.W = gpu.bw_peak_tbs * 1e6
        b = BYTES_PER_ELEMENT
        self._attn_w = 2 * d + 2 * dkv              # (2d + 2dkv)
        self._kv_tp = dkv / tpf                     # dkv/TP (exact: Hkv % TP == 0)
        # weight-read terms: [L·d·(2d+2dkv)·b/TP + L·n_eff·3·d·dff·b/TP] / W
        self._w_attn = L * d * self._attn_w * b / tpf
        b1, b2, b3, b4, b5, b6, b7 = self.beta
        self._b1, self._b2, self._b3, self._b6 = b1, b2, b3, b6
        self._b4_tp = b4 * 0.0                      # t_tp = 0
        self._b5_L = b5 * L
        self._b7 = b7
        if not self.is_moe:
            self._t_weight_dense = (self._w_attn + L * 1.0 * 3 * d * dff * b / tpf) / self.W
        self.set_overheads(self.alpha)

    @classmethod
    def from_config(cls, model: ModelConfig, gpu: GPUSpec, tp: int, alpha=None, beta=None,
                    **opts) -> TrainedRooflineModel:
        """Build from catalog records; ``opts``: ``checkout_moe_threshold``."""
        return cls(model, gpu, tp, DEFAULT_ALPHA if alpha is None else alpha,
                   DEFAULT_BETA if beta is None else beta, **opts)

    def t_weight(self, tokens: int) -> float:
        """Weight-read time (µs) for a step routing ``tokens`` tokens."""
        if not self.is_moe:
            return self._t_weight_dense
        n_eff = min(self.E, max(self.k_eff, tokens * self.k_eff))
        return (self._w_attn + self.L * n_eff * 3 * self.d * self.dff * BYTES_PER_ELEMENT / self.tpf) / self.W

    def step_time_us(self, batch: BatchView) -> int:
        if batch.size == 0:
            return 1
        L, d, tpf, F, W = self.L, self.d, self.tpf, self.F, self.W
        b = BYTES_PER_ELEMENT
        t_pf = 0
        pf = 0.0
        if batch.prefill:
            a_pf = 0.0
            h4, dh = 4 * self.h_tp, self.dh
            for r in batch.prefill:
                t = r.num_new_tokens
                t_pf += t
                a_pf += h4 * t * (r.input_len + t / 2) * dh
            if t_pf:
                comp = (L * 2 * t_pf * d * self._attn_w / tpf + L * a_pf
                        + L * t_pf * self.k_eff * 6 * d * self.dff / tpf) / F
                kv = L * 2 * self._kv_tp * t_pf * b / W
                pf = comp if comp > kv else kv
        t_dc = batch.decode_count
        dc = 0.0
        if t_dc:
            s = batch.decode_pi_sum
            comp = (L * 2 * t_dc * d * self._attn_w / tpf + L * 4 * self.h_tp * s * self.dh
                    + L * t_dc * self.k_eff * 6 * d * self.dff / tpf) / F
            kv = L * 2 * self._kv_tp * b * (s + t_dc) / W
            dc = comp if comp > kv else kv
        step = (self._b1 * pf + self._b2 * dc + self._b3 * self.t_weight(t_pf + t_dc) + self._b4_tp
                + self._b5_L + self._b6 * batch.size + self._b7)
        out = to_int64(step)
        return out if out > 1 else 1


__all__ = ["BYTES_PER_ELEMENT", "DEFAULT_ALPHA", "DEFAULT_BETA", "TrainedRooflineModel"]
