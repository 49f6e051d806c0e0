"""The GPU catalog: built-in accelerators, a BLIS ``hardware_config.json``, scenario GPUs.

Built-in figures live in ``catalog/data/gpus.yaml`` (package data; every figure cites its
source). A :class:`GPUCatalog` is immutable; :meth:`GPUCatalog.merged` layers more GPUs on
top (later layers replace entries of the same key)::

    builtin_gpus()                                  # catalog/data/gpus.yaml
      .merged(read_hardware_json(path))             # --hardware-config / hardware_config:
      .merged(scenario_gpus(scenario.gpus))         # gpus: in the scenario YAML

Lookup (:meth:`GPUCatalog.get`) is by exact key first (BLIS), then case-insensitively on keys
and aliases (``h100``, ``RTX 4090``); an unknown GPU is an error listing every key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from blis_simpy.catalog.types import GPUSpec
from blis_simpy.errors import ConfigError

#: our field name -> BLIS hardware_config.json key
BLIS_KEYS = {"tflops_peak": "TFlopsPeak", "tflops_fp8": "TFlopsFP8", "bw_peak_tbs": "BwPeakTBs",
             "mfu_prefill": "mfuPrefill", "mfu_decode": "mfuDecode", "memory_gib": "MemoryGiB"}
FIGURES = tuple(BLIS_KEYS)


@dataclass(frozen=True)
class GPUEntry:
    """A catalog entry: the figures plus how to present and find them."""

    spec: GPUSpec
    description: str = ""
    aliases: tuple[str, ...] = ()
    origin: str = "built-in"        # built-in | file path | "scenario"


@dataclass(frozen=True)
class GPUCatalog:
    entries: Mapping[str, GPUEntry] = field(default_factory=dict)

    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: str) -> bool:
        return self.find(name) is not None

    def find(self, name: str) -> GPUEntry | None:
        """The entry for ``name``: exact key, else a case-insensitive key or alias match."""
        if name in self.entries:
            return self.entries[name]
        want = name.strip().lower()
        for key, e in self.entries.items():
            if want == key.lower() or want in (a.lower() for a in e.aliases):
                return e
        return None

    def get(self, name: str, *, field: str = "hardware") -> GPUSpec:
        e = self.find(name)
        if e is None:
            raise ConfigError(f"unknown GPU {name!r}; available: {', '.join(self.names())}", field=field)
        return e.spec

    def merged(self, more: Mapping[str, GPUEntry]) -> GPUCatalog:
        out = dict(self.entries)
        out.update(more)
        return GPUCatalog(out)


def _figures(name: str, raw: Mapping, keys: Mapping[str, str], where: str) -> dict[str, float]:
    """Read the six figures of one GPU (missing ⇒ 0); each must be a finite number ≥ 0."""
    out = {}
    for ours, theirs in keys.items():
        v = raw.get(theirs, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"GPU {name!r}: {theirs} must be a finite number >= 0, got {v!r}",
                              field=where)
        out[ours] = float(v)
    return out


@lru_cache(maxsize=1)
def builtin_gpus() -> GPUCatalog:
    """The GPUs shipped with blis-simpy (``catalog/data/gpus.yaml``)."""
    text = resources.files("blis_simpy.catalog").joinpath("data/gpus.yaml").read_text("utf-8")
    raw = yaml.safe_load(text)
    entries = {}
    for name, e in raw.items():
        figs = _figures(name, e, {k: k for k in FIGURES}, "catalog/data/gpus.yaml")
        entries[name] = GPUEntry(GPUSpec(name=name, source=e.get("source", ""), **figs),
                                 description=e.get("description", ""),
                                 aliases=tuple(e.get("aliases", ())))
    return GPUCatalog(entries)


def read_hardware_json(path: str, *, field: str = "hardware_config") -> dict[str, GPUEntry]:
    """GPUs of a BLIS ``hardware_config.json`` (``{KEY: {TFlopsPeak: …, …}}``).

    Unknown keys such as ``_comment`` are ignored; a missing figure is 0 (the latency model
    and the KV calculation reject the zeros they cannot use).
    """
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"no such file: {path}", field=field) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=path, field=field) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON: {exc.msg}", file=path, line=exc.lineno, field=field) from None
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError("expected an object of GPU objects ({\"H100\": {\"TFlopsPeak\": …}})",
                          file=path, field=field)
    out = {}
    for name, e in raw.items():
        figs = _figures(name, e, BLIS_KEYS, field)
        note = e.get("_comment", "")
        out[name] = GPUEntry(GPUSpec(name=name, source=f"{path}" + (f": {note}" if note else ""), **figs),
                             origin=str(path))
    return out


def scenario_gpus(gpus: Mapping[str, object]) -> dict[str, GPUEntry]:
    """GPUs declared under ``gpus:`` in a scenario (pydantic ``GPUEntry`` models)."""
    out = {}
    for name, g in gpus.items():
        figs = {k: float(getattr(g, k)) for k in FIGURES}
        out[name] = GPUEntry(GPUSpec(name=name, source=getattr(g, "source", "") or "scenario gpus:", **figs),
                             description="defined in the scenario", origin="scenario")
    return out


def gpu_catalog(hardware_config: str = "", gpus: Mapping[str, object] | None = None,
                extra_files: Iterable[str] = ()) -> GPUCatalog:
    """Built-in GPUs, then each of ``extra_files`` and ``hardware_config``, then ``gpus``."""
    cat = builtin_gpus()
    for path in extra_files:
        cat = cat.merged(read_hardware_json(path, field="--defaults-filepath"))
    if hardware_config:
        cat = cat.merged(read_hardware_json(hardware_config))
    if gpus:
        cat = cat.merged(scenario_gpus(gpus))
    return cat


__all__ = ["GPUCatalog", "GPUEntry", "builtin_gpus", "gpu_catalog", "read_hardware_json",
           "scenario_gpus", "BLIS_KEYS"]
