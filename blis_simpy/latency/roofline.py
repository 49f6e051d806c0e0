"""The analytical ``roofline`` backend (docs/latency-models.md), BLIS's default.

One forward pass per step: the step takes ``max(compute time, memory time)``, where compute
is the FLOPs of every request at the GPU's peak × MFU (FP8 peak for 1-byte weights) and memory
is the per-step weight read plus each request's activations and KV reads/writes at the HBM
bandwidth. No overhead terms, no bandwidth haircut. Tensor parallelism divides both.

Construction (what the resolution code calls)::

    RooflineModel.from_config(model: ModelConfig, gpu: GPUSpec, tp: int,
                              alpha=None, beta=None, *, moe_weight_batch_zero=False)

* ``alpha`` (≥ 3 finite, non-negative; default zeros, which is what BLIS's CLI always uses):
  ``queueing_time_us = to_int64(α0 + α1·input_len)``, ``OTPT = to_int64(α2)``.
* ``beta`` is accepted for a uniform signature and ignored (roofline has no coefficients).
* ``moe_weight_batch_zero=True`` reproduces BLIS checkout 89bece82, which evaluates the
  per-step MoE weight bytes with a batch of 0 tokens, so ``nEff = 0`` and the expert weights
  are never read (docs/divergences.md #8). The default is upstream's fix: ``B = Σ prefill new tokens +
  number of decode requests``. Dense models are unaffected.

Invalid inputs raise :class:`ValueError` (the resolution code turns it into a ConfigError).

Floating-point order: every per-request FLOP and byte count is an integer (or, for a causal
prefill, a half-integer) far below 2^53 for real models, so it is exact whatever the
association; the per-request compute seconds are accumulated prefill requests first, then
decode requests, each in batch order, as BLIS does. See docs/latency-models.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.latency.base import BatchView, LatencyModel, check_coeffs
from blis_simpy.units import to_int64

#: MLP matrix count used by roofline step time (always 2, whatever ``hidden_act`` says).
N_MAT = 2.0
_TWO53 = 2**53


def go_pow(x: float, y: int) -> float:
    """Go's ``math.Pow(x, y)`` for ``x >= 0`` finite and ``y`` a non-negative integer.

    Go computes integer powers by repeated squaring of the ``Frexp`` mantissa (pure Go on
    every platform BLIS runs on), which can differ from C's ``pow`` in the last bit.
    """
    if y == 0 or x == 1.0:
        return 1.0
    if y == 1:
        return x
    if x == 0.0:
        return 0.0
    a1, ae = 1.0, 0
    x1, xe = math.frexp(x)
    i = int(y)
    while i != 0:
        if xe < -(1 << 12) or (1 << 12) < xe:   # catastrophic over/underflow: Ldexp handles it
            ae += xe
            break
        if i & 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    return math.ldexp(a1, ae)


class MemoryBytes(NamedTuple):
    """Bytes moved by one request's forward pass (whole model, before the TP split)."""

    activations: float
    kv_read: float
    kv_write: float
    weights: float
    total: float


def _finite_pos(v: float) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _zero_or_finite_pos(v: float) -> bool:
    return v == 0 or _finite_pos(v)


def validate_roofline_inputs(model: ModelConfig, gpu: GPUSpec, tp: int) -> None:
    """The roofline's construction checks; raises ValueError naming the offending value."""
    if not isinstance(tp, int) or tp <= 0:
        raise ValueError(f"roofline: tensor parallelism must be > 0, got {tp}")
    for label, v in (("num_attention_heads", model.num_heads), ("num_hidden_layers", model.num_layers),
                     ("hidden_size", model.hidden_size)):
        if v <= 0:
            raise ValueError(f"roofline: model {label} must be > 0, got {v}")
    for label, v in (("BytesPerParam (torch_dtype)", model.bytes_per_param),
                     ("TFlopsPeak", gpu.tflops_peak), ("BwPeakTBs", gpu.bw_peak_tbs),
                     ("mfuPrefill", gpu.mfu_prefill), ("mfuDecode", gpu.mfu_decode)):
        if not _finite_pos(v):
            raise ValueError(f"roofline: {label} must be finite and > 0, got {v}")
    E, k = model.num_local_experts, model.num_experts_per_tok
    if E < 0:
        raise ValueError(f"roofline: number of experts must be >= 0, got {E}")
    if E > 1 and not 0 < k <= E:
        raise ValueError(f"roofline: num_experts_per_tok must be in (0, {E}] for an MoE model, got {k}")
    if E == 0 and k != 0:
        raise ValueError(f"roofline: num_experts_per_tok is {k} but the model has no experts")
    if model.moe_intermediate_size < 0:
        raise ValueError(f"roofline: moe_intermediate_size must be >= 0, got {model.moe_intermediate_size}")
    if model.shared_expert_intermediate_size < 0:
        raise ValueError("roofline: shared-expert intermediate size must be >= 0, got "
                         f"{model.shared_expert_intermediate_size}")
    for label, v in (("MemoryGiB", gpu.memory_gib), ("TFlopsFP8", gpu.tflops_fp8),
                     ("WeightBytesPerParam", model.weight_bytes_per_param)):
        if not _zero_or_finite_pos(v):
            raise ValueError(f"roofline: {label} must be 0 or finite and > 0, got {v}")


