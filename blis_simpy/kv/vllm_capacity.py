"""KV-cache capacity as vLLM v1 computes it (docs/kv-capacity.md): the ``vllm`` capacity model.

::

    vllm_kv_capacity(model, gpu, *, tp=1, dp=1, expert_parallel=False, block_size=16,
                     gpu_memory_utilization=0.9, max_num_batched_tokens=2048,
                     max_num_seqs=256, kv_bytes_per_element=None) -> KVCapacity

vLLM sizes the KV cache per GPU (``gpu_worker.determine_available_memory``)::

    requested  = ceil(total × gpu_memory_utilization)        total = cudaMemGetInfo total
    available  = requested − weights − activation peak − non-torch increase
    blocks     = available // page_bytes // layers            (kv_cache_utils.get_num_blocks)

and an engine takes the minimum over its TP ranks. Everything here is per GPU; every DP rank
is an engine with its own pool, so ``blocks`` is per DP rank. ``total`` is the driver figure
(:attr:`GPUSpec.memory_torch_gib`, else the datasheet ``memory_gib``).

**Weights** (what vLLM's "Model loading took" counts): parameters from the config with the
real head dim — Q and O ``d × H·hd``, K and V ``d × Hkv·hd``, a gated MLP of three matrices,
the embedding and (unless tied) lm_head, both vocab-parallel over TP with the vocabulary padded
to 64, RMS norms — plus the rotary cos/sin cache buffer (``max_position_embeddings × rotary
dim`` elements, one per model). Sharding: attention, dense MLP, embeddings, lm_head and shared
experts over TP; KV heads over TP, replicated when ``Hkv < TP`` (``max(1, Hkv // TP)`` per
GPU); routed experts over TP×DP (expert parallel: whole experts, ``ceil(E / (TP·DP))`` per GPU;
otherwise every expert tensor-sharded, ``ceil(f / (TP·DP))`` — the same bytes when divisible);
the router is replicated. Linear layers take :attr:`ModelConfig.effective_weight_bytes_per_param`
(quantised); embeddings, lm_head, norms, router and the rope cache stay in the model dtype
(quantisation recipes leave them out). MLA attention weights use the generic formula (the
config fields of the low-rank projections are not read): an approximation of ~10%.

**Activation peak** of the profile run: one dummy forward of ``T = max_num_batched_tokens``
tokens over ``S = min(T, max_num_seqs)`` requests, then a sampler pass over ``S`` rows with
top-k/top-p on. The peak is the larger of

* the forward: ``T × act_bytes × (FORWARD_STREAMS·d + widest layer intermediate)`` plus the
  attention workspace (softmax LSE, fp32 per head and token). The widest intermediate is the
  gated MLP's ``2f + f`` (per TP shard), or QKV plus the attention output, or an MoE layer's
  fused-expert caches ``tokens × top_k × (3·f_rank + d)`` (tokens = ``T × DP``: vLLM gathers
  the DP ranks' tokens for the MoE layer) plus its shared experts;
* the sampler: the model's hidden states ``T × d`` kept by the profile run, the gathered last
  hidden states and their random replacement ``2 × S × d``, the bf16 logits ``S × V_pad`` and
  :data:`SAMPLER_BYTES_PER_LOGIT` live bytes per logit: the float32 copy (4), the top-k/top-p
  sort's float32 values (4) and int64 indices (8), and the radix sort's alternate key and value
  buffers (4 + 8). With TP the logits are all-gathered, so every rank samples the full vocab.

**Non-torch increase** (CUDA memory outside PyTorch's allocator that appears between the
start-up snapshot and the end of profiling: lazily loaded kernel modules, library workspaces):
:data:`NON_TORCH_INCREASE_BYTES`, a constant.

**Calibration, stated plainly:** :data:`NON_TORCH_INCREASE_BYTES` = 188 MiB is the one
constant fitted, on one logged run: Llama-3.1-8B bf16 on an RTX 4090 (driver total
25,250,627,584 B), vLLM 0.19, util 0.9, max_num_batched_tokens 2048, max_num_seqs 256, block
16 → 2588 blocks. With the structure above that run allows a non-torch increase in
(186.9, 188.9] MiB; 188 MiB is the middle (the logged H100 LLaVA run reports 0.07 GiB, so the
figure varies with GPU, driver and version). Every other constant is a tensor size.

CUDA graphs are not deducted (vLLM 0.19 captures them after the KV allocation, from the
``1 − util`` slack). A model that does not fit raises :class:`KVCapacityError` with the GiB
shortfall (and the TP that would fit, when one does).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.kv.capacity import KVCapacityError

GIB = 1 << 30
MIB = 1 << 20
#: vLLM pads the vocabulary of the embedding and lm_head to a multiple of this
VOCAB_PADDING = 64
#: hidden-size tensors live across a layer in the forward pass (hidden states, residual)
FORWARD_STREAMS = 2
#: attention workspace: FlashAttention's float32 softmax log-sum-exp per head and token
ATTN_LSE_BYTES = 4
#: live bytes per logit at the sampler's peak besides the bf16 logits: float32 copy (4),
#: sorted values (4), sort indices int64 (8), radix sort alternate keys (4) and values (8)
SAMPLER_BYTES_PER_LOGIT = 4 + 4 + 8 + 4 + 8
#: CUDA memory outside PyTorch's allocator gained during start-up and profiling, per GPU —
#: CALIBRATED on the one logged RTX 4090 run (module docstring)
NON_TORCH_INCREASE_BYTES = 188 * MIB
#: TP degrees tried when suggesting a deployment for a model that does not fit
_TP_CANDIDATES = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class KVCapacity:
    """The pieces of one KV-capacity calculation; bytes per GPU unless noted.

    ``blocks`` is per DP rank (one engine's pool; its TP ranks agree on it); ``tokens`` =
    ``blocks × block_size``. ``weights`` / ``activation`` break down as ``(name, bytes)`` pairs.
    """

    capacity_model: str
    gpu: str
    tp: int
    dp: int
    expert_parallel: bool
    block_size: int
    gpu_memory_utilization: float
    max_num_batched_tokens: int
    max_num_seqs: int
    total_bytes: int
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    available_bytes: int
    block_bytes: int          # one block: all layers on the rank, K and V
    blocks: int               # per DP rank
    weights: tuple[tuple[str, int], ...] = ()
    activation: tuple[tuple[str, int], ...] = ()

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size

    @property
    def kv_bytes_per_token(self) -> float:
        return self.block_bytes / self.block_size

    def gib(self, name: str) -> float:
        """``gib("weights")`` = ``weights_bytes`` in GiB."""
        return getattr(self, f"{name}_bytes") / GIB

    def summary(self) -> str:
        """``vllm: total 23.52 GiB x 0.9 − weights 14.99 − activation 0.94 − non-torch 0.18
        = 5.06 GiB`` (the run header and the resolver's note)."""
        g = self.gib
        return (f"{self.capacity_model}: total {g('total'):.2f} GiB x {self.gpu_memory_utilization:g}"
                f" − weights {g('weights'):.2f} − activation {g('activation'):.2f}"
                f" − non-torch {g('non_torch'):.2f} = {g('available'):.2f} GiB")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["weights"] = dict(self.weights)
        d["activation"] = dict(self.activation)
        d["tokens"] = self.tokens
        for k in ("total", "requested", "weights", "activation", "non_torch", "available"):
            d[f"{k}_gib"] = self.gib(k)
        return d


def vllm_kv_gib(total_gib: float, gpu_memory_utilization: float, weights_gib: float,
                activation_gib: float, non_torch_gib: float) -> float:
    """KV memory (GiB) from the pieces a vLLM log prints: ``total × util − weights −
    activation − non-torch`` (the H100 LLaVA log: 79.19 × 0.9 − 14.08 − 1.97 − 0.07 = 55.15)."""
    return total_gib * gpu_memory_utilization - weights_gib - activation_gib - non_torch_gib


# ---------------------------------------------------------------------------- pieces
def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def kv_heads_per_gpu(model: ModelConfig, tp: int) -> int:
    """KV heads on one GPU: sharded over TP, replicated when there are fewer than TP."""
    kv = model.num_kv_heads if model.num_kv_heads > 0 else model.num_heads
    return max(1, kv // tp)


def _padded_vocab(model: ModelConfig) -> int:
    return _ceil_div(model.vocab_size, VOCAB_PADDING) * VOCAB_PADDING


def page_bytes(model: ModelConfig, tp: int, block_size: int, kv_bytes: float) -> int:
    """One layer's KV page of ``block_size`` tokens on one GPU (vLLM's page size). MLA keeps one
    latent vector of ``kv_lora_rank + qk_rope_head_dim`` per token, not sharded by TP."""
    if model.kv_lora_rank > 0:
        return int(block_size * (model.kv_lora_rank + model.qk_rope_head_dim) * kv_bytes)
    return int(2 * block_size * kv_heads_per_gpu(model, tp) * model.real_head_dim * kv_bytes)


def _ffn_dims(model: ModelConfig) -> tuple[int, int]:
    """(dense-layer FFN dim, routed-expert FFN dim)."""
    dense = model.dense_intermediate_size or model.intermediate_size
    return dense, model.moe_intermediate_size or model.intermediate_size


def weight_pieces(model: ModelConfig, tp: int, dp: int, expert_parallel: bool) -> tuple[tuple[str, int], ...]:
    """Weight bytes on one GPU, by part (module docstring)."""
    d, L, hd, H = model.hidden_size, model.num_layers, model.real_head_dim, model.num_heads
    act_b, lin_b = model.bytes_per_param, model.effective_weight_bytes_per_param
    vocab_rank = _ceil_div(_padded_vocab(model), tp)
    kv_rank = kv_heads_per_gpu(model, tp)
    attn = d * (2 * (H // tp) * hd + 2 * kv_rank * hd)          # Q, O sharded; K, V per rank
    f_dense, f_moe = _ffn_dims(model)
    moe_layers = model.num_moe_layers
    dense_layers = L - moe_layers
    parts = [("embedding", int(vocab_rank * d * act_b))]
    if not model.tie_word_embeddings:
        parts.append(("lm_head", int(vocab_rank * d * act_b)))
    parts.append(("attention", int(L * attn * lin_b)))
    if dense_layers:
        parts.append(("dense MLP", int(dense_layers * 3 * d * _ceil_div(f_dense, tp) * lin_b)))
    if moe_layers:
        e, shards = model.num_local_experts, tp * dp
        if expert_parallel:
            routed = _ceil_div(e, shards) * 3 * d * f_moe
        else:
            routed = e * 3 * d * _ceil_div(f_moe, shards)
        parts.append(("routed experts", int(moe_layers * routed * lin_b)))
        if model.shared_expert_intermediate_size > 0:
            shared = 3 * d * _ceil_div(model.shared_expert_intermediate_size, tp)
            parts.append(("shared experts", int(moe_layers * shared * lin_b)))
        parts.append(("router", int(moe_layers * e * d * act_b)))
    parts.append(("norms", int((2 * L + 1) * d * act_b)))
    rot = model.qk_rope_head_dim if model.kv_lora_rank > 0 else hd
    parts.append(("rope cache", int(model.max_position_embeddings * rot * act_b)))
    return tuple(parts)


def activation_pieces(model: ModelConfig, tp: int, dp: int, expert_parallel: bool,
                      max_num_batched_tokens: int, max_num_seqs: int) -> tuple[tuple[str, int], ...]:
    """The profile run's two candidate peaks (bytes per GPU): ``forward`` and ``sampler``."""
    T = max_num_batched_tokens
    S = min(T, max_num_seqs)
    d, hd, act_b = model.hidden_size, model.real_head_dim, model.bytes_per_param
    h_rank = model.num_heads // tp
    attn_w = (h_rank + 2 * kv_heads_per_gpu(model, tp)) * hd + h_rank * hd    # QKV + output
    f_dense, f_moe = _ffn_dims(model)
    widths = [attn_w]
    if model.num_layers > model.num_moe_layers:
        widths.append(3 * _ceil_div(f_dense, tp))                          # gate+up, act(gate)*up
    if model.num_moe_layers:
        f_rank = f_moe if expert_parallel else _ceil_div(f_moe, tp * dp)
        moe_w = dp * max(1, model.num_experts_per_tok) * (3 * f_rank + d)
        moe_w += 3 * _ceil_div(model.shared_expert_intermediate_size, tp)
        widths.append(moe_w)
    forward = int(T * act_b * (FORWARD_STREAMS * d + max(widths))) + T * h_rank * ATTN_LSE_BYTES
    logits = S * _padded_vocab(model)
    sampler = int((T + 2 * S) * d * act_b + logits * act_b) + S * model.vocab_size * SAMPLER_BYTES_PER_LOGIT
    return (("forward", forward), ("sampler", sampler))


# ---------------------------------------------------------------------------- the model
def _validate(model: ModelConfig, gpu: GPUSpec, tp: int, dp: int, block_size: int, util: float,
              tokens: int, seqs: int, kv_bytes: float) -> None:
    if not (math.isfinite(util) and 0 < util <= 1):
        raise KVCapacityError(f"gpu memory utilization must be in (0, 1], got {util}")
    for what, v in (("TP", tp), ("DP", dp), ("block size", block_size),
                    ("max_num_batched_tokens", tokens), ("max_num_seqs", seqs)):
        if v <= 0:
            raise KVCapacityError(f"{what} must be > 0, got {v}")
    _check_sizable(model, kv_bytes)
    if model.num_heads % tp:
        raise KVCapacityError(f"num_attention_heads {model.num_heads} is not divisible by TP {tp}")
    kv = model.num_kv_heads if model.num_kv_heads > 0 else model.num_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise KVCapacityError(f"num_key_value_heads {kv} and TP {tp}: one must divide the other")
    _check_gpu(gpu)


def _check_gpu(gpu: GPUSpec) -> None:
    if _total_bytes(gpu) <= 0:
        raise KVCapacityError(f"GPU {gpu.name} memory must be > 0 GiB")


def _check_sizable(model: ModelConfig, kv_bytes: float) -> None:
    """What any capacity of ``model`` needs, whatever the GPU, TP and engine settings."""
    for what, v in (("num_attention_heads", model.num_heads), ("num_hidden_layers", model.num_layers),
                    ("hidden_size", model.hidden_size), ("vocab_size", model.vocab_size)):
        if v <= 0:
            raise KVCapacityError(f"model {what} must be > 0, got {v}")
    if model.real_head_dim <= 0:
        raise KVCapacityError("model head dimension is unknown")
    if not (math.isfinite(model.bytes_per_param) and model.bytes_per_param > 0):
        raise KVCapacityError(f"model bytes per parameter must be > 0, got {model.bytes_per_param} "
                              "(unknown torch_dtype?)")
    if not (math.isfinite(kv_bytes) and kv_bytes > 0):
        raise KVCapacityError(f"KV bytes per element must be > 0, got {kv_bytes}")
    if model.moe_count_missing:
        raise KVCapacityError("the model looks MoE (shared experts or num_experts_per_tok) but has no "
                              "expert count; set --total-kv-blocks explicitly")


def _total_bytes(gpu: GPUSpec) -> int:
    gib = gpu.memory_torch_gib if gpu.memory_torch_gib > 0 else gpu.memory_gib
    return int(gib * GIB) if math.isfinite(gib) else 0


def _compute(model, gpu, tp, dp, ep, block_size, util, tokens, seqs, kv_bytes) -> KVCapacity:
    total = _total_bytes(gpu)
    requested = math.ceil(total * util)
    weights = weight_pieces(model, tp, dp, ep)
    act = activation_pieces(model, tp, dp, ep, tokens, seqs)
    w, a, nt = sum(b for _, b in weights), max(b for _, b in act), NON_TORCH_INCREASE_BYTES
    available = requested - w - a - nt
    page = page_bytes(model, tp, block_size, kv_bytes)
    blocks = max(0, available) // page // model.num_layers if page > 0 else 0
    return KVCapacity("vllm", gpu.name, tp, dp, ep, block_size, util, tokens, seqs, total, requested, w, a,
                      nt, available, page * model.num_layers, blocks, weights, act)


def vllm_kv_capacity(model: ModelConfig, gpu: GPUSpec, *, tp: int = 1, dp: int = 1,
                     expert_parallel: bool = False, block_size: int = 16,
                     gpu_memory_utilization: float = 0.9, max_num_batched_tokens: int = 2048,
                     max_num_seqs: int = 256, kv_bytes_per_element: float | None = None) -> KVCapacity:
    """vLLM's KV capacity for ``model`` on ``gpu`` (module docstring). ``kv_bytes_per_element``:
    the KV cache dtype's size; ``None`` = the model dtype. Raises :class:`KVCapacityError`
    when an input is invalid or the model does not fit (with the shortfall in GiB)."""
    kv_bytes = model.bytes_per_param if kv_bytes_per_element is None else kv_bytes_per_element
    ep = bool(expert_parallel) and model.is_moe
    args = (block_size, gpu_memory_utilization, max_num_batched_tokens, max_num_seqs, kv_bytes)
    _validate(model, gpu, tp, dp, block_size, gpu_memory_utilization, max_num_batched_tokens,
              max_num_seqs, kv_bytes)
    cap = _compute(model, gpu, tp, dp, ep, *args)
    if cap.blocks > 0:
        return cap
    if cap.available_bytes <= 0:
        need = cap.weights_bytes + cap.activation_bytes + cap.non_torch_bytes
        hint = _fitting_tp(model, gpu, tp, dp, ep, args)
        raise KVCapacityError(
            f"{model.name or 'the model'} does not fit on {gpu.name} at TP {tp}: short by "
            f"{(need - cap.requested_bytes) / GIB:.2f} GiB per GPU (weights {cap.gib('weights'):.2f} + "
            f"activation {cap.gib('activation'):.2f} + non-torch {cap.gib('non_torch'):.2f} GiB > "
            f"{cap.gib('total'):.2f} GiB x {gpu_memory_utilization:g} = {cap.gib('requested'):.2f} GiB)"
            f"{hint}")
    raise KVCapacityError(f"no room for one KV block on {gpu.name} at TP {tp}: "
                          f"{cap.available_bytes / MIB:.1f} MiB free, a block takes "
                          f"{cap.block_bytes / MIB:.1f} MiB")


def smallest_fitting(model: ModelConfig, gpu: GPUSpec, tps=(1, *_TP_CANDIDATES), *,
                     expert_parallel: bool = False) -> KVCapacity | None:
    """vLLM's capacity (default engine settings) at the smallest TP of ``tps`` at which
    ``model`` fits on ``gpu`` with room for KV blocks; None when it fits at none of them.
    Raises :class:`KVCapacityError` when the model or GPU cannot be sized at all (an unknown
    head dimension or dtype, a MoE without its expert count, a GPU without memory)."""
    _check_sizable(model, model.bytes_per_param)
    _check_gpu(gpu)
    for t in tps:
        try:
            return vllm_kv_capacity(model, gpu, tp=t, expert_parallel=expert_parallel)
        except KVCapacityError:
            continue
    return None


def _fitting_tp(model, gpu, tp, dp, ep, args) -> str:
    for t in _TP_CANDIDATES:
        if t <= tp:
            continue
        try:
            _validate(model, gpu, t, dp, *args)
        except KVCapacityError:
            continue
        if _compute(model, gpu, t, dp, ep, *args).blocks > 0:
            return f"; TP {t} ({t * dp} GPUs) would fit"
    return ""


__all__ = ["KVCapacity", "KVCapacityError", "activation_pieces", "kv_heads_per_gpu", "page_bytes",
           "smallest_fitting", "vllm_kv_capacity", "vllm_kv_gib", "weight_pieces"]
