"""``blis-simpy catalog capacity`` (also ``catalog --capacity``): the KV capacity of a model on
a GPU, piece by piece, as the run would auto-size it (offline).

::

    blis-simpy catalog capacity --model M --hardware G [--tp N] [--dp N]
        [--enable-expert-parallel] [--gpu-memory-utilization F] [--max-num-batched-tokens N]
        [--max-num-seqs N] [--block-size-in-tokens N] [--kv-capacity-model vllm|blis]
        [--kv-cache-dtype auto|fp8|...] [--model-config-folder DIR] [--format table|json]

The table lists the driver memory, the requested share, every weight and activation piece,
the non-torch increase, the bytes left for the KV cache, the block size in bytes and the
blocks and tokens per DP rank. ``--format json`` prints ``{"kv_capacity": {...}}`` with the
same pieces in bytes and GiB. A model that does not fit is an error (exit 2, one line).
"""

from __future__ import annotations

import json
import os
import sys

from blis_simpy.catalog.hardware import GPUCatalog
from blis_simpy.catalog.types import ModelConfig
from blis_simpy.errors import ConfigError
from blis_simpy.kv.capacity import KVCapacityError
from blis_simpy.kv.sizing import CAPACITY_MODELS, KV_DTYPE_BYTES, kv_capacity
from blis_simpy.kv.vllm_capacity import GIB, MIB, KVCapacity


def _model_config(model: str | None, folder: str) -> ModelConfig:
    from blis_simpy.catalog.hfconfig import parse_hf_config
    from blis_simpy.catalog.models import builtin_models
    if not model:
        raise ConfigError("is required for the capacity (e.g. --model meta-llama/llama-3.1-8b)", field="--model")
    if folder:
        path = os.path.join(folder, "config.json")
        if not os.path.isfile(path):
            raise ConfigError(f"no config.json in {folder}", field="--model-config-folder")
        return parse_hf_config(path, name=model)
    entry = builtin_models().find(model)
    if entry is None:
        raise ConfigError(f"model {model} is not in the built-in catalog; pass --model-config-folder DIR "
                          "with its HuggingFace config.json", field="--model")
    return entry.config


def compute(gpus: GPUCatalog, model: str | None, hardware: str | None, *, tp: int, dp: int,
            expert_parallel: bool, util: float, max_num_batched_tokens: int, max_num_seqs: int,
            block_size: int, capacity_model: str, kv_cache_dtype: str,
            model_config_folder: str = "") -> KVCapacity:
    """The capacity the options describe; input problems are :class:`ConfigError` on the flag."""
    for flag, v in (("--tp", tp), ("--dp", dp), ("--max-num-batched-tokens", max_num_batched_tokens),
                    ("--max-num-seqs", max_num_seqs), ("--block-size-in-tokens", block_size)):
        if v <= 0:
            raise ConfigError(f"must be > 0, got {v}", field=flag)
    if not 0 < util <= 1:
        raise ConfigError(f"must be in (0, 1], got {util}", field="--gpu-memory-utilization")
    if capacity_model not in CAPACITY_MODELS:
        raise ConfigError(f"must be one of {', '.join(CAPACITY_MODELS)}, got {capacity_model!r}",
                          field="--kv-capacity-model")
    if kv_cache_dtype not in KV_DTYPE_BYTES:
        raise ConfigError(f"must be one of {', '.join(KV_DTYPE_BYTES)}, got {kv_cache_dtype!r}",
                          field="--kv-cache-dtype")
    cfg = _model_config(model.lower() if model else None, model_config_folder)
    if not hardware:
        raise ConfigError(f"is required for the capacity; available: {', '.join(gpus.names())}",
                          field="--hardware")
    gpu = gpus.get(hardware, field="--hardware")
    try:
        return kv_capacity(capacity_model, cfg, gpu, tp=tp, dp=dp, expert_parallel=expert_parallel,
                           block_size=block_size, gpu_memory_utilization=util,
                           max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                           kv_cache_dtype=kv_cache_dtype)
    except KVCapacityError as exc:
        raise ConfigError(f"KV capacity: {exc}", field="--hardware") from None


def _gib(b: float) -> str:
    return f"{b / GIB:,.3f}"


