"""HuggingFace ``config.json`` → :class:`~blis_simpy.catalog.types.ModelConfig`,
and the context length a model supports (docs/latency-models.md, "HuggingFace config.json").

Public API::

    parse_hf_config(source, *, name="", file=None) -> ModelConfig
        source: a dict (an already-decoded config.json), a path to a config.json, or a
        folder holding one. ``name`` is the model ID (lower-cased, e.g.
        ``redhatai/phi-4-quantized.w4a16``); it feeds the model-name quantisation tier.
        ``file`` names the origin of a dict in error messages.
    load_hf_json(path) -> dict
        read and decode a config.json (ConfigError on a missing file or bad JSON).
    looks_like_hf_config(data) -> bool
        has ``num_hidden_layers`` or ``hidden_size`` at top level or in ``text_config``.
    weight_bytes_from_quantization(data, name) -> float
        the three-tier weight-precision rule (0.0 = not quantised / unknown).
    derive_max_model_len(cfg) -> int
        ``max_position_embeddings`` with rope scaling applied (0 = unknown).
    cap_max_model_len(max_len, total_blocks, block_size) -> int
        the KV-capacity cap (docs/latency-models.md; the caller logs the warning when it changes the value).

No network access, ever: locating or downloading the file is the caller's business.

Parsing rules (summary; docs/latency-models.md, "HuggingFace config.json"):

* ``text_config`` pivot: an object ``text_config`` has its keys copied over the top level.
* integers are JSON numbers truncated toward zero; missing or ``null`` ⇒ 0. A value of the
  wrong type (string, bool, list, object, NaN/Inf, ≥ 2^63) is a :class:`ConfigError` naming the
  file and the key: BLIS would silently read 0 there.
* KV heads: first non-zero of ``num_key_value_heads``, ``num_kv_heads``,
  ``multi_query_group_num``; else ``num_attention_heads``.
* intermediate: ``intermediate_size``, else ``ffn_hidden_size``.
* bytes/param from ``torch_dtype`` (else ``dtype``); unknown ⇒ 0.
* experts: ``num_local_experts``; if ≤ 1 the first of ``num_routed_experts``,
  ``n_routed_experts``, ``num_experts`` that is > 1 (so a single expert stays dense).
  ``moe_count_missing`` is set when the model looks MoE (``n_shared_experts > 0`` or
  ``num_experts_per_tok > 0``) but no expert count > 1 exists (KV auto-sizing refuses it).
* shared-expert FFN dim: ``shared_expert_intermediate_size`` if > 0, else
  ``n_shared_experts × (moe_intermediate_size or intermediate)``.
* ``head_dim`` is read into :attr:`ModelConfig.head_dim` (0 when absent or ``null``); BLIS's
  backends still use hidden/heads (they never look at it), ``physics`` and the ``vllm`` KV
  capacity use :attr:`ModelConfig.real_head_dim`.
* MoE layout and attention extras, 0 when absent: ``first_k_dense_replace`` (DeepSeek: leading
  dense layers), ``interleave_moe_layer_step`` (Llama-4: every s-th layer is MoE),
  ``intermediate_size_mlp`` → ``dense_intermediate_size`` (Llama-4 dense-layer FFN),
  ``kv_lora_rank`` and ``qk_rope_head_dim`` (DeepSeek multi-head latent attention).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from blis_simpy.catalog.types import ModelConfig
from blis_simpy.errors import ConfigError
from blis_simpy.infile import json_loads, open_input

#: torch dtype name → bytes per parameter (activations and KV cache use this).
DTYPE_BYTES = {
    "float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "uint8": 1.0,
    "fp8": 1.0, "int4": 1.0, "nf4": 1.0,
}

_EXPERT_CHAIN = ("num_routed_experts", "n_routed_experts", "num_experts")
_KV_HEADS_CHAIN = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num")
_SEP = r"(?:^|(?<=[.\-_/]))"
_END = r"(?=$|[.\-_/])"
_W_A_RE = re.compile(_SEP + r"w(\d+)a(\d+)" + _END)
_FP8_RE = re.compile(_SEP + r"fp8" + _END)
_NO_SCALE_ROPE = frozenset({"su", "longrope", "llama3"})
_TWO63 = 9.223372036854775807e18


# ------------------------------------------------------------------------------ reading
def _config_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


#: a HuggingFace config.json is a few KB; refuse one over this many bytes before reading it all
MAX_CONFIG_BYTES = 4 << 20


def load_hf_json(path: str | os.PathLike) -> dict:
    """Read a config.json (or ``<folder>/config.json``) into a dict. A file over
    :data:`MAX_CONFIG_BYTES`, not UTF-8, not JSON or nested too deeply is a ConfigError."""
    p = _config_path(path)
    try:
        with open_input(p, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("no such file", file=str(p)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=str(p)) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"larger than {MAX_CONFIG_BYTES} bytes: not a HuggingFace config.json",
                          file=str(p))
    try:
        data = json_loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})", file=str(p)) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON: {exc.msg}", file=str(p), line=exc.lineno) from None
    except RecursionError:
        raise ConfigError("invalid JSON: nested too deeply", file=str(p)) from None
    if not isinstance(data, dict):
        raise ConfigError("a HuggingFace config.json must be a JSON object", file=str(p))
    return data


def looks_like_hf_config(data) -> bool:
    """True if ``data`` has ``num_hidden_layers`` or ``hidden_size`` (top level or text_config)."""
    if not isinstance(data, dict):
        return False
    keys = ("num_hidden_layers", "hidden_size")
    if any(k in data for k in keys):
        return True
    tc = data.get("text_config")
    return isinstance(tc, dict) and any(k in tc for k in keys)


def _pivot(data: dict) -> dict:
    tc = data.get("text_config")
    if isinstance(tc, dict):
        merged = dict(data)
        merged.update(tc)
        return merged
    return data


class _Reader:
    """Typed access to the pivoted config with file/field-located errors."""

    def __init__(self, data: dict, file: str | None):
        self.d = data
        self.file = file

    def err(self, key: str, problem: str) -> ConfigError:
        return ConfigError(problem, file=self.file, field=key)

    def int(self, key: str) -> int:
        v = self.d.get(key)
        if v is None:
            return 0
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(key, f"must be a number, got {type(v).__name__} {v!r}")
        if isinstance(v, float):
            if not math.isfinite(v) or abs(v) >= _TWO63:
                raise self.err(key, f"must be a finite number below 2^63, got {v!r}")
            return int(v)  # truncation toward zero
        if abs(v) >= 2**63:
            raise self.err(key, f"must be below 2^63, got {v!r}")
        return v

    def str(self, key: str) -> str:
        v = self.d.get(key)
        if v is None:
            return ""
        if not isinstance(v, str):
            raise self.err(key, f"must be a string, got {type(v).__name__} {v!r}")
        return v

    def bool(self, key: str) -> bool:
        v = self.d.get(key)
        if v is None:
            return False
        if not isinstance(v, bool):
            raise self.err(key, f"must be true or false, got {v!r}")
        return v


# ------------------------------------------------------------------------ quantisation
def _number(v) -> float | None:
    """A JSON number or a numeric string as float (None otherwise)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        f = float(v)
    elif isinstance(v, str):
        try:
            f = float(v.strip())
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


