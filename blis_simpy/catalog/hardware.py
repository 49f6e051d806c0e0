"""The GPU catalog: built-in accelerators, a BLIS ``hardware_config.json``, scenario GPUs.

Built-in figures live in ``catalog/data/gpus.yaml`` (package data; every figure cites its
source). A :class:`GPUCatalog` is immutable; :meth:`GPUCatalog.merged` layers more GPUs on
top (later layers replace entries of the same key)::

    builtin_gpus()                                  # catalog/data/gpus.yaml
      .merged(read_hardware_json(path))             # --hardware-config / hardware_config:
      .merged(scenario_gpus(scenario.gpus))         # gpus: in the scenario YAML

Lookup (:meth:`GPUCatalog.get`) is by exact key first (BLIS), then case-insensitively on keys
and aliases (``h100``, ``RTX 4090``); an unknown GPU is an error listing every key.

Besides BLIS's six figures a GPU has optional ones (:data:`EXTRA_FIELDS`: driver-reported memory
and the interconnect of TP/EP collectives), written under the same snake_case names in
``gpus.yaml``, in a ``hardware_config.json`` entry and under ``gpus:``. BLIS's own files lack
them: an entry that replaces a GPU already in the catalog keeps that GPU's values for the extra
figures it does not give (``memory_torch_gib`` only while ``memory_gib`` is unchanged); a new
GPU takes the :class:`~blis_simpy.catalog.types.GPUSpec` defaults.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache

from blis_simpy.catalog.shipped import read_shipped
from blis_simpy.catalog.types import GPUSpec
from blis_simpy.errors import ConfigError
from blis_simpy.infile import json_loads, open_input

#: our field name -> BLIS hardware_config.json key
BLIS_KEYS = {"tflops_peak": "TFlopsPeak", "tflops_fp8": "TFlopsFP8", "bw_peak_tbs": "BwPeakTBs",
             "mfu_prefill": "mfuPrefill", "mfu_decode": "mfuDecode", "memory_gib": "MemoryGiB"}
FIGURES = tuple(BLIS_KEYS)
#: optional figures (same key in every format): memory the driver reports (GiB), interconnect
#: kind, generation, per-direction bandwidth (GB/s), peer-to-peer, fixed collective cost (µs),
#: sustained memory bandwidth (TB/s), sustained large-GEMM rate (TFLOP/s), host <-> GPU
#: bandwidth per direction (GB/s)
EXTRA_FIELDS = ("memory_torch_gib", "interconnect", "interconnect_gen", "link_bw_gbps", "p2p",
                "collective_latency_us", "bw_sustained_tbs", "tflops_sustained", "host_link_gbps")
INTERCONNECTS = ("nvlink", "pcie")
#: optional price of one GPU-hour, USD (> 0), under this key in every format; never inherited
#: from the GPU an entry replaces, and absent from the shipped entries (no price invented)
PRICE_FIELD = "price_per_hour_usd"


@dataclass(frozen=True)
class GPUEntry:
    """A catalog entry: the figures plus how to present and find them."""

    spec: GPUSpec
    description: str = ""
    aliases: tuple[str, ...] = ()
    origin: str = "built-in"        # built-in | file path | "scenario"
    #: extra figures the source did not give: taken from the GPU this entry replaces, if any
    inherits: tuple[str, ...] = ()


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
        """This catalog with ``more`` on top; an entry replacing a GPU of this catalog (found
        by :meth:`find`) keeps that GPU's values for the extra figures it did not give."""
        out = dict(self.entries)
        for name, e in more.items():
            base = self.find(name)
            out[name] = _inherit(e, base.spec) if base is not None and e.inherits else e
        return GPUCatalog(out)


def _inherit(e: GPUEntry, base: GPUSpec) -> GPUEntry:
    keep = {k: getattr(base, k) for k in e.inherits}
    if "memory_torch_gib" in keep and e.spec.memory_gib != base.memory_gib:
        del keep["memory_torch_gib"]        # a different memory size: the driver figure is unknown
    return replace(e, spec=replace(e.spec, **keep), inherits=())


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


def _extras(name: str, raw: Mapping, where: str) -> dict:
    """The optional :data:`EXTRA_FIELDS` present in ``raw``, validated (absent keys are left out)."""
    out: dict = {}
    for key in EXTRA_FIELDS:
        if key not in raw:
            continue
        v = raw[key]
        if key == "interconnect":
            if v not in INTERCONNECTS:
                raise ConfigError(f"GPU {name!r}: interconnect must be one of {', '.join(INTERCONNECTS)}, "
                                  f"got {v!r}", field=where)
        elif key == "p2p":
            if not isinstance(v, bool):
                raise ConfigError(f"GPU {name!r}: p2p must be true or false, got {v!r}", field=where)
        elif key == "interconnect_gen":
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"GPU {name!r}: interconnect_gen must be an integer >= 0, got {v!r}",
                                  field=where)
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"GPU {name!r}: {key} must be a finite number >= 0, got {v!r}", field=where)
        else:
            v = float(v)
        out[key] = v
    return out