class RooflineModel(LatencyModel, name="roofline"):
    """Single-crossover roofline: ``step = max(Σ compute, (weights + Σ dynamic bytes)/bw)``."""

    needs_model_config = True

    def __init__(self, model: ModelConfig, gpu: GPUSpec, tp: int, alpha=(0.0, 0.0, 0.0), *,
                 moe_weight_batch_zero: bool = False):
        validate_roofline_inputs(model, gpu, tp)
        self.alpha = check_coeffs("alpha", alpha, 3)
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.moe_weight_batch_zero = bool(moe_weight_batch_zero)
        self._otpt = to_int64(self.alpha[2])

        d = float(model.hidden_size)
        L = float(model.num_layers)
        H = float(model.num_heads)
        hkv = float(model.num_kv_heads or model.num_heads)
        dh = d / H
        dkv = hkv * dh
        dff = float(model.intermediate_size) if model.intermediate_size > 0 else 4.0 * d
        self.is_moe = model.num_local_experts > 1
        E = float(model.num_local_experts)
        k = float(model.num_experts_per_tok)
        dexp = float(model.moe_intermediate_size) if (self.is_moe and model.moe_intermediate_size > 0) else dff
        bpp = float(model.bytes_per_param)
        wbpp = float(model.effective_weight_bytes_per_param)
        self.d, self.L, self.H, self.hkv, self.dh, self.dkv = d, L, H, hkv, dh, dkv
        self.dff, self.dexp, self.E, self.k, self.bpp, self.wbpp = dff, dexp, E, k, bpp, wbpp
        self.fp8 = wbpp == 1.0 and gpu.tflops_fp8 > 0
        self.peak = (gpu.tflops_fp8 if self.fp8 else gpu.tflops_peak) * 1e12
        self.bw = gpu.bw_peak_tbs * 1e12
        self.tpf = float(tp)
        self._pf_denom = self.peak * gpu.mfu_prefill
        self._dc_denom = self.peak * gpu.mfu_decode
        # moe: (E - k)/E, the chance one token misses a given expert
        self._miss = (E - k) / E if self.is_moe else 0.0

        # Decode fast path (t = 1, ctx = seq): the same operations as flops()/memory_bytes()
        # with every seq-independent left-prefix evaluated once, so results are bit-identical.
        t = 1.0
        self._dc_gemm0 = L * (2 * t * (d * d + 2 * d * dkv) + 2 * t * d * d)
        self._dc_attn = L * 4 * H * t            # · seq · dh
        self._dc_sram = 5 * H * t                # L · (· seq + 2·t·d)
        self._dc_sram_c = 2 * t * d
        self._dc_mlp = L * self._mlp(t)
        self._dc_acts = L * d * bpp * t
        self._kv_coef = 2 * L * hkv * dh * bpp   # · tokens
        self._dc_kvw = self._kv_coef * t
        # O(1) decode aggregates (see step_time_us): Σ FLOPs = n·fixed + per_seq·Σ seq (an
        # estimate used only as a bound), and integer byte coefficients when they are exact.
        self._dc_flops_fixed = self._dc_gemm0 + self._dc_mlp + L * self._dc_sram_c
        self._dc_flops_per_seq = self._dc_attn * dh + L * self._dc_sram
        ints = (self._kv_coef, L * d * bpp, self._dc_acts + self._dc_kvw)
        self._exact_bytes = tp & (tp - 1) == 0 and all(x.is_integer() and x < _TWO53 for x in ints)
        if self._exact_bytes:
            self._kv_int = int(self._kv_coef)
            self._acts_int = int(L * d * bpp)
            self._dc_fixed_int = int(self._dc_acts + self._dc_kvw)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, model: ModelConfig, gpu: GPUSpec, tp: int, alpha=None, beta=None,
                    **opts) -> RooflineModel:
        """Build from catalog records. ``beta`` is ignored; ``opts``: ``moe_weight_batch_zero``."""
        return cls(model, gpu, tp, (0.0, 0.0, 0.0) if alpha is None else alpha, **opts)

    # ------------------------------------------------------------------ the formulas
    def _mlp(self, t: float) -> float:
        mlp = 2 * t * N_MAT * self.d * self.dexp
        if self.is_moe:
            mlp *= self.k
        return mlp

    def flops(self, seq: int, t: int) -> float:
        """FLOPs of ``t`` new tokens attending to ``seq`` past tokens (whole model, all GPUs)."""
        d, L, H, dh, dkv = self.d, self.L, self.H, self.dh, self.dkv
        tf = float(t)
        s = float(seq)
        gemm = L * (2 * tf * (d * d + 2 * d * dkv) + 2 * tf * d * d)
        ctx = s if t <= 1 else s + (tf - 1) / 2
        gemm += L * 4 * H * tf * ctx * dh
        sram = L * (5 * H * tf * ctx + 2 * tf * d)
        gemm += L * self._mlp(tf)
        return gemm + sram

    def n_eff(self, batch_tokens: int) -> float:
        """Expected number of distinct experts ``B`` routed tokens touch (1 for a dense model)."""
        if not self.is_moe:
            return 1.0
        return self.E * (1 - go_pow(self._miss, batch_tokens))

    def weight_bytes(self, batch_tokens: int) -> float:
        """Weight bytes read in one step for ``batch_tokens`` routed tokens (all GPUs)."""
        d, dkv = self.d, self.dkv
        w_layer = d * (d + 2 * dkv) + d * d + N_MAT * d * self.dexp * self.n_eff(batch_tokens)
        return w_layer * self.L * self.wbpp

    def memory_bytes(self, seq: int, t: int, include_kv: bool = True,
                     batch_tokens: int = 0) -> MemoryBytes:
        """Bytes one request moves; ``weights`` uses ``batch_tokens`` for the MoE ``nEff``."""
        kv_w = self._kv_coef * t if include_kv else 0.0
        kv_r = self._kv_coef * seq if include_kv else 0.0
        acts = self.L * self.d * self.bpp * t
        w = self.weight_bytes(batch_tokens)
        return MemoryBytes(acts, kv_r, kv_w, w, acts + kv_r + kv_w + w)

    # ------------------------------------------------------------------ LatencyModel
    def step_time_us(self, batch: BatchView) -> int:
        """One step's duration (µs); bit-identical to :meth:`step_time_literal`.

        Fast path (decode requests in O(1) instead of O(batch)), taken only when provably exact:

        * memory: when every per-request byte count is an integer, TP is a power of two and the
          batch's byte total is below 2^53, each ``bytes/TP`` and every partial sum of the
          literal loop is exact, so the total equals ``Σ integer bytes / TP`` from the batch
          aggregates (``decode_count``, ``decode_pi_sum``), bit for bit.
        * compute: the literal sum of rounded per-request quotients lies within a relative
          ``(n + 4)·2^-53`` of the exact sum, so inside ``[est·(1 − 1e-9), est·(1 + 1e-9)]`` for
          the O(1) estimate ``est`` (n ≤ 10^6). If that interval is below the memory time the
          step is memory-bound; if it is above and truncates to one integer µs throughout, that
          integer is the answer. Otherwise (a crossover or a µs boundary within ~1e-9 relative)
          the decode requests are summed one by one, in batch order.
        """
        prefill = batch.prefill
        n_dc = batch.decode_count
        if not prefill and n_dc == 0:
            return 1
        if not self._exact_bytes or n_dc == 0 or n_dc > 1_000_000:
            return self._step_loop(batch)
        tpf = self.tpf
        compute_s = 0.0
        num = 0          # integer byte numerator of the dynamic term
        tokens = 0
        if prefill:
            denom = self._pf_denom
            flops = self.flops
            kv = self._kv_int
            ad = self._acts_int
            for r in prefill:
                t = r.num_new_tokens
                compute_s += flops(r.pi, t) / tpf / denom
                num += ad * t + kv * r.pi + kv * t
                tokens += t
        S = batch.decode_pi_sum
        num += n_dc * self._dc_fixed_int + self._kv_int * S
        if num >= _TWO53:
            return self._step_loop(batch)
        tokens += n_dc
        wb = self.weight_bytes(0 if self.moe_weight_batch_zero else tokens) / tpf
        memory_s = (wb + num / tpf) / self.bw
        est = compute_s + (n_dc * self._dc_flops_fixed + self._dc_flops_per_seq * S) / tpf / self._dc_denom
        hi = est * (1 + 1e-9)
        if hi < memory_s:                       # surely memory-bound
            t_us = to_int64(memory_s * 1e6)
            return t_us if t_us > 1 else 1
        lo = est * (1 - 1e-9)
        if lo > memory_s:                       # surely compute-bound ...
            t_us = to_int64(lo * 1e6)
            if t_us == to_int64(hi * 1e6):      # ... and the whole interval truncates alike
                return t_us if t_us > 1 else 1
        return self._step_loop(batch)

    def _step_loop(self, batch: BatchView) -> int:
        """The per-request loop of the roofline formula with seq-independent factors hoisted."""
        prefill = batch.prefill
        if not prefill and batch.decode_count == 0:
            return 1
        tpf = self.tpf
        compute_s = 0.0
        dyn = 0.0
        tokens = 0
        if prefill:
            denom = self._pf_denom
            flops = self.flops
            kv = self._kv_coef
            ad = self.L * self.d * self.bpp
            for r in prefill:
                t = r.num_new_tokens
                compute_s += flops(r.pi, t) / tpf / denom
                dyn += (ad * t + kv * r.pi + kv * t) / tpf
                tokens += t
        if batch.decode_count:
            denom = self._dc_denom
            g0, ca, cs, cc, cm = self._dc_gemm0, self._dc_attn, self._dc_sram, self._dc_sram_c, self._dc_mlp
            L, dh = self.L, self.dh
            acts, kv, kvw = self._dc_acts, self._kv_coef, self._dc_kvw
            for is_pf, pi, _, _ in batch.entries():
                if is_pf:
                    continue
                s = float(pi)
                f = g0 + ca * s * dh + cm + L * (cs * s + cc)
                compute_s += f / tpf / denom
                dyn += (acts + kv * s + kvw) / tpf
                tokens += 1
        wb = self.weight_bytes(0 if self.moe_weight_batch_zero else tokens) / tpf
        memory_s = (wb + dyn) / self.bw
        t_us = to_int64((compute_s if compute_s > memory_s else memory_s) * 1e6)
        return t_us if t_us > 1 else 1

    def step_time_literal(self, batch: BatchView) -> int:
        """The roofline formula written out with :meth:`flops` and :meth:`memory_bytes` (the reference)."""
        prefill = batch.prefill
        decodes = [pi for is_pf, pi, _, _ in batch.entries() if not is_pf]
        if not prefill and not decodes:
            return 1
        compute_s = 0.0
        dyn = 0.0
        for r in prefill:
            compute_s += self.flops(r.pi, r.num_new_tokens) / self.tpf / self._pf_denom
            mb = self.memory_bytes(r.pi, r.num_new_tokens, True)
            dyn += (mb.activations + mb.kv_read + mb.kv_write) / self.tpf
        for pi in decodes:
            compute_s += self.flops(pi, 1) / self.tpf / self._dc_denom
            mb = self.memory_bytes(pi, 1, True)
            dyn += (mb.activations + mb.kv_read + mb.kv_write) / self.tpf
        tokens = sum(r.num_new_tokens for r in prefill) + len(decodes)
        wb = self.weight_bytes(0 if self.moe_weight_batch_zero else tokens) / self.tpf
        memory_s = (wb + dyn) / self.bw
        return max(1, to_int64(max(compute_s, memory_s) * 1e6))

    def queueing_time_us(self, req) -> int:
        return to_int64(self.alpha[0] + self.alpha[1] * req.input_len)

    def output_token_time_us(self) -> int:
        return self._otpt


__all__ = ["MemoryBytes", "RooflineModel", "go_pow", "validate_roofline_inputs"]
