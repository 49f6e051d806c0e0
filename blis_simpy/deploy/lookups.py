"""The catalog look-ups of one resolution pass over a scenario (docs/latency-models.md,
"Catalogs and resolution").

:class:`Lookups` carries the scenario, the notes and warnings of the pass, and finds the
coefficient catalog (``--defaults-filepath`` over the built-in one), the GPUs (built-in +
``hardware_config`` + the scenario's ``gpus:``) and the model's architecture (never
downloaded). The functions below resolve the deployment identity (hardware, TP, vLLM version)
and the alpha/beta coefficients (µs) of the backends that take them.
"""

from __future__ import annotations

import logging
import os

from blis_simpy.catalog.coefficients import CoefficientCatalog, builtin_coefficients, read_blis_defaults
from blis_simpy.catalog.hardware import GPUCatalog, gpu_catalog
from blis_simpy.catalog.hfconfig import load_hf_json, looks_like_hf_config, parse_hf_config
from blis_simpy.catalog.models import builtin_models
from blis_simpy.catalog.types import ModelConfig
from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.kv.vllm_capacity import KVCapacity

log = logging.getLogger("blis_simpy")


class Lookups:
    """One pass over a scenario; collects notes and warnings as it goes."""

    def __init__(self, s: Scenario, quiet: bool, prefix: str = ""):
        self.s = s
        self.quiet = quiet
        self.prefix = prefix            # "prefill pool: " for a pool's resolution
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.kv_capacity: KVCapacity | None = None   # set by the KV auto-calculation
        self.kv_source = ""

    def note(self, text: str) -> None:
        self.notes.append(text)
        if not self.quiet:
            log.info("%s%s", self.prefix, text)

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.notes.append(f"warning: {text}")
        if not self.quiet:
            log.warning("%s%s", self.prefix, text)

    # ------------------------------------------------------------------ catalogs
    def coefficients(self, *, silent: bool = False) -> CoefficientCatalog:
        cat = builtin_coefficients()
        path = self.s.defaults_filepath
        if path:
            cat = read_blis_defaults(path).layered_over(cat)
            if not silent:
                self.note(f"coefficients and defaults: {path} over the built-in catalog")
        return cat

    def gpus(self) -> GPUCatalog:
        extra = []
        if self.s.defaults_filepath:
            beside = os.path.join(os.path.dirname(self.s.defaults_filepath) or ".", "hardware_config.json")
            if not self.s.hardware_config and os.path.isfile(beside):
                extra.append(beside)
        return gpu_catalog(self.s.hardware_config, self.s.gpus, extra)

    def model_config(self, model: str) -> tuple[ModelConfig | None, list[str]]:
        """The model's architecture and, if none is found, the places that were tried."""
        s = self.s
        if s.model_config_folder:
            path = os.path.join(s.model_config_folder, "config.json")
            if not os.path.isfile(path):
                raise ConfigError(f"no config.json in {s.model_config_folder}", field="model_config_folder")
            cfg = parse_hf_config(path, name=model)
            self.note(f"model config: {path}")
            return cfg, []
        tried = []
        if s.defaults_filepath:
            short = model.split("/", 1)[-1]
            path = os.path.join(os.path.dirname(s.defaults_filepath) or ".", "model_configs", short, "config.json")
            tried.append(path)
            if ".." not in short.split("/") and os.path.isfile(path):
                data = load_hf_json(path)
                if looks_like_hf_config(data):
                    self.note(f"model config: {path}")
                    return parse_hf_config(data, name=model, file=path), []
        entry = builtin_models().find(model)
        tried.append("the built-in model catalog")
        if entry is not None:
            self.note(f"model config: built-in catalog ({entry.hf_repo or model})")
            return entry.config, []
        return None, tried


def deployment_identity(r: Lookups, cat: CoefficientCatalog, *,
                        catalog_tp: bool = True) -> tuple[str, int, str]:
    """``(hardware, tp, vllm_version)``: as given, else the model's catalog defaults (noted).
    ``catalog_tp=False`` leaves an unset TP 0 (analytical backends choose it by one rule
    for every model, :func:`blis_simpy.deploy.kv_capacity.default_tp`)."""
    s = r.s
    d = cat.deployment_defaults(s.model) if s.model else None
    hardware, tp, vllm = s.hardware, s.tp, s.vllm_version
    if d is not None:
        if not hardware:
            hardware = d.gpu
            r.note(f"hardware {hardware}: default of {s.model}")
        if tp <= 0 and catalog_tp:
            tp = d.tp
            r.note(f"tp {tp}: default of {s.model}")
        if not vllm:
            vllm = d.vllm
            r.note(f"vllm version {vllm}: default of {s.model}")
    return hardware, tp, vllm


def blackbox_coefficients(r: Lookups, cat: CoefficientCatalog, hw: str, tp: int, vllm: str):
    """``(alpha, beta)`` of ``blackbox``: the given lists, else the catalog row of (model, GPU,
    TP, vLLM version); all-zero given lists are an error."""
    cfg = r.s.latency
    if cfg.alpha_coeffs is not None and cfg.beta_coeffs is not None:
        if not any(cfg.alpha_coeffs) and not any(cfg.beta_coeffs):
            raise ConfigError("No trained coefficients found: alpha and beta are all zero",
                              field="latency.beta_coeffs")
        return list(cfg.alpha_coeffs), list(cfg.beta_coeffs)
    if not r.s.model:
        raise ConfigError("blackbox needs alpha_coeffs and beta_coeffs, or a model whose coefficients "
                          "are in the catalog", field="latency.alpha_coeffs")
    row = cat.blackbox_row(r.s.model, hw, tp, vllm)
    r.note(f"blackbox coefficients: catalog row {r.s.model} {row.key}")
    alpha = list(cfg.alpha_coeffs) if cfg.alpha_coeffs is not None else list(row.alpha)
    beta = list(cfg.beta_coeffs) if cfg.beta_coeffs is not None else list(row.beta)
    return alpha, beta


def global_coefficients(r: Lookups, cat: CoefficientCatalog, backend: str):
    """``(alpha, beta)`` of ``crossmodel`` / ``trained-roofline``: the given lists, else the
    catalog's global set."""
    cfg = r.s.latency
    gset = cat.crossmodel if backend == "crossmodel" else cat.trained_roofline
    alpha = list(cfg.alpha_coeffs) if cfg.alpha_coeffs is not None else list(gset.alpha)
    beta = list(cfg.beta_coeffs) if cfg.beta_coeffs is not None else list(gset.beta)
    if cfg.alpha_coeffs is None or cfg.beta_coeffs is None:
        r.note(f"{backend} coefficients: global set of the catalog")
    need = 4 if backend == "crossmodel" else 7
    if len(beta) < need or not any(beta):
        raise ConfigError(f"{backend} needs at least {need} non-zero beta coefficients, got {beta}",
                          field="latency.beta_coeffs")
    if backend == "trained-roofline" and not any(alpha):
        r.warn("trained-roofline alpha coefficients are all zero: no API, post-decode or "
               "per-token overheads")
    return alpha, beta
