"""The model catalog: architecture shapes of known models, shipped offline.

``catalog/data/models.yaml`` holds, per lower-cased model ID, the values of the model's public
HuggingFace ``config.json`` already read by BLIS's parsing rules (docs/latency-models.md), in our own
key names (see the file's header). :func:`builtin_models` turns them into
:class:`~blis_simpy.catalog.types.ModelConfig` records; :class:`ModelCatalog` looks them up.

Nothing here touches the network: models outside the catalog come from a local
``config.json`` (``--model-config-folder``), parsed by :mod:`blis_simpy.catalog.hfconfig`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from blis_simpy.catalog.hfconfig import DTYPE_BYTES  # torch_dtype -> bytes per parameter
from blis_simpy.catalog.shipped import read_shipped
from blis_simpy.catalog.types import ModelConfig
from blis_simpy.errors import ConfigError

#: our YAML key -> ModelConfig field (keys not listed are handled by name)
_RENAMED = {"num_experts": "num_local_experts", "experts_per_tok": "num_experts_per_tok"}
_INT_KEYS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
             "vocab_size", "num_experts", "experts_per_tok", "moe_intermediate_size",
             "shared_expert_intermediate_size", "max_position_embeddings", "first_k_dense_replace",
             "interleave_moe_layer_step", "dense_intermediate_size", "kv_lora_rank",
             "qk_rope_head_dim")
_OTHER_KEYS = ("hf_repo", "model_type", "dtype", "weight_bits", "hidden_act", "tie_word_embeddings",
               "rope_scaling", "like", "source")


@dataclass(frozen=True)
class ModelEntry:
    """A catalog model: its shape and the HuggingFace repository it describes."""

    config: ModelConfig
    hf_repo: str = ""
    origin: str = "built-in"

    @property
    def summary(self) -> str:
        c = self.config
        moe = f", MoE {c.num_local_experts}x top-{c.num_experts_per_tok}" if c.is_moe else ""
        return f"{c.num_layers} layers, hidden {c.hidden_size}, {c.num_heads}/{c.num_kv_heads} heads{moe}"


@dataclass(frozen=True)
class ModelCatalog:
    entries: Mapping[str, ModelEntry] = field(default_factory=dict)

    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, model: str) -> bool:
        return model.lower() in self.entries

    def find(self, model: str) -> ModelEntry | None:
        return self.entries.get(model.lower())

    def get(self, model: str, *, field: str = "model") -> ModelConfig:
        e = self.find(model)
        if e is None:
            raise ConfigError(f"model {model!r} is not in the offline model catalog; pass "
                              "--model-config-folder DIR with its HuggingFace config.json "
                              f"(catalog: {', '.join(sorted(self.entries))})", field=field)
        return e.config


def model_from_fields(name: str, raw: Mapping, *, where: str = "catalog/data/models.yaml") -> ModelConfig:
    """One model of our YAML format (``like`` already expanded) as a :class:`ModelConfig`."""
    unknown = set(raw) - set(_INT_KEYS) - set(_OTHER_KEYS)
    if unknown:
        raise ConfigError(f"model {name!r}: unknown keys {sorted(unknown)}", field=where)
    kw: dict = {"name": name}
    for key in _INT_KEYS:
        v = raw.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"model {name!r}: {key} must be an integer >= 0, got {v!r}", field=where)
        kw[_RENAMED.get(key, key)] = v
    dtype = str(raw.get("dtype", "")).lower()
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"model {name!r}: dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}",
                          field=where)
    kw["bytes_per_param"] = DTYPE_BYTES[dtype]
    bits = raw.get("weight_bits", 0)
    kw["weight_bytes_per_param"] = float(bits) / 8.0 if bits else 0.0
    kw["model_type"] = str(raw.get("model_type", ""))
    kw["hidden_act"] = str(raw.get("hidden_act", ""))
    kw["tie_word_embeddings"] = bool(raw.get("tie_word_embeddings", False))
    rope = raw.get("rope_scaling")
    kw["rope_scaling"] = dict(rope) if isinstance(rope, dict) else None
    if kw["num_kv_heads"] == 0:
        kw["num_kv_heads"] = kw["num_heads"]
    return ModelConfig(**kw)


def _expand(name: str, table: Mapping[str, Mapping], seen: tuple[str, ...] = ()) -> dict:
    raw = table[name]
    base = raw.get("like")
    if base is None:
        return dict(raw)
    if base not in table or base in seen:
        raise ConfigError(f"model {name!r}: like: {base!r} is unknown or circular",
                          field="catalog/data/models.yaml")
    out = _expand(base, table, seen + (name,))
    out.pop("hf_repo", None)
    out.update({k: v for k, v in raw.items() if k != "like"})
    return out


def parse_models(table: Mapping[str, Mapping], *, origin: str = "built-in") -> dict[str, ModelEntry]:
    out = {}
    for name in table:
        raw = _expand(name, table)
        out[name.lower()] = ModelEntry(model_from_fields(name.lower(), raw), str(raw.get("hf_repo", "")),
                                       origin)
    return out


@lru_cache(maxsize=1)
def builtin_models() -> ModelCatalog:
    """The models shipped with blis-simpy (``catalog/data/models.yaml``)."""
    return ModelCatalog(parse_models(read_shipped("models.yaml")))


__all__ = ["ModelCatalog", "ModelEntry", "builtin_models", "model_from_fields",
           "parse_models"]
