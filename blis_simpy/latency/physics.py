"""The ``physics`` latency backend: a step's time from the bytes and FLOPs it moves.

Each basis of :mod:`blis_simpy.latency.physics_terms` is multiplied by its coefficient; the
bases are grouped by the GPU kernels that execute them, and a kernel group takes the longer
of its compute and its memory time (a roofline per kernel group, so a weight-bound decode
GEMM is not also charged its FLOPs)::

    linear    = max(c.prefill_compute·prefill_compute + c.decode_compute·decode_compute,
                    c.weight_reads·weight_reads)
    attention = max(c.attention_compute·attention_compute,
                    c.prefill_memory·prefill_memory + c.decode_kv_reads·decode_kv_reads)
    experts   = max(c.moe_compute·moe_compute, c.moe_expert_reads·moe_expert_reads)
    step_us   = linear + attention + experts
              + c.tp_allreduce·tp_allreduce + c.ep_dispatch_combine·ep_dispatch_combine
              + c.sampling·sampling
              + c.layer_launch_us·L + c.request_cpu_us·B + c.step_cpu_us

then ``max(1, int(step_us))`` (truncation, BLIS's rule). ``B`` is the number of requests in
the batch; prefill chunks attend to their cached context (``pi``) plus themselves, causally.

Data parallelism: each DP rank times its own batch; for an MoE model the ranks step in
lockstep and the expert layers see the tokens of every rank, padded to the busiest
(:meth:`PhysicsModel.lockstep_step_time_us`).

Coefficients come from a coefficient set (:class:`PhysicsCoefficients`, one YAML file,
:mod:`blis_simpy.latency.coefficient_sets`): ``--coefficients FILE`` if given, else
``catalog/data/physics/<GPU>.yaml`` if shipped (fitted by ``blis-simpy fit``), else
``default.yaml`` (the physical set: every multiplier 1). Pure code: no SimPy.
"""

from __future__ import annotations

import math

from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.latency import physics_terms as P
from blis_simpy.latency.base import BatchView, LatencyModel
from blis_simpy.latency.coefficient_sets import PhysicsCoefficients, load_physics_set
from blis_simpy.units import to_int64


def load_coefficient_set(gpu: str = "", path: str = "") -> tuple[PhysicsCoefficients, str]:
    """The physics set for ``gpu`` (see :func:`coefficient_sets.load_physics_set`)."""
    return load_physics_set(gpu, path)


