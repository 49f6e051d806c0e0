"""The physical bases of the ``physics`` backend: bytes and FLOPs of one engine step.

Everything here is counted from the model's config.json and the deployment, per GPU, and
turned into µs at the GPU's peak rates. No coefficient, no SimPy: :mod:`physics` combines
these bases with a coefficient set. Each basis is a small named function so it can be
checked alone on a tiny config (tests/latency/test_physics_terms.py).

Conventions (see docs/latency-models.md, "physics"):

* ``d`` hidden size, ``L`` layers, ``H``/``H_kv`` query/KV heads, ``hd`` the *declared*
  ``head_dim`` (hidden/heads when absent), ``V`` vocabulary, ``f`` FFN dims; FLOPs count
  2 per multiply-accumulate.
* Tensor parallelism (TP) shards the Q/O projections, the MLP, the shared experts and the
  vocabulary (embedding and lm_head) TP ways; K/V heads are sharded ``max(1, H_kv // TP)``
  per GPU (replicated when ``H_kv < TP``, as vLLM does).
* Routed experts are spread over the MoE group ``G = TP x DP`` (vLLM: expert parallel
  places whole experts, otherwise each expert is tensor-sharded G ways; the bytes per GPU are
  the same). A batch of ``T`` routed tokens touches ``E·(1 − (1 − k/E)^T)`` distinct experts
  in expectation (uniform top-k routing).
* Gated MLPs (SwiGLU/GeGLU, every catalog model) have three matrices, others two.
* Rates: ``F`` FLOP/µs = TFLOPS·1e6: the rate large GEMMs *sustain* where the catalog has a
  measurement (``tflops_sustained``), else the datasheet peak; the FP8 rate when weights are
  1 byte and the GPU has FP8 tensor cores (scaled by the same sustained fraction). ``W`` B/µs
  = TB/s·1e6 (sustained bandwidth where measured, else the peak), a link's B/µs = GB/s·1e3.
* CUDA graphs: vLLM pads a step's token count up to the next captured batch size
  (:func:`cudagraph_tokens`); the GEMMs and the element-wise kernels run on the padded rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from blis_simpy.catalog.types import GPUSpec, ModelConfig

#: activations with a non-gated (two-matrix) MLP
UNGATED_ACTIVATIONS = frozenset({"gelu_new", "gelu_fast", "quick_gelu", "relu", "relu2"})
#: bytes of one fp32 logit (the sampler works on fp32 logits)
LOGIT_BYTES = 4.0


def expected_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts touched by ``tokens`` tokens routed top-``top_k`` of
    ``num_experts`` uniformly and independently: ``E·(1 − (1 − k/E)^T)``."""
    if num_experts <= 0 or tokens <= 0:
        return 0.0
    k = min(max(top_k, 1), num_experts)
    return num_experts * (1.0 - (1.0 - k / num_experts) ** tokens)


@dataclass(frozen=True, slots=True)
class Shape:
    """Per-GPU parameter and byte counts of one deployment of one model (frozen)."""

    layers: int
    moe_layers: int
    dense_layers: int
    hidden: int
    vocab: int
    heads_local: float            # query heads per GPU
    head_dim: int
    kv_bytes_per_token: float     # KV bytes per token per GPU, all layers (K and V)
    act_bytes: float              # bytes per activation element
    weight_bytes: float           # bytes per weight parameter (quantised)
    nonexpert_macs_per_token: float   # per GPU: attention projections, dense MLP, shared experts, router
    lm_head_macs_per_row: float   # per GPU: d·V/TP
    nonexpert_weight_bytes: float     # per GPU, read once per step (includes lm_head)
    elementwise_bytes_per_token: float    # per GPU, all layers: norms, residual adds, activation, rotary
    num_experts: int
    top_k: int
    expert_params: float          # one routed expert, all matrices
    moe_group: int                # G = TP x DP
    tp: int
    dp: int
    expert_parallel: bool


