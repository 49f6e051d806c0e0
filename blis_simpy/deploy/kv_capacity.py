"""The KV capacity of a deployment and its context cap (docs/kv-cache.md, docs/latency-models.md).

KV blocks (of ``engine.block_size`` tokens each): explicit > catalog row > auto-calculation
(analytical backends, or blackbox with a model config) by ``engine.kv_capacity_model`` >
:data:`DEFAULT_TOTAL_KV_BLOCKS`. A deployment the auto-calculation refuses (the model does
not fit: the error says by how many GiB; a TP that does not divide the attention heads; more
than :data:`~blis_simpy.config.scenario.MAX_KV_BLOCKS` blocks) is a :class:`ConfigError`
under both capacity models: there is no silent fallback. MaxModelLen (tokens): explicit,
else derived from the model config (analytical backends), then capped to what the KV blocks
hold, with a warning.
"""

from __future__ import annotations

from blis_simpy.catalog.hfconfig import cap_max_model_len, derive_max_model_len
from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.config.scenario import MAX_KV_BLOCKS
from blis_simpy.deploy.backends import check_heads_split, is_analytical
from blis_simpy.deploy.lookups import Lookups
from blis_simpy.errors import ConfigError
from blis_simpy.kv.capacity import KVCapacityError
from blis_simpy.kv.sizing import kv_capacity
from blis_simpy.kv.vllm_capacity import KVCapacity

DEFAULT_TOTAL_KV_BLOCKS = 1_000_000


def resolve_kv_blocks(r: Lookups, cat, backend, hw, tp, vllm, model_cfg, gpu) -> int:
    """KV blocks per instance (``r.kv_source`` says where they came from)."""
    s = r.s
    eng = s.engine
    if eng.total_kv_blocks is not None:
        r.kv_source = "explicit"
        return eng.total_kv_blocks
    if s.model and hw and tp > 0:
        kv = cat.kv_blocks(s.model, hw, tp, vllm)
        if kv is not None:
            r.note(f"total_kv_blocks {kv}: catalog row {s.model} {hw} TP{tp} {vllm}")
            r.kv_source = "catalog"
            return kv
    if model_cfg is None and not is_analytical(backend) and gpu is not None and tp > 0 and s.model:
        model_cfg = r.model_config(s.model)[0]      # blackbox: only a config available offline
    if model_cfg is not None and gpu is not None and tp > 0:
        return auto_kv_capacity(r, model_cfg, gpu, tp, field="hardware").blocks
    r.kv_source = "default"
    if is_analytical(backend):
        r.warn(f"no KV capacity could be resolved; using the default {DEFAULT_TOTAL_KV_BLOCKS} blocks")
    else:
        r.note(f"total_kv_blocks {DEFAULT_TOTAL_KV_BLOCKS}: default (no catalog row, no model config)")
    return DEFAULT_TOTAL_KV_BLOCKS


def auto_kv_capacity(r: Lookups, model_cfg: ModelConfig, gpu: GPUSpec, tp: int, *,
                     field: str, what: str = "") -> KVCapacity:
    """KV blocks of ``r.s`` auto-calculated by ``engine.kv_capacity_model`` (noted, and kept in
    ``r.kv_capacity``). A deployment it refuses is a :class:`ConfigError` on ``field``, one
    line, under either model: a model that does not fit (by how many GiB), a TP that does not
    divide the attention heads (vLLM's rule), more than ``MAX_KV_BLOCKS`` blocks. ``what``
    names the deployment (a pool)."""
    s, eng = r.s, r.s.engine
    name = eng.kv_capacity_model
    check_heads_split(model_cfg, tp, field=field.rsplit(".", 1)[0] + ".tp" if "." in field else "tp")
    try:
        cap = kv_capacity(name, model_cfg, gpu, tp=tp, dp=s.dp, expert_parallel=s.enable_expert_parallel,
                          block_size=eng.block_size, gpu_memory_utilization=eng.gpu_memory_utilization,
                          max_num_batched_tokens=eng.max_num_scheduled_tokens,
                          max_num_seqs=eng.max_num_running_reqs,
                          kv_cache_dtype=eng.kv_cache_dtype)
    except KVCapacityError as exc:
        problem = str(exc) if name == "vllm" else f"{s.model} on {tp} x {gpu.name}: {exc}"
        raise ConfigError(f"KV capacity{what}: {problem}", field=field) from None
    if cap.blocks > MAX_KV_BLOCKS:
        raise ConfigError(f"KV capacity{what}: {cap.blocks} blocks auto-calculated for {tp} x {gpu.name}, "
                          f"more than the {MAX_KV_BLOCKS} a run can hold; set engine.total_kv_blocks "
                          "(or a larger block size)", field=field)
    if name == "blis":
        r.note(f"total_kv_blocks {cap.blocks}: auto-calculated for {tp} x {gpu.name}, gpu memory "
               f"utilization {eng.gpu_memory_utilization}, block size {eng.block_size}")
    else:
        per = f" per DP rank (DP {s.dp})" if s.dp > 1 else ""
        r.note(f"total_kv_blocks {cap.blocks}{per}: auto-calculated for {tp} x {gpu.name}, block size "
               f"{eng.block_size} ({cap.summary()})")
    r.kv_capacity, r.kv_source = cap, name
    return cap


#: the tensor-parallel sizes tried for the default TP, smallest first
DEFAULT_TP_CHOICES = (1, 2, 4, 8)


def default_tp(r: Lookups, model_cfg: ModelConfig, gpu: GPUSpec) -> int:
    """The TP of an analytical run that gives none, the same rule for every model: the
    smallest of :data:`DEFAULT_TP_CHOICES` that divides the attention heads and whose
    weights leave room for a KV cache under ``engine.kv_capacity_model`` (noted). None
    fits: a :class:`ConfigError` on ``tp``."""
    eng = r.s.engine
    for tp in DEFAULT_TP_CHOICES:
        heads = model_cfg.num_heads or 0
        if heads and heads % tp:
            continue
        try:
            cap = kv_capacity(eng.kv_capacity_model, model_cfg, gpu, tp=tp, dp=r.s.dp,
                              expert_parallel=r.s.enable_expert_parallel, block_size=eng.block_size,
                              gpu_memory_utilization=eng.gpu_memory_utilization,
                              max_num_batched_tokens=eng.max_num_scheduled_tokens,
                              max_num_seqs=eng.max_num_running_reqs, kv_cache_dtype=eng.kv_cache_dtype)
        except KVCapacityError:
            continue
        if cap.blocks > 0:
            r.note(f"tp {tp}: the smallest TP whose weights and a KV cache fit on {gpu.name} "
                   "(no tp given)")
            return tp
    raise ConfigError(f"{model_cfg.name or r.s.model} does not fit on {DEFAULT_TP_CHOICES[-1]} x {gpu.name} "
                      "at any TP of 1, 2, 4, 8: pass --tp", field="tp")


def resolve_max_model_len(r: Lookups, backend: str, model_cfg, total_blocks: int) -> int:
    """MaxModelLen in tokens (0 = unlimited) for ``total_blocks`` KV blocks."""
    eng = r.s.engine
    m = eng.max_model_len
    if not is_analytical(backend):
        return m
    if m == 0 and model_cfg is not None:
        m = derive_max_model_len(model_cfg)
        if m > 0:
            r.note(f"max_model_len {m}: derived from max_position_embeddings")
    capped = cap_max_model_len(m, total_blocks, eng.block_size)
    if capped != m:
        r.warn(f"max_model_len {m} exceeds the KV capacity ({total_blocks} blocks x {eng.block_size} "
               f"tokens); capped to {capped}")
    return capped