def _from_quantization_config(qc) -> float:
    if not isinstance(qc, dict):
        return 0.0
    bits = _number(qc.get("bits"))
    if bits is not None and bits > 0:
        return bits / 8.0
    method = qc.get("quant_method")
    method = method.lower() if isinstance(method, str) else ""
    if method == "fp8":
        return 1.0
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        if isinstance(groups, dict):
            for key in sorted(groups):
                g = groups[key]
                w = g.get("weights") if isinstance(g, dict) else None
                nb = _number(w.get("num_bits")) if isinstance(w, dict) else None
                if nb is not None and nb > 0:
                    return nb / 8.0
    return 0.0


def _from_model_name(name: str) -> float:
    name = name.lower()
    m = _W_A_RE.search(name)
    if m is not None and int(m.group(1)) > 0:
        return int(m.group(1)) / 8.0
    if _FP8_RE.search(name):
        return 1.0
    return 0.0


def weight_bytes_from_quantization(data: dict, name: str = "") -> float:
    """Weight bytes/param of a quantised model, or 0.0 (use the dtype's bytes/param).

    (1) ``quantization_config``: ``bits`` (number or numeric string) ⇒ bits/8; else
    ``quant_method == "fp8"`` (any case) ⇒ 1.0; else ``compressed-tensors`` ⇒ the first
    ``config_groups.<key>.weights.num_bits > 0`` in sorted key order, /8.
    (2) model name: ``w<X>a<Y>`` bounded by start/end or one of ``. - _ /`` ⇒ X/8, else a
    ``fp8`` token ⇒ 1.0. (3) 0.0.
    """
    q = _from_quantization_config(_pivot(data).get("quantization_config"))
    return q if q > 0 else _from_model_name(name)