class PhysicsModel(LatencyModel, name="physics"):
    """Bytes and FLOPs from the model config at the GPU's peak rates, times coefficients."""

    needs_model_config = True

    def __init__(self, model: ModelConfig, gpu: GPUSpec, tp: int = 1, *, dp: int = 1,
                 expert_parallel: bool = False, coefficients: PhysicsCoefficients | None = None,
                 kv_bytes_per_element: float = 0.0):
        _validate(model, gpu, tp, dp)
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.dp = dp
        self.coeffs = c = coefficients if coefficients is not None else load_coefficient_set(gpu.name)[0]
        self.shape = s = P.build_shape(model, tp, dp, expert_parallel, kv_bytes_per_element)
        self.rates = r = P.gpu_rates(gpu, s.weight_bytes)
        self.is_moe = s.moe_layers > 0
        # per-unit constants, coefficients folded in (µs per token / per pair / per byte)
        self._pf_tok = c.prefill_compute * P.prefill_compute_us(s, r, 1, 0)
        self._pf_row = c.prefill_compute * P.prefill_compute_us(s, r, 0, 1)
        self._dc_req = c.decode_compute * P.decode_compute_us(s, r, 1)
        self._pad_tok = c.decode_compute * P.prefill_compute_us(s, r, 1, 0)
        self._attn_pair = c.attention_compute * P.attention_compute_us(s, r, 1.0)
        self._pf_mem_tok = c.prefill_memory * P.prefill_memory_us(s, r, 1, 0)
        self._dc_kv_tok = c.decode_kv_reads * P.decode_kv_reads_us(s, r, 1, 0)
        self._weights = c.weight_reads * P.weight_reads_us(s, r)
        self._sample_row = c.sampling * P.sampling_us(s, r, 1)
        self._elem_tok = c.elementwise * P.elementwise_us(s, r, 1)
        self._fixed = c.layer_launch_us * s.layers + c.step_cpu_us
        self._per_req = c.request_cpu_us
        self._queue = c.queueing_us
        self._queue_tok = c.queueing_per_input_token_us
        self._otpt = to_int64(c.output_token_us)
        self._post = to_int64(c.post_decode_us)

    @classmethod
    def from_config(cls, model: ModelConfig, gpu: GPUSpec, tp: int, alpha=None, beta=None, *,
                    dp: int = 1, expert_parallel: bool = False,
                    coefficients: str | PhysicsCoefficients = "",
                    kv_bytes_per_element: float = 0.0, **_ignored) -> PhysicsModel:
        """Build from catalog records; ``alpha``/``beta`` are not used (coefficient sets are).
        ``coefficients``: a set file (see :func:`load_coefficient_set`) or a set itself."""
        coeffs = (coefficients if isinstance(coefficients, PhysicsCoefficients)
                  else load_coefficient_set(gpu.name, coefficients)[0])
        return cls(model, gpu, tp, dp=dp, expert_parallel=expert_parallel, coefficients=coeffs,
                   kv_bytes_per_element=kv_bytes_per_element)

    # ------------------------------------------------------------------ the step
    def terms(self, batch: BatchView, routed_tokens: float | None = None) -> dict[str, float]:
        """Every coefficient-weighted term of one step (µs), by name. ``routed_tokens``:
        tokens the MoE layers see (default: this batch's tokens x DP, as if every rank were
        equally busy)."""
        s, r, c = self.shape, self.rates, self.coeffs
        pf_tokens, pf_ctx, pairs = _prefill_sums(batch)
        n_pf = len(batch.prefill)
        n_dc = batch.decode_count
        ctx = batch.decode_pi_sum
        pairs += ctx + n_dc                    # each decode query attends to its context + itself
        tokens = pf_tokens + n_dc
        padded = P.cudagraph_tokens(tokens)
        routed = tokens * s.dp if routed_tokens is None else routed_tokens
        return {
            "prefill_compute": c.prefill_compute * P.prefill_compute_us(s, r, pf_tokens, n_pf),
            "decode_compute": c.decode_compute * P.decode_compute_us(s, r, n_dc),
            "cudagraph_padding": c.decode_compute * P.prefill_compute_us(s, r, padded - tokens, 0),
            "elementwise": c.elementwise * P.elementwise_us(s, r, padded),
            "weight_reads": c.weight_reads * P.weight_reads_us(s, r) if tokens else 0.0,
            "attention_compute": c.attention_compute * P.attention_compute_us(s, r, pairs),
            "prefill_memory": c.prefill_memory * P.prefill_memory_us(s, r, pf_ctx, pf_tokens),
            "decode_kv_reads": c.decode_kv_reads * P.decode_kv_reads_us(s, r, ctx, n_dc),
            "moe_compute": c.moe_compute * P.moe_compute_us(s, r, routed),
            "moe_expert_reads": c.moe_expert_reads * P.moe_expert_reads_us(s, r, routed),
            "tp_allreduce": c.tp_allreduce * P.tp_allreduce_us(s, r, tokens),
            "ep_dispatch_combine": c.ep_dispatch_combine * P.ep_dispatch_combine_us(s, r, routed),
            "sampling": c.sampling * P.sampling_us(s, r, batch.size),
            "layer_launch": c.layer_launch_us * s.layers,
            "request_cpu": c.request_cpu_us * batch.size,
            "step_cpu": c.step_cpu_us,
        }

    @staticmethod
    def combine(t: dict[str, float]) -> float:
        """The kernel-group roofline over the terms (see the module docstring), µs."""
        linear = max(t["prefill_compute"] + t["decode_compute"] + t["cudagraph_padding"], t["weight_reads"])
        attention = max(t["attention_compute"], t["prefill_memory"] + t["decode_kv_reads"])
        experts = max(t["moe_compute"], t["moe_expert_reads"])
        return (linear + attention + experts + t["tp_allreduce"] + t["ep_dispatch_combine"]
                + t["sampling"] + t["elementwise"] + t["layer_launch"] + t["request_cpu"] + t["step_cpu"])

    def step_time_us(self, batch: BatchView) -> int:
        if batch.size == 0 and not batch.prefill and batch.decode_count == 0:
            return 1
        if self.is_moe:
            return _clamp(self.combine(self.terms(batch)))
        # dense: the same arithmetic with the per-unit constants (O(prefill requests))
        pf_tokens, pf_ctx, pairs = _prefill_sums(batch)
        return self._dense_us(pf_tokens, len(batch.prefill), pf_ctx, pairs, batch.decode_count,
                              batch.decode_pi_sum, batch.size)

    def _dense_us(self, pf_tokens: int, n_pf: int, pf_ctx: int, pairs: float, n_dc: int,
                  ctx: int, size: int) -> int:
        """A dense model's step (µs) from the batch's sums: prefill tokens, prefill
        requests, their cached context and causal pairs; decoders and their context; size."""
        pairs += ctx + n_dc
        tokens = pf_tokens + n_dc
        padded = P.cudagraph_tokens(tokens)
        compute = (self._pf_tok * pf_tokens + self._pf_row * n_pf + self._dc_req * n_dc
                   + self._pad_tok * (padded - tokens))
        weights = self._weights if tokens else 0.0
        kv = self._pf_mem_tok * (pf_ctx + pf_tokens) + self._dc_kv_tok * (ctx + n_dc)
        attn = self._attn_pair * pairs
        step = ((compute if compute > weights else weights) + (attn if attn > kv else kv)
                + self._sample_row * size + self._elem_tok * padded + self._fixed + self._per_req * size)
        if self.tp > 1:
            step += self.coeffs.tp_allreduce * P.tp_allreduce_us(self.shape, self.rates, pf_tokens + n_dc)
        return _clamp(step)

    def decode_step_fn(self, size: int, count: int):
        """A dense model's pure-decode step: :meth:`_dense_us` with no prefill, its terms
        that do not depend on the context computed once. Every floating-point operation
        is the one :meth:`_dense_us` does, on the same operands in the same order, so the
        numbers are the same (tests/latency check it). MoE models, and a class whose step
        is not this module's (a subclass's own, or one patched onto the class), have none."""
        cls = type(self)
        if self.is_moe or cls.step_time_us is not _STEP or cls._dense_us is not _DENSE_US:
            return None
        n_dc = count
        padded = P.cudagraph_tokens(n_dc)
        compute = (self._pf_tok * 0 + self._pf_row * 0 + self._dc_req * n_dc
                   + self._pad_tok * (padded - n_dc))
        weights = self._weights if n_dc else 0.0
        linear = compute if compute > weights else weights
        kv0 = self._pf_mem_tok * 0
        dc_kv_tok = self._dc_kv_tok
        attn_pair = self._attn_pair
        sample = self._sample_row * size
        elem = self._elem_tok * padded
        fixed = self._fixed
        per_req = self._per_req * size
        tp_term = (self.coeffs.tp_allreduce * P.tp_allreduce_us(self.shape, self.rates, n_dc)
                   if self.tp > 1 else None)

        def step_us(decode_pi_sum: int) -> int:
            x = decode_pi_sum + n_dc
            kv = kv0 + dc_kv_tok * x
            attn = attn_pair * (0.0 + x)
            step = linear + (attn if attn > kv else kv) + sample + elem + fixed + per_req
            if tp_term is not None:
                step += tp_term
            t = to_int64(step)
            return t if t > 1 else 1
        return step_us

    def lockstep_step_time_us(self, views: list[BatchView]) -> int:
        """DP ranks in lockstep: the MoE layers of every rank see the tokens of all ranks,
        padded to the busiest rank (vLLM pads DP ranks to the group's max token count); an
        idle rank runs the 1-token dummy batch. The step lasts as long as the slowest rank."""
        dummy = BatchView.dummy()
        views = [v if v.size else dummy for v in views]
        most = max(sum(q.num_new_tokens for q in v.prefill) + v.decode_count for v in views)
        routed = float(most * len(views))
        return max(_clamp(self.combine(self.terms(v, routed))) for v in views)

    # ------------------------------------------------------------------ overheads
    def queueing_time_us(self, req) -> int:
        return to_int64(self._queue + self._queue_tok * req.input_len)

    def frontend_params(self):
        """The coefficient set's API-server costs (``frontend:`` of the set), None when all 0."""
        fe = self.coeffs.frontend
        return fe if fe.active else None

    def output_token_time_us(self) -> int:
        return self._otpt

    def post_decode_us(self) -> int:
        return self._post

    def decode_step_us(self, batch_size: int, context_tokens: int) -> int:
        """A pure decode step of ``batch_size`` requests at ``context_tokens`` each (µs)."""
        v = BatchView(decode_count=batch_size, decode_tokens=batch_size,
                      decode_pi_sum=batch_size * context_tokens, size=batch_size)
        return self.step_time_us(v)