def table_rows(cap: KVCapacity) -> list[tuple[str, str, str]]:
    """``(piece, GiB, bytes)`` rows of the capacity table."""
    rows = [("total memory per GPU" + (" (BLIS: datasheet x TP)" if cap.capacity_model == "blis"
                                       else " (driver)"), _gib(cap.total_bytes), f"{cap.total_bytes:,}"),
            (f"x gpu_memory_utilization {cap.gpu_memory_utilization:g}", _gib(cap.requested_bytes),
             f"{cap.requested_bytes:,}"),
            ("− weights", _gib(cap.weights_bytes), f"{cap.weights_bytes:,}")]
    rows += [(f"    {name}", _gib(b), f"{b:,}") for name, b in cap.weights]
    rows.append(("− activation peak", _gib(cap.activation_bytes), f"{cap.activation_bytes:,}"))
    if cap.capacity_model == "vllm":
        S = min(cap.max_num_batched_tokens, cap.max_num_seqs)
        label = {"forward": f"forward of {cap.max_num_batched_tokens} tokens",
                 "sampler": f"sampler over {S} rows"}
        rows += [(f"    {label.get(name, name)}{' (peak)' if b == cap.activation_bytes else ''}",
                  _gib(b), f"{b:,}") for name, b in cap.activation]
    rows.append(("− non-torch increase", _gib(cap.non_torch_bytes), f"{cap.non_torch_bytes:,}"))
    rows.append(("= available for the KV cache", _gib(cap.available_bytes), f"{cap.available_bytes:,}"))
    rows.append((f"block of {cap.block_size} tokens (per GPU, all layers)", f"{cap.block_bytes / MIB:,.3f} MiB",
                 f"{cap.block_bytes:,}"))
    per = " per DP rank" if cap.dp > 1 else ""
    rows.append((f"KV blocks{per}", f"{cap.blocks:,}", ""))
    rows.append((f"KV tokens{per}", f"{cap.tokens:,}", ""))
    if cap.dp > 1:
        rows.append((f"KV tokens of the engine ({cap.dp} DP ranks)", f"{cap.tokens * cap.dp:,}", ""))
    return rows


def print_capacity(cap: KVCapacity, model: str) -> None:
    from rich.table import Table

    from blis_simpy.cli.tables import stdout_console
    con = stdout_console()
    ep = ", EP" if cap.expert_parallel else ""
    t = Table(title=f"KV capacity ({cap.capacity_model}): {model} on {cap.gpu}, TP {cap.tp}, DP {cap.dp}{ep}",
              title_justify="left")
    t.add_column("piece")
    t.add_column("GiB", justify="right")
    t.add_column("bytes", justify="right")
    for row in table_rows(cap):
        t.add_row(*row)
    con.print(t)
    con.print(f"KV capacity: {cap.blocks:,} blocks ({cap.summary()})", highlight=False)


def show(cap: KVCapacity, model: str, fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps({"model": model, "kv_capacity": cap.to_dict()}, indent=2) + "\n")
    else:
        print_capacity(cap, model)


# ---------------------------------------------------------------------------- run header
_SOURCE_TEXT = {"explicit": "given", "catalog": "catalog row", "default": "default, not sized"}


def deployment_kv_text(dep) -> str:
    """``2,588 blocks (vllm: total 23.52 GiB x 0.9 − weights … = 5.06 GiB)`` for a
    :class:`~blis_simpy.deploy.resolve.Deployment`."""
    cap = dep.kv_capacity
    how = cap.summary() if cap is not None else _SOURCE_TEXT.get(dep.kv_source, dep.kv_source or "given")
    per = " per DP rank" if cap is not None and cap.dp > 1 else ""
    return f"{dep.total_kv_blocks:,} blocks{per} ({how})"


def run_header_line(plan) -> str:
    """``KV capacity: …`` for the run header: one deployment, or each pool's where they differ
    (``plan``: a :class:`~blis_simpy.deploy.pools.PoolLayout`)."""
    roles = list(dict.fromkeys(plan.roles))
    deps = {role: plan.deployments[role] for role in roles}
    texts = {role: deployment_kv_text(d) for role, d in deps.items()}
    if len(set(texts.values())) == 1:
        return f"KV capacity: {next(iter(texts.values()))}"
    return "KV capacity: " + "; ".join(f"{role} {t}" for role, t in texts.items())