def _price(name: str, raw: Mapping, where: str) -> dict:
    """``{PRICE_FIELD: v}`` when ``raw`` gives a price (a finite number > 0), else ``{}``."""
    if PRICE_FIELD not in raw:
        return {}
    v = raw[PRICE_FIELD]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"GPU {name!r}: {PRICE_FIELD} must be a finite number > 0, got {v!r}",
                          field=where)
    return {PRICE_FIELD: float(v)}


def _missing(given: Mapping) -> tuple[str, ...]:
    return tuple(k for k in EXTRA_FIELDS if k not in given)


@lru_cache(maxsize=1)
def builtin_gpus() -> GPUCatalog:
    """The GPUs shipped with blis-simpy (``catalog/data/gpus.yaml``)."""
    raw = read_shipped("gpus.yaml")
    entries = {}
    for name, e in raw.items():
        figs = _figures(name, e, {k: k for k in FIGURES}, "catalog/data/gpus.yaml")
        figs.update(_extras(name, e, "catalog/data/gpus.yaml"))
        figs.update(_price(name, e, "catalog/data/gpus.yaml"))
        entries[name] = GPUEntry(GPUSpec(name=name, source=e.get("source", ""), **figs),
                                 description=e.get("description", ""),
                                 aliases=tuple(e.get("aliases", ())))
    return GPUCatalog(entries)


#: a hardware_config.json lists a few dozen GPUs; refuse one over this many characters
MAX_HARDWARE_CHARS = 4 << 20


def read_hardware_json(path: str, *, field: str = "hardware_config") -> dict[str, GPUEntry]:
    """GPUs of a BLIS ``hardware_config.json`` (``{KEY: {TFlopsPeak: …, …}}``).

    Unknown keys such as ``_comment`` are ignored; a missing figure is 0 (the latency model
    and the KV calculation reject the zeros they cannot use). The optional
    :data:`EXTRA_FIELDS` may be given under their snake_case names; absent ones are inherited
    (see :meth:`GPUCatalog.merged`) or take the defaults.
    """
    try:
        with open_input(path, encoding="utf-8") as f:
            text = f.read(MAX_HARDWARE_CHARS + 1)
        if len(text) > MAX_HARDWARE_CHARS:
            raise ConfigError(f"larger than {MAX_HARDWARE_CHARS} characters: not a hardware_config.json",
                              file=path, field=field)
        raw = json_loads(text)
    except FileNotFoundError:
        raise ConfigError(f"no such file: {path}", field=field) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=path, field=field) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON: {exc.msg}", file=path, line=exc.lineno, field=field) from None
    except RecursionError:
        raise ConfigError("invalid JSON: nested too deeply", file=path, field=field) from None
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError("expected an object of GPU objects ({\"H100\": {\"TFlopsPeak\": …}})",
                          file=path, field=field)
    out = {}
    for name, e in raw.items():
        figs = _figures(name, e, BLIS_KEYS, field)
        extras = _extras(name, e, field)
        note = e.get("_comment", "")
        out[name] = GPUEntry(GPUSpec(name=name, source=f"{path}" + (f": {note}" if note else ""),
                                     **figs, **extras, **_price(name, e, field)),
                             origin=str(path), inherits=_missing(extras))
    return out


def scenario_gpus(gpus: Mapping[str, object]) -> dict[str, GPUEntry]:
    """GPUs declared under ``gpus:`` in a scenario (pydantic ``GPUEntry`` models)."""
    out = {}
    for name, g in gpus.items():
        figs = {k: float(getattr(g, k)) for k in FIGURES}
        extras = {k: getattr(g, k, None) for k in EXTRA_FIELDS}
        extras = {k: v for k, v in extras.items() if v is not None}   # validated by the scenario model
        if getattr(g, PRICE_FIELD, None) is not None:
            extras[PRICE_FIELD] = float(getattr(g, PRICE_FIELD))
        out[name] = GPUEntry(GPUSpec(name=name, source=getattr(g, "source", "") or "scenario gpus:",
                                     **figs, **extras),
                             description="defined in the scenario", origin="scenario",
                             inherits=_missing(extras))
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
           "scenario_gpus", "BLIS_KEYS", "EXTRA_FIELDS", "INTERCONNECTS", "PRICE_FIELD"]