#: the step :meth:`PhysicsModel.decode_step_fn` reproduces, as defined here (not as the class
#: may have it later: a step patched onto the class must see every step)
_STEP, _DENSE_US = PhysicsModel.step_time_us, PhysicsModel._dense_us


def _prefill_sums(batch: BatchView) -> tuple[int, int, float]:
    """Chunk tokens, cached context and causal (query, key) pairs of the prefill requests."""
    tokens = ctx = 0
    pairs = 0.0
    for req in batch.prefill:
        t = req.num_new_tokens
        tokens += t
        ctx += req.pi
        pairs += P.attention_pairs(req.pi, t)
    return tokens, ctx, pairs


def _clamp(step_us: float) -> int:
    t = to_int64(step_us)
    return t if t > 1 else 1


def _validate(model: ModelConfig, gpu: GPUSpec, tp: int, dp: int) -> None:
    for label, v in (("tensor parallelism", tp), ("data parallelism", dp)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"physics: {label} must be > 0, got {v}")
    for label, v in (("num_hidden_layers", model.num_layers), ("hidden_size", model.hidden_size),
                     ("num_attention_heads", model.num_heads), ("vocab_size", model.vocab_size),
                     ("intermediate_size", model.intermediate_size or model.moe_intermediate_size)):
        if v <= 0:
            raise ValueError(f"physics: model {label} must be > 0, got {v}")
    if model.num_heads % tp:
        raise ValueError(f"physics: num_attention_heads ({model.num_heads}) must be divisible by TP ({tp})")
    for label, v in (("TFlopsPeak", gpu.tflops_peak), ("BwPeakTBs", gpu.bw_peak_tbs)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"physics: GPU {gpu.name} {label} must be finite and > 0, got {v}")
    if (tp > 1 or dp > 1) and not (math.isfinite(gpu.link_bw_gbps) and gpu.link_bw_gbps > 0):
        raise ValueError(f"physics: GPU {gpu.name} needs an interconnect bandwidth (link_bw_gbps) "
                         f"for TP {tp} x DP {dp}")
    if model.is_moe and not 0 < model.num_experts_per_tok <= model.num_local_experts:
        raise ValueError(f"physics: num_experts_per_tok must be in (0, {model.num_local_experts}] "
                         f"for an MoE model, got {model.num_experts_per_tok}")


__all__ = ["PhysicsCoefficients", "PhysicsModel", "load_coefficient_set"]
