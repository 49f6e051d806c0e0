"""KV-cache capacity auto-calculation: how many GPU KV blocks vLLM would get
(docs/kv-capacity.md, "The `blis` rule").

::

    kv_capacity_blocks(model, gpu, tp, block_size, gpu_memory_utilization=0.9) -> int

Memory available to vLLM (``MemoryGiB × u × TP``) minus the model weights, a fixed
activation reserve (8 GiB MoE / 5.5 GiB dense) and the non-torch overhead (0.15 GiB at TP 1,
else 0.6 GiB per GPU), divided by the bytes of one block across all layers. Floating-point
operations follow BLIS's order so the result is bit-identical (89,941 blocks for a
Qwen3-14B-like model on H100 at TP 2; 15,909 for Qwen3-14B on A100-SXM at TP 1).

Every invalid input raises :class:`KVCapacityError` (a ``ValueError``) saying why; the
resolver then falls back to another block count with a warning (docs/latency-models.md).
"""

from __future__ import annotations

import math

from blis_simpy.catalog.types import GPUSpec, ModelConfig

GIB = 1 << 30
ACTIVATION_GIB_DENSE = 5.5
ACTIVATION_GIB_MOE = 8.0
NON_TORCH_GIB_TP1 = 0.15
NON_TORCH_GIB_PER_GPU = 0.6
#: activations the 3-matrix (gated) MLP parameter count is valid for
SUPPORTED_ACTIVATIONS = ("silu", "swiglu", "geglu", "")


class KVCapacityError(ValueError):
    """The KV capacity cannot be computed for these inputs."""


def _finite_pos(v: float) -> bool:
    return math.isfinite(v) and v > 0


def validate(model: ModelConfig, gpu: GPUSpec, tp: int, block_size: int, util: float) -> None:
    """All of BLIS's checks (docs/kv-capacity.md), in BLIS's order; raises :class:`KVCapacityError`."""
    if not (math.isfinite(util) and 0 < util <= 1):
        raise KVCapacityError(f"gpu memory utilization must be in (0, 1], got {util}")
    if tp <= 0:
        raise KVCapacityError(f"TP must be > 0, got {tp}")
    if block_size <= 0:
        raise KVCapacityError(f"block size must be > 0, got {block_size}")
    for what, v in (("num_attention_heads", model.num_heads), ("num_hidden_layers", model.num_layers),
                    ("hidden_size", model.hidden_size), ("intermediate_size", model.intermediate_size),
                    ("vocab_size", model.vocab_size)):
        if v <= 0:
            raise KVCapacityError(f"model {what} must be > 0, got {v}")
    if not _finite_pos(model.bytes_per_param):
        raise KVCapacityError(f"model bytes per parameter must be finite and > 0, got "
                              f"{model.bytes_per_param} (unknown torch_dtype?)")
    if not _finite_pos(gpu.memory_gib):
        raise KVCapacityError(f"GPU {gpu.name} memory must be finite and > 0 GiB, got {gpu.memory_gib}")
    w = model.weight_bytes_per_param
    if not (math.isfinite(w) and w >= 0):
        raise KVCapacityError(f"weight bytes per parameter must be finite and >= 0, got {w}")
    if model.hidden_size % model.num_heads:
        raise KVCapacityError(f"hidden_size {model.hidden_size} is not divisible by "
                              f"num_attention_heads {model.num_heads}")
    if model.hidden_act not in SUPPORTED_ACTIVATIONS:
        raise KVCapacityError(f"hidden_act {model.hidden_act!r} is not supported (only the SwiGLU "
                              "family: silu, swiglu, geglu)")
    kv = model.num_kv_heads
    if kv < 0:
        raise KVCapacityError(f"num_key_value_heads must be >= 0, got {kv}")
    if kv >= tp and kv % tp:
        raise KVCapacityError(f"num_key_value_heads {kv} is not divisible by TP {tp}")
    if model.moe_count_missing:
        raise KVCapacityError("the model looks MoE (shared experts or num_experts_per_tok) but has no "
                              "expert count; set --total-kv-blocks explicitly")


def kv_heads(model: ModelConfig) -> int:
    return model.num_kv_heads if model.num_kv_heads > 0 else model.num_heads


def weight_bytes(model: ModelConfig) -> int:
    """The model's weights in bytes, all GPUs together: :func:`total_params` × the (possibly
    quantised) bytes per weight (BLIS's count; the KV capacity and the autoscaler's loading
    delay use it)."""
    return int(float(total_params(model)) * model.effective_weight_bytes_per_param)


def total_params(model: ModelConfig) -> int:
    """Parameter count with a 3-matrix MLP (docs/kv-capacity.md); MoE: all experts + shared + router."""
    h = model.hidden_size
    head_dim = h // model.num_heads
    kv_dim = kv_heads(model) * head_dim
    embed = model.vocab_size * h
    attn = h * (h + 2 * kv_dim) + h * h
    if model.is_moe:
        e = model.num_local_experts
        e_ffn = model.moe_intermediate_size if model.moe_intermediate_size > 0 else model.intermediate_size
        mlp = 3 * h * e_ffn * e + e * h
        if model.shared_expert_intermediate_size > 0:
            mlp += 3 * h * model.shared_expert_intermediate_size
    else:
        mlp = 3 * h * model.intermediate_size
    norms = 2 * h
    lm_head = 0 if model.tie_word_embeddings else model.vocab_size * h
    return embed + model.num_layers * (attn + mlp + norms) + lm_head + h


def block_bytes(model: ModelConfig, tp: int, block_size: int) -> int:
    """Bytes of one KV block on one GPU, all layers, K and V."""
    head_dim = model.hidden_size // model.num_heads
    per_token = float(model.num_layers * 2 * head_dim * kv_heads(model)) * model.bytes_per_param
    return int(per_token / float(tp) * float(block_size))


def kv_capacity_blocks(model: ModelConfig, gpu: GPUSpec, tp: int, block_size: int,
                       gpu_memory_utilization: float = 0.9) -> int:
    """GPU KV blocks per instance (BLIS's rule). Raises :class:`KVCapacityError`."""
    validate(model, gpu, tp, block_size, gpu_memory_utilization)
    bb = block_bytes(model, tp, block_size)
    if bb <= 0:
        raise KVCapacityError(f"KV block size in bytes is {bb}; the model's KV footprint is too small")
    avail_gib = gpu.memory_gib * gpu_memory_utilization * float(tp)
    weights_gib = float(weight_bytes(model)) / float(GIB)
    activation_gib = ACTIVATION_GIB_MOE if model.is_moe else ACTIVATION_GIB_DENSE
    non_torch_gib = (NON_TORCH_GIB_TP1 if tp == 1 else NON_TORCH_GIB_PER_GPU) * float(tp)
    overhead = weights_gib + activation_gib + non_torch_gib
    if overhead >= avail_gib:
        raise KVCapacityError(
            f"the model does not fit: short by {overhead - avail_gib:.2f} GiB (weights "
            f"{weights_gib:.2f} GiB + activations {activation_gib} GiB + non-torch {non_torch_gib:.2f} "
            f"GiB = {overhead:.2f} GiB needed >= {avail_gib:.2f} GiB usable on {tp} x {gpu.name}, gpu "
            f"memory utilization {gpu_memory_utilization}), with no room left for KV blocks")
    blocks = int((avail_gib - overhead) * float(GIB)) // bb
    if blocks <= 0:
        raise KVCapacityError(f"no room for a single KV block ({avail_gib - overhead:.3f} GiB free)")
    return blocks


__all__ = ["KVCapacityError", "block_bytes", "kv_capacity_blocks", "total_params", "validate"]
