"""The physics-informed ``crossmodel`` backend (docs/latency-models.md), fitted once across models.

::

    kv_dim_scaled = L · Hkv · (d/H) / TP · 1e-6          (Hkv = 0 ⇒ H)
    step_time_us     = max(1, to_int64( β0·L + β1·decode_tokens·kv_dim_scaled
                                        + β2·(prefill_tokens + decode_tokens)·is_moe + β3·is_tp ))
    queueing_time_us = to_int64(α0 + α1·input_len) ;  OTPT = to_int64(α2) ;  post_decode = 0

``decode_tokens`` is Σ NumNewTokens over decode-phase requests (0 or 1 each) and
``prefill_tokens`` Σ NumNewTokens over prefill-phase requests; both are integers, so the O(1)
batch aggregates are exact.

Construction (what the resolution code calls)::

    CrossModel.from_config(model: ModelConfig, gpu: GPUSpec, tp: int,
                           alpha=None, beta=None, *, checkout_moe_threshold=False)

* ``alpha`` ≥ 3 and ``beta`` ≥ 4 finite, non-negative coefficients; ``None`` selects
  ``crossmodel_defaults`` (:data:`DEFAULT_ALPHA`, :data:`DEFAULT_BETA`).
* ``gpu`` is not used by the formula (kept for a uniform signature).
* ``is_moe = 1`` when the model has more than one expert (docs/divergences.md #9: a single-expert model is
  dense everywhere). ``checkout_moe_threshold=True`` uses BLIS checkout's ``E > 0`` instead.

Invalid inputs raise :class:`ValueError`.
"""

from __future__ import annotations

from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.latency.base import BatchView, LatencyModel, check_coeffs
from blis_simpy.units import to_int64

#: ``crossmodel_defaults`` of BLIS's defaults.yaml.
DEFAULT_BETA = (116.110, 1226.868, 19.943, 9445.157)
DEFAULT_ALPHA = (13732.0, 0.0, 860.6)


class CrossModel(LatencyModel, name="crossmodel"):
    """``β0·L + β1·decode tokens·KV dim + β2·tokens·is_moe + β3·is_tp`` (µs)."""

    needs_model_config = True

    def __init__(self, model: ModelConfig, tp: int, alpha=DEFAULT_ALPHA, beta=DEFAULT_BETA, *,
                 checkout_moe_threshold: bool = False):
        if not isinstance(tp, int) or tp <= 0:
            raise ValueError(f"crossmodel: tensor parallelism must be > 0, got {tp}")
        for label, v in (("num_hidden_layers", model.num_layers), ("num_attention_heads", model.num_heads),
                         ("hidden_size", model.hidden_size)):
            if v <= 0:
                raise ValueError(f"crossmodel: model {label} must be > 0, got {v}")
        self.alpha = check_coeffs("alpha", alpha, 3)
        self.beta = check_coeffs("beta", beta, 4)
        self.model = model
        self.tp = tp
        L = float(model.num_layers)
        hkv = float(model.num_kv_heads or model.num_heads)
        self.kv_dim_scaled = L * hkv * (float(model.hidden_size) / float(model.num_heads)) / float(tp) * 1e-6
        E = model.num_local_experts
        self.is_moe = 1.0 if (E > 0 if checkout_moe_threshold else E > 1) else 0.0
        self.is_tp = 1.0 if tp > 1 else 0.0
        b0, b1, b2, b3 = self.beta[:4]
        self._c0 = b0 * L
        self._b1, self._b2 = b1, b2
        self._c3 = b3 * self.is_tp
        self._otpt = to_int64(self.alpha[2])

    @classmethod
    def from_config(cls, model: ModelConfig, gpu: GPUSpec | None, tp: int, alpha=None, beta=None,
                    **opts) -> CrossModel:
        """Build from catalog records; ``opts``: ``checkout_moe_threshold``."""
        return cls(model, tp, DEFAULT_ALPHA if alpha is None else alpha,
                   DEFAULT_BETA if beta is None else beta, **opts)

    def step_time_us(self, batch: BatchView) -> int:
        dt = batch.decode_tokens
        pt = 0
        for r in batch.prefill:
            pt += r.num_new_tokens
        t = to_int64(self._c0 + self._b1 * dt * self.kv_dim_scaled
                     + self._b2 * (pt + dt) * self.is_moe + self._c3)
        return t if t > 1 else 1

    def queueing_time_us(self, req) -> int:
        return to_int64(self.alpha[0] + self.alpha[1] * req.input_len)

    def output_token_time_us(self) -> int:
        return self._otpt


__all__ = ["DEFAULT_ALPHA", "DEFAULT_BETA", "CrossModel"]
