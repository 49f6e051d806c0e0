"""The two records every analytical latency model and the KV-capacity calculation read."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator (spec/04 §9). Peak figures are dense (no sparsity)."""

    name: str
    tflops_peak: float          # dense BF16/FP16 TFLOP/s
    tflops_fp8: float           # dense FP8 TFLOP/s; 0 = no native FP8
    bw_peak_tbs: float          # HBM bandwidth, TB/s
    mfu_prefill: float          # model FLOPs utilisation assumed for prefill
    mfu_decode: float           # ... and for decode
    memory_gib: float           # device memory, GiB
    source: str = ""            # where the figures come from


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Architecture of a transformer as BLIS reads it from a HuggingFace config.json
    (spec/04 §8.2). Integer fields are 0 when absent."""

    name: str = ""
    model_type: str = ""
    num_layers: int = 0
    hidden_size: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0           # resolved: 0 in config.json means = num_heads
    intermediate_size: int = 0
    vocab_size: int = 0
    bytes_per_param: float = 0.0    # from torch_dtype; 0 if unknown
    weight_bytes_per_param: float = 0.0   # quantised weights; 0 = use bytes_per_param
    num_local_experts: int = 0      # resolved expert count (> 1 means MoE)
    num_experts_per_tok: int = 0    # top-k
    moe_intermediate_size: int = 0  # per routed expert FFN dim; 0 = intermediate_size
    shared_expert_intermediate_size: int = 0  # resolved shared-expert FFN dim
    hidden_act: str = ""
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 0
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    #: True when the config looks MoE (shared experts / top-k) but no expert count exists
    moe_count_missing: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 1

    @property
    def effective_weight_bytes_per_param(self) -> float:
        return self.weight_bytes_per_param if self.weight_bytes_per_param > 0 else self.bytes_per_param
