"""The two records every analytical latency model and the KV-capacity calculation read."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator (docs/latency-models.md, "Catalogs and resolution"). Peak figures are
    dense (no sparsity)."""

    name: str
    tflops_peak: float          # dense BF16/FP16 TFLOP/s
    tflops_fp8: float           # dense FP8 TFLOP/s; 0 = no native FP8
    bw_peak_tbs: float          # HBM bandwidth, TB/s
    mfu_prefill: float          # model FLOPs utilisation assumed for prefill
    mfu_decode: float           # ... and for decode
    memory_gib: float           # device memory, GiB (BLIS: the datasheet figure)
    source: str = ""            # where the figures come from
    #: device memory as the driver reports it (``cudaMemGetInfo`` total, what vLLM multiplies
    #: by ``gpu_memory_utilization``), GiB; 0 = unknown (the ``vllm`` capacity model then
    #: falls back to ``memory_gib``)
    memory_torch_gib: float = 0.0
    #: GPU-to-GPU interconnect used by TP/EP collectives: ``nvlink`` or ``pcie``
    interconnect: str = "pcie"
    #: interconnect generation (NVLink 3/4/5, PCIe 4/5)
    interconnect_gen: int = 4
    #: usable GPU-to-GPU bandwidth per GPU and per direction, GB/s (10^9 B/s); what a ring
    #: collective's bus bandwidth is bounded by
    link_bw_gbps: float = 32.0
    #: direct peer-to-peer access between GPUs (False: NCCL stages through host memory)
    p2p: bool = False
    #: fixed cost of one collective (launch + synchronisation), µs
    collective_latency_us: float = 20.0
    #: host (CPU) <-> GPU link bandwidth per GPU and per direction, GB/s (10^9 B/s): what a
    #: CPU KV offload transfer moves at; 0 = unknown
    host_link_gbps: float = 0.0
    #: memory bandwidth sustained by real kernels, TB/s, where a measurement is published;
    #: 0 = unknown (the ``physics`` backend then uses ``bw_peak_tbs``)
    bw_sustained_tbs: float = 0.0
    #: dense BF16/FP16 tensor rate large GEMMs sustain, TFLOP/s, where a measurement is
    #: published; 0 = unknown (the ``physics`` backend then uses ``tflops_peak``)
    tflops_sustained: float = 0.0
    #: on-demand price of one GPU-hour, USD, where a source is given; None = unknown (the
    #: shipped catalog gives none: cost needs ``--gpu-hour-cost`` or a priced entry)
    price_per_hour_usd: float | None = None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Architecture of a transformer as BLIS reads it from a HuggingFace config.json
    (docs/latency-models.md, "HuggingFace config.json"). Integer fields are 0 when absent."""

    name: str = ""
    model_type: str = ""
    num_layers: int = 0
    hidden_size: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0           # resolved: 0 in config.json means = num_heads
    #: attention head dimension as declared (config ``head_dim``); 0 = hidden / heads.
    #: BLIS's backends ignore it (they use hidden / heads); ``physics`` and the ``vllm``
    #: KV-capacity model read it through :attr:`real_head_dim`.
    head_dim: int = 0
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
    #: MoE layout: the first k layers are dense (DeepSeek ``first_k_dense_replace``); or every
    #: ``interleave_moe_layer_step``-th layer is MoE (Llama-4); 0 = every layer is MoE
    first_k_dense_replace: int = 0
    interleave_moe_layer_step: int = 0
    #: FFN dim of the dense layers of an MoE model (``intermediate_size_mlp``); 0 = intermediate
    dense_intermediate_size: int = 0
    #: multi-head latent attention (DeepSeek): compressed KV rank and decoupled RoPE dim
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0

    @property
    def real_head_dim(self) -> int:
        """``head_dim`` if the config declares it, else hidden / heads (0 if unknown)."""
        if self.head_dim > 0:
            return self.head_dim
        return self.hidden_size // self.num_heads if self.num_heads > 0 else 0

    @property
    def num_moe_layers(self) -> int:
        """Layers with a routed-expert FFN (0 for a dense model)."""
        if not self.is_moe:
            return 0
        L = self.num_layers
        if self.interleave_moe_layer_step > 0:
            return L // self.interleave_moe_layer_step
        return max(0, L - self.first_k_dense_replace)

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 1

    @property
    def effective_weight_bytes_per_param(self) -> float:
        return self.weight_bytes_per_param if self.weight_bytes_per_param > 0 else self.bytes_per_param