# ------------------------------------------------------------------------------ parsing
def parse_hf_config(source, *, name: str = "", file: str | None = None) -> ModelConfig:
    """Build a :class:`ModelConfig` from a HuggingFace config (dict, file or folder)."""
    if isinstance(source, dict):
        data = source
    elif isinstance(source, (str, os.PathLike)):
        file = str(_config_path(source))
        data = load_hf_json(source)
    else:
        raise TypeError(f"parse_hf_config wants a dict or a path, got {type(source).__name__}")
    d = _pivot(data)
    r = _Reader(d, file)

    layers = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    vocab = r.int("vocab_size")
    heads = r.int("num_attention_heads")
    kv_heads = 0
    for key in _KV_HEADS_CHAIN:
        kv_heads = r.int(key)
        if kv_heads != 0:
            break
    if kv_heads == 0:
        kv_heads = heads
    inter = r.int("intermediate_size")
    if inter == 0:
        inter = r.int("ffn_hidden_size")

    dtype = r.str("torch_dtype") or r.str("dtype")
    bpp = DTYPE_BYTES.get(dtype, 0.0)

    experts = r.int("num_local_experts")
    if experts <= 1:
        for key in _EXPERT_CHAIN:
            v = r.int(key)
            if v > 1:
                experts = v
                break
    top_k = r.int("num_experts_per_tok")
    moe_inter = r.int("moe_intermediate_size")
    n_shared = r.int("n_shared_experts")
    shared = r.int("shared_expert_intermediate_size")
    if shared <= 0:
        shared = n_shared * (moe_inter or inter)
    moe_missing = experts <= 1 and (n_shared > 0 or top_k > 0)

    rope = d.get("rope_scaling")
    return ModelConfig(
        name=name,
        model_type=r.str("model_type"),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=r.int("head_dim"),
        intermediate_size=inter,
        vocab_size=vocab,
        bytes_per_param=bpp,
        weight_bytes_per_param=weight_bytes_from_quantization(data, name),
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared,
        hidden_act=r.str("hidden_act"),
        tie_word_embeddings=r.bool("tie_word_embeddings"),
        max_position_embeddings=r.int("max_position_embeddings"),
        rope_scaling=dict(rope) if isinstance(rope, dict) else None,
        moe_count_missing=moe_missing,
        first_k_dense_replace=r.int("first_k_dense_replace"),
        interleave_moe_layer_step=r.int("interleave_moe_layer_step"),
        dense_intermediate_size=r.int("intermediate_size_mlp"),
        kv_lora_rank=r.int("kv_lora_rank"),
        qk_rope_head_dim=r.int("qk_rope_head_dim"),
    )


# ---------------------------------------------------------------------- max_model_len
def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def derive_max_model_len(cfg: ModelConfig) -> int:
    """The context length the model supports: ``max_position_embeddings`` with rope scaling.

    0 means unknown (the caller keeps its own value). Rules, in order (docs/latency-models.md,
    "MaxModelLen from the config"):
    ``model_type`` containing ``gemma3`` ⇒ unscaled; no ``rope_scaling`` object ⇒ unscaled;
    type (``type`` else ``rope_type``) ``su``/``longrope``/``llama3`` ⇒ unscaled; ``factor``
    must be a finite number > 1; ``yarn`` scales ``original_max_position_embeddings`` when
    that is a number > 0; M = int(base × factor), unchanged on overflow.
    """
    m = cfg.max_position_embeddings
    if m <= 0:
        return 0
    if "gemma3" in cfg.model_type:
        return m
    rs = cfg.rope_scaling
    if not isinstance(rs, dict):
        return m
    rtype = rs.get("type")
    if rtype is None:
        rtype = rs.get("rope_type")
    rtype = rtype if isinstance(rtype, str) else ""
    if rtype in _NO_SCALE_ROPE:
        return m
    factor = rs.get("factor")
    if not _is_number(factor) or not math.isfinite(factor) or factor <= 1.0:
        return m
    base = m
    if rtype == "yarn":
        orig = rs.get("original_max_position_embeddings")
        if _is_number(orig) and math.isfinite(orig) and orig > 0 and orig < _TWO63:
            base = int(orig)
    scaled = float(base) * float(factor)
    if not math.isfinite(scaled) or scaled >= _TWO63:
        return m
    return int(scaled)


def cap_max_model_len(max_len: int, total_blocks: int, block_size: int) -> int:
    """Cap ``max_len`` to what the KV cache can hold: if ``ceil(max_len / bs) > total_blocks``
    the result is ``total_blocks × bs`` (the caller warns), else ``max_len`` unchanged."""
    if max_len > 0 and block_size > 0 and (max_len + block_size - 1) // block_size > total_blocks:
        return total_blocks * block_size
    return max_len


__all__ = [
    "DTYPE_BYTES", "cap_max_model_len", "derive_max_model_len", "load_hf_json",
    "looks_like_hf_config", "parse_hf_config", "weight_bytes_from_quantization",
]