def build_shape(model: ModelConfig, tp: int, dp: int = 1, expert_parallel: bool = False,
                kv_bytes_per_element: float = 0.0) -> Shape:
    """Count a model's per-GPU parameters and bytes for a TP x DP deployment."""
    d = model.hidden_size
    L = model.num_layers
    H = model.num_heads
    hd = model.real_head_dim
    hkv = model.num_kv_heads or H
    V = model.vocab_size
    n_mat = 2 if model.hidden_act in UNGATED_ACTIVATIONS else 3
    act = model.bytes_per_param or 2.0
    wb = model.effective_weight_bytes_per_param or act
    kvb = kv_bytes_per_element or act
    hkv_local = max(1, hkv // tp)
    # attention: Q (d x H·hd) and O (H·hd x d) sharded by TP; K, V per local KV head
    attn = 2.0 * d * H * hd / tp + 2.0 * d * hkv_local * hd
    if model.kv_lora_rank > 0:       # MLA: KV compressed to kv_lora_rank + rope dims per token
        kv_tok = float(L * (model.kv_lora_rank + model.qk_rope_head_dim)) * kvb
    else:
        kv_tok = float(L * 2 * hkv_local * hd) * kvb
    n_moe = model.num_moe_layers
    n_dense = L - n_moe
    f_dense = model.dense_intermediate_size or model.intermediate_size
    dense_mlp = n_mat * d * f_dense / tp
    E = model.num_local_experts if model.is_moe else 0
    f_exp = model.moe_intermediate_size or model.intermediate_size
    shared = n_mat * d * model.shared_expert_intermediate_size / tp
    router = float(d * E)
    macs = L * attn + n_dense * dense_mlp + n_moe * (shared + router)
    lm_head = float(d) * V / tp
    norms = float(2 * L * d + d)
    # element-wise kernels per token and layer, in activation elements read + written: two
    # RMSNorms (d in, d out each), two residual adds (2d in, d out each), the gated
    # activation (2·f in, f out; f the local FFN width, routed experts at k·f), rotary on the
    # local q and k heads (read and write)
    f_act = f_dense / tp if n_dense else 0.0
    f_moe = (model.num_experts_per_tok * f_exp + model.shared_expert_intermediate_size) / tp
    act_io = 3.0 if n_mat == 3 else 2.0      # gated: gate and up in, product out; else in, out
    act_elems = (L * (4.0 * d + 6.0 * d + 2.0 * (H / tp + hkv_local) * hd)
                 + act_io * (n_dense * f_act + n_moe * f_moe))
    return Shape(
        layers=L, moe_layers=n_moe, dense_layers=n_dense, hidden=d, vocab=V,
        heads_local=H / tp, head_dim=hd, kv_bytes_per_token=kv_tok, act_bytes=act, weight_bytes=wb,
        nonexpert_macs_per_token=macs, lm_head_macs_per_row=lm_head,
        nonexpert_weight_bytes=(macs + lm_head + norms) * wb,
        elementwise_bytes_per_token=act_elems * act,
        num_experts=E, top_k=model.num_experts_per_tok, expert_params=float(n_mat * d * f_exp),
        moe_group=tp * dp, tp=tp, dp=dp, expert_parallel=expert_parallel)


@dataclass(frozen=True, slots=True)
class Rates:
    """Peak rates of one GPU in per-µs units."""

    flops_per_us: float
    hbm_bytes_per_us: float
    link_bytes_per_us: float      # GPU-GPU bus bandwidth per direction (halved without P2P)
    collective_us: float          # fixed cost of one collective
    #: GPUs with peer-to-peer access (vLLM's custom all-reduce may run) and whether their link
    #: is NVLink (it runs for any supported TP size) or PCIe (two GPUs only)
    p2p: bool = False
    nvlink: bool = False


def gpu_rates(gpu: GPUSpec, weight_bytes: float) -> Rates:
    """FLOP/µs (the measured sustained GEMM rate when the catalog has one, else the peak;
    FP8 when weights are 1 byte and the GPU has FP8, at the same sustained fraction), memory
    B/µs (the published sustained bandwidth when the catalog has one, else the peak), link B/µs.

    Without peer-to-peer access NCCL stages every transfer through host memory: each byte
    crosses PCIe twice, so the usable bus bandwidth is half the link's.
    """
    fp8 = weight_bytes == 1.0 and gpu.tflops_fp8 > 0
    tflops = gpu.tflops_fp8 if fp8 else gpu.tflops_peak
    if gpu.tflops_sustained > 0:
        tflops *= gpu.tflops_sustained / gpu.tflops_peak
    link = gpu.link_bw_gbps * 1e3 * (1.0 if gpu.p2p else 0.5)
    bw = gpu.bw_sustained_tbs if gpu.bw_sustained_tbs > 0 else gpu.bw_peak_tbs
    return Rates(tflops * 1e6, bw * 1e6, link, gpu.collective_latency_us, bool(gpu.p2p),
                 gpu.interconnect == "nvlink")


#: vLLM's default CUDA-graph capture sizes end at min(2·max_num_seqs, 512); with the common
#: max_num_seqs of 256 or more that is 512 (docs/latency-models.md, "physics")
CUDAGRAPH_MAX_TOKENS = 512


def cudagraph_tokens(tokens: int) -> int:
    """The token count a step's kernels run on: vLLM pads it up to the next CUDA-graph capture
    size — 1, 2, 4, then every 8 up to 256, then every 16 up to :data:`CUDAGRAPH_MAX_TOKENS`;
    above that no graph is used and nothing is padded."""
    if tokens <= 2 or tokens > CUDAGRAPH_MAX_TOKENS:
        return tokens
    if tokens <= 4:
        return 4
    if tokens <= 256:
        return (tokens + 7) // 8 * 8
    return (tokens + 15) // 16 * 16


# ------------------------------------------------------------------------ the bases (µs)
def prefill_compute_us(s: Shape, r: Rates, prefill_tokens: int, prefill_requests: int) -> float:
    """Dense GEMMs of the prefill chunk tokens, plus lm_head for each prefill request's last
    position (vLLM samples one row per scheduled request)."""
    macs = prefill_tokens * s.nonexpert_macs_per_token + prefill_requests * s.lm_head_macs_per_row
    return 2.0 * macs / r.flops_per_us


def decode_compute_us(s: Shape, r: Rates, decode_requests: int) -> float:
    """Dense GEMMs and lm_head of the decode tokens (one per decode request)."""
    macs = decode_requests * (s.nonexpert_macs_per_token + s.lm_head_macs_per_row)
    return 2.0 * macs / r.flops_per_us


def attention_pairs(context_tokens: int, new_tokens: int) -> float:
    """(query, key) pairs of a causal chunk of ``new_tokens`` after ``context_tokens`` cached
    ones: ``t·c + t(t+1)/2``."""
    t = new_tokens
    return t * context_tokens + t * (t + 1) / 2.0


def attention_compute_us(s: Shape, r: Rates, pairs: float) -> float:
    """QKᵀ and PV of ``pairs`` (query, key) pairs over every layer: ``4·(H/TP)·hd`` FLOPs each."""
    return 4.0 * s.heads_local * s.head_dim * pairs * s.layers / r.flops_per_us


def prefill_memory_us(s: Shape, r: Rates, context_tokens: int, prefill_tokens: int) -> float:
    """KV traffic of prefill chunks: read the cached context, write the chunk's K and V."""
    return (context_tokens + prefill_tokens) * s.kv_bytes_per_token / r.hbm_bytes_per_us


def decode_kv_reads_us(s: Shape, r: Rates, context_sum: int, decode_requests: int) -> float:
    """Decode attention: read every decode request's context K/V, write one new token each."""
    return (context_sum + decode_requests) * s.kv_bytes_per_token / r.hbm_bytes_per_us


def weight_reads_us(s: Shape, r: Rates) -> float:
    """Stream every non-expert weight once (attention, dense MLP, shared experts, router,
    norms and the lm_head; the embedding is gathered, not streamed)."""
    return s.nonexpert_weight_bytes / r.hbm_bytes_per_us


def moe_tokens_touched(s: Shape, routed_tokens: float) -> float:
    """Expected distinct experts one MoE layer reads for ``routed_tokens`` tokens."""
    return expected_experts(s.num_experts, s.top_k, routed_tokens)


def moe_expert_reads_us(s: Shape, r: Rates, routed_tokens: float) -> float:
    """Bytes of the distinct experts touched, every MoE layer, this GPU's 1/G share."""
    if s.moe_layers == 0 or routed_tokens <= 0:
        return 0.0
    n = moe_tokens_touched(s, routed_tokens)
    return s.moe_layers * n * s.expert_params * s.weight_bytes / s.moe_group / r.hbm_bytes_per_us


def moe_compute_us(s: Shape, r: Rates, routed_tokens: float) -> float:
    """Expert GEMMs: each routed token runs ``k`` experts; this GPU does 1/G of the work."""
    if s.moe_layers == 0 or routed_tokens <= 0:
        return 0.0
    k = max(1, s.top_k)
    return 2.0 * s.moe_layers * routed_tokens * k * s.expert_params / s.moe_group / r.flops_per_us


def ring_allreduce_us(r: Rates, nbytes: float, ranks: int) -> float:
    """One ring all-reduce of ``nbytes`` over ``ranks`` GPUs: ``2(n−1)/n·bytes/bus + latency``."""
    if ranks <= 1:
        return 0.0
    return r.collective_us + 2.0 * (ranks - 1) / ranks * nbytes / r.link_bytes_per_us


def ring_gather_us(r: Rates, nbytes: float, ranks: int) -> float:
    """One all-gather or reduce-scatter whose full result is ``nbytes``: ``(n−1)/n·bytes/bus``."""
    if ranks <= 1:
        return 0.0
    return r.collective_us + (ranks - 1) / ranks * nbytes / r.link_bytes_per_us


#: vLLM's custom all-reduce (``CustomAllreduce``) takes TP all-reduces of up to 8 MiB when
#: the GPUs have peer access, the TP size is 2, 4, 6 or 8, and they are NVLink-connected or
#: only two (docs/latency-models.md, "Tensor parallelism")
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024
CUSTOM_AR_SIZES = frozenset({2, 4, 6, 8})
#: fixed cost of one custom all-reduce inside a CUDA graph, µs: vLLM's H100 benchmarks of the
#: kernel under CUDA graphs (vllm-project/vllm PRs #24111 and #24532, 0.5 MB of bf16: 7 µs at
#: TP 2, 10 µs at TP 4, 13 µs at TP 6) less the bytes term of :func:`custom_allreduce_us`
CUSTOM_AR_US = 5.0


def uses_custom_allreduce(r: Rates, ranks: int, nbytes: float) -> bool:
    """Does vLLM run this all-reduce with its custom kernel (else NCCL's ring)?"""
    return (r.p2p and ranks in CUSTOM_AR_SIZES and (r.nvlink or ranks == 2)
            and nbytes <= CUSTOM_AR_MAX_BYTES)


def custom_allreduce_us(r: Rates, nbytes: float, ranks: int) -> float:
    """vLLM's custom all-reduce of ``nbytes``: every GPU reads its ``n − 1`` peers' buffers
    over the link and sums them (the one-stage kernel; the two-stage one it picks for larger
    messages measures no faster at these sizes), plus :data:`CUSTOM_AR_US`. No CPU launch:
    it is captured in the step's CUDA graph."""
    return CUSTOM_AR_US + (ranks - 1) * nbytes / r.link_bytes_per_us


def tp_allreduce_us(s: Shape, r: Rates, tokens: int) -> float:
    """Tensor-parallel all-reduces of the step's hidden states: after attention (every layer),
    after the dense MLPs, and after the MoE layers when their output is all-reduced over TP
    (DP = 1 without expert parallel; otherwise :func:`ep_dispatch_combine_us` moves it).
    Each is vLLM's custom all-reduce where it applies (:func:`uses_custom_allreduce`), else
    NCCL's ring (:func:`ring_allreduce_us`)."""
    if s.tp <= 1 or tokens <= 0:
        return 0.0
    n = s.layers + s.dense_layers
    if s.moe_layers and s.dp == 1 and not s.expert_parallel:
        n += s.moe_layers
    nbytes = tokens * s.hidden * s.act_bytes
    if uses_custom_allreduce(r, s.tp, nbytes):
        return n * custom_allreduce_us(r, nbytes, s.tp)
    return n * ring_allreduce_us(r, nbytes, s.tp)


def ep_dispatch_combine_us(s: Shape, r: Rates, gathered_tokens: float) -> float:
    """MoE dispatch (all-gather of the hidden states of every rank's tokens) and combine
    (reduce-scatter) over the MoE group, per MoE layer — vLLM's default
    ``allgather_reducescatter`` backend, used with expert parallel or DP > 1."""
    if s.moe_layers == 0 or s.moe_group <= 1 or not (s.expert_parallel or s.dp > 1):
        return 0.0
    nbytes = gathered_tokens * s.hidden * s.act_bytes
    return s.moe_layers * 2.0 * ring_gather_us(r, nbytes, s.moe_group)


def elementwise_us(s: Shape, r: Rates, tokens: int) -> float:
    """Element-wise kernels (norms, residual adds, the gated activation, rotary) as memory
    traffic: :attr:`Shape.elementwise_bytes_per_token` per (padded) token."""
    return tokens * s.elementwise_bytes_per_token / r.hbm_bytes_per_us


def sampling_us(s: Shape, r: Rates, rows: int) -> float:
    """The sampler over one fp32 logit row per scheduled request: written by the lm_head and
    read back by softmax/top-k (``2·rows·V/TP·4`` bytes)."""
    return 2.0 * rows * s.vocab / s.tp * LOGIT_BYTES / r.hbm_bytes_per_us


def weight_streaming_floor_us(s: Shape, r: Rates) -> float:
    """The least time any decode step can take: streaming the non-expert weights once."""
    return weight_reads_us(s, r)


__all__ = [
    "LOGIT_BYTES", "Rates", "Shape", "UNGATED_ACTIVATIONS", "attention_compute_us", "attention_pairs",
    "CUDAGRAPH_MAX_TOKENS", "CUSTOM_AR_MAX_BYTES", "CUSTOM_AR_SIZES", "CUSTOM_AR_US", "build_shape",
    "custom_allreduce_us", "uses_custom_allreduce", "cudagraph_tokens", "decode_compute_us", "elementwise_us", "decode_kv_reads_us", "ep_dispatch_combine_us",
    "expected_experts", "gpu_rates", "moe_compute_us", "moe_expert_reads_us", "moe_tokens_touched",
    "prefill_compute_us", "prefill_memory_us", "ring_allreduce_us", "ring_gather_us",
    "sampling_us", "tp_allreduce_us", "weight_reads_us", "weight_streaming_floor_us",
]
