"""What a vLLM run's meta.json says: the simulator's settings for the run (docs/workloads.md,
"vllm-log").

meta.json holds ``model``, ``engine_kwargs`` (tensor/data parallel size, expert parallel,
max_num_seqs, max_num_batched_tokens, max_model_len, seed), optional ``kv_cache``
(num_gpu_blocks, block_size in tokens, gpu_memory_utilization, enable_prefix_caching) and
``hardware.device_name``. The model and GPU are matched against the built-in catalogs;
errors name meta.json and the field.
"""

from __future__ import annotations

import re
from pathlib import Path

from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.models import builtin_models
from blis_simpy.errors import ConfigError
from blis_simpy.measured.files import MAX_META_BYTES, is_number, read_json_object
from blis_simpy.measured.run import Settings

#: the largest count meta.json may give (max_num_seqs, max_num_batched_tokens, KV blocks, ...)
MAX_SETTING = (1 << 31) - 1


def read_meta(path: Path) -> dict:
    """meta.json: a JSON object with an ``engine_kwargs`` object."""
    meta = read_json_object(path, MAX_META_BYTES)
    if not isinstance(meta.get("engine_kwargs"), dict):
        raise ConfigError("no engine_kwargs object", file=str(path), field="engine_kwargs")
    return meta


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("geforce", ""))


def find_gpu(meta: dict, run_name: str) -> tuple[str, str]:
    """The catalog GPU of a run: meta.json ``hardware.device_name`` (longest catalog name or
    alias it starts with), else the longest catalog name or alias in the run folder's name."""
    names = {}
    for key, e in builtin_gpus().entries.items():
        for n in (key, *e.aliases):
            names[_norm(n)] = key
    hw = meta.get("hardware") or {}
    if not isinstance(hw, dict):
        raise ConfigError("not a JSON object", field="hardware")
    dev = hw.get("device_name")
    if isinstance(dev, str) and dev:
        hits = [n for n in names if n and _norm(dev).startswith(n)]
        if hits:
            return names[max(hits, key=len)], f"meta.json hardware.device_name {dev!r}"
        raise ConfigError(f"device {dev!r} is not in the GPU catalog", field="hardware.device_name")
    hits = [n for n in names if n and n in _norm(run_name)]
    if not hits:
        raise ConfigError(f"run {run_name}: meta.json has no hardware.device_name and the folder name "
                          "names no catalog GPU", field="hardware")
    return names[max(hits, key=len)], "run folder name (meta.json has no hardware record)"


def find_model(name: str) -> tuple[str, str]:
    """The catalog model: the run's own name, else its ``-instruct`` variant (same shape)."""
    cat = builtin_models()
    m = name.lower()
    if cat.find(m) is not None:
        return m, "meta.json model"
    if cat.find(m + "-instruct") is not None:
        return m + "-instruct", f"{m} is not in the model catalog; its -instruct variant has the same shape"
    raise ConfigError(f"model {m!r} (nor {m}-instruct) is not in the model catalog", field="model")


def engine_settings(meta: dict, run_name: str, path: Path) -> Settings:
    """The simulator's settings from meta.json (errors name ``path``)."""
    kw = meta["engine_kwargs"]
    kv = meta.get("kv_cache") or {}

    def need_int(key: str, default=None, positive=True) -> int:
        v = kw.get(key, default)
        if v is None or not is_number(v, integer=True) or (positive and v < 1) or v > MAX_SETTING:
            raise ConfigError(f"missing or not a positive integer <= {MAX_SETTING}", file=str(path),
                              field=f"engine_kwargs.{key}")
        return int(v)

    def kv_value(key: str, default, ok, what: str):
        v = kv.get(key)
        if v is None:
            return default
        if not ok(v):
            raise ConfigError(f"not {what}", file=str(path), field=f"kv_cache.{key}")
        return v

    if not isinstance(kv, dict):
        raise ConfigError("not a JSON object", file=str(path), field="kv_cache")
    try:
        model, model_from = find_model(str(meta.get("model") or kw.get("model") or ""))
        hw, hw_from = find_gpu(meta, run_name)
    except ConfigError as exc:
        raise ConfigError(exc.problem, file=str(path), field=exc.field) from None
    mml = kw.get("max_model_len")
    pos_int = lambda v: is_number(v, integer=True) and 0 < v <= MAX_SETTING   # noqa: E731
    blocks = kv_value("num_gpu_blocks", None, pos_int, f"a positive integer <= {MAX_SETTING}")
    util = kv_value("gpu_memory_utilization", 0.9, lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]")
    seed = kw.get("seed")
    if seed is not None and not is_number(seed, integer=True):
        raise ConfigError("not an integer", file=str(path), field="engine_kwargs.seed")
    return Settings(
        model=model, model_from=model_from, hardware=hw, hardware_from=hw_from,
        tp=need_int("tensor_parallel_size", 1), dp=need_int("data_parallel_size", 1),
        expert_parallel=bool(kw.get("enable_expert_parallel", False)),
        max_num_seqs=need_int("max_num_seqs"), max_num_batched_tokens=need_int("max_num_batched_tokens"),
        max_model_len=need_int("max_model_len") if mml is not None else 0,
        block_size=int(kv_value("block_size", 16, pos_int, f"a positive integer <= {MAX_SETTING}")),
        kv_blocks=int(blocks) if blocks is not None else None,
        gpu_memory_utilization=float(util),
        prefix_caching=bool(kv.get("enable_prefix_caching", True)),
        seed=int(seed or 0))
