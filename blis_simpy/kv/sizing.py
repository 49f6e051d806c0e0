"""Choose a KV capacity model by name: ``vllm`` (the default) or ``blis`` (parity).

::

    kv_capacity(name, model, gpu, *, tp, dp, expert_parallel, block_size,
                gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
                kv_cache_dtype="auto") -> KVCapacity

* ``vllm`` — :func:`blis_simpy.kv.vllm_capacity.vllm_kv_capacity`: per GPU, as vLLM sizes it.
* ``blis`` — BLIS's formula (:func:`blis_simpy.kv.capacity.kv_capacity_blocks`, bit-identical
  block count) with its pieces as BLIS counts them: memory summed over the TP GPUs, the
  datasheet memory, a fixed activation reserve, every expert's weights on the replica. It
  ignores DP, expert parallelism, the batch limits and the KV cache dtype.

Both raise :class:`~blis_simpy.kv.capacity.KVCapacityError` when the capacity cannot be
computed or the model does not fit.
"""

from __future__ import annotations

from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.kv import capacity as blis
from blis_simpy.kv.vllm_capacity import GIB, KVCapacity, vllm_kv_capacity

CAPACITY_MODELS = ("vllm", "blis")
#: bytes per KV element of vLLM's ``--kv-cache-dtype`` values (``auto`` = the model dtype)
KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0,
                  "fp8_e5m2": 1.0}


def blis_kv_capacity(model: ModelConfig, gpu: GPUSpec, tp: int, block_size: int,
                     gpu_memory_utilization: float = 0.9) -> KVCapacity:
    """BLIS's capacity (docs/kv-capacity.md, "The `blis` rule") with its pieces; ``blocks`` is exactly
    :func:`~blis_simpy.kv.capacity.kv_capacity_blocks`. Byte pieces are BLIS's GiB figures
    converted (``total`` = datasheet memory × TP)."""
    blocks = blis.kv_capacity_blocks(model, gpu, tp, block_size, gpu_memory_utilization)
    total = gpu.memory_gib * tp
    weights = blis.weight_bytes(model)
    act_gib = blis.ACTIVATION_GIB_MOE if model.is_moe else blis.ACTIVATION_GIB_DENSE
    nt_gib = (blis.NON_TORCH_GIB_TP1 if tp == 1 else blis.NON_TORCH_GIB_PER_GPU) * tp
    requested = int(total * gpu_memory_utilization * GIB)
    act, nt = int(act_gib * GIB), int(nt_gib * GIB)
    return KVCapacity("blis", gpu.name, tp, 1, False, block_size, gpu_memory_utilization, 0, 0,
                      int(total * GIB), requested, weights, act, nt, requested - weights - act - nt,
                      blis.block_bytes(model, tp, block_size), blocks,
                      (("all parameters (BLIS count)", weights),), (("fixed reserve", act),))


def kv_capacity(name: str, model: ModelConfig, gpu: GPUSpec, *, tp: int = 1, dp: int = 1,
                expert_parallel: bool = False, block_size: int = 16,
                gpu_memory_utilization: float = 0.9, max_num_batched_tokens: int = 2048,
                max_num_seqs: int = 256, kv_cache_dtype: str = "auto") -> KVCapacity:
    """The KV capacity of ``model`` on ``gpu`` by the capacity model ``name``."""
    if name == "blis":
        return blis_kv_capacity(model, gpu, tp, block_size, gpu_memory_utilization)
    if name != "vllm":
        raise ValueError(f"unknown KV capacity model {name!r}; choose one of {', '.join(CAPACITY_MODELS)}")
    return vllm_kv_capacity(model, gpu, tp=tp, dp=dp, expert_parallel=expert_parallel,
                            block_size=block_size, gpu_memory_utilization=gpu_memory_utilization,
                            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                            kv_bytes_per_element=KV_DTYPE_BYTES.get(kv_cache_dtype))


__all__ = ["CAPACITY_MODELS", "KV_DTYPE_BYTES", "blis_kv_capacity", "kv_capacity"]
