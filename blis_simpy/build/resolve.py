"""Resolve a scenario into what the simulator builds: latency models, KV sizes, context caps.

A :class:`~blis_simpy.config.scenario.Scenario` says what the user asked for; the rest comes
from the offline catalogs (:mod:`blis_simpy.catalog`). :func:`resolve` applies BLIS's order
(docs/latency-models.md, "Catalogs and resolution") and returns a :class:`Deployment`, the only thing
:class:`~blis_simpy.cluster.simulation.Simulation` reads:

1. backend: ``latency.model``; roofline with coefficients is an error;
2. deployment: ``hardware`` / ``tp`` / ``vllm_version`` as given, else the model's catalog
   defaults (``--defaults-filepath`` entries first);
3. coefficients: blackbox — given α/β, else the first catalog row of (model, GPU, TP, vLLM
   version), an all-zero or missing row is an error listing what exists; crossmodel and
   trained-roofline — given lists, else the global sets;
4. model config (analytical backends; blackbox only for KV sizing): ``model_config_folder``,
   else ``<dir of defaults_filepath>/model_configs/<name>/config.json``, else the built-in
   catalog, else an error naming what was tried (never a download); GPU from the built-in
   catalog + ``hardware_config`` (BLIS JSON) + the scenario's ``gpus:``;
5. KV blocks: explicit > catalog row > auto-calculation (analytical backends, or blackbox
   with a model config) by ``engine.kv_capacity_model``: ``vllm`` (default, per GPU as vLLM
   profiles it; a model that does not fit is an error) or ``blis`` (BLIS's formula; a failure
   is a warning and falls back) > 1,000,000. ``Deployment.kv_capacity`` keeps the pieces;
6. MaxModelLen: explicit, else derived from the model config (analytical backends), then
   capped to the KV capacity with a warning;
7. KV store: a CPU tier (``TieredKVCache``) when ``engine.kv_cpu_blocks > 0``.

``Deployment.notes`` records where each value came from.

Prefill/decode pools are resolved on top of this by :mod:`blis_simpy.build.pools`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from blis_simpy.catalog.coefficients import CoefficientCatalog, builtin_coefficients, read_blis_defaults
from blis_simpy.catalog.hardware import GPUCatalog, gpu_catalog
from blis_simpy.catalog.hfconfig import (
    cap_max_model_len,
    derive_max_model_len,
    load_hf_json,
    looks_like_hf_config,
    parse_hf_config,
)
from blis_simpy.catalog.models import builtin_models
from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.kv.cache import KVCache
from blis_simpy.kv.capacity import KVCapacityError
from blis_simpy.kv.sizing import KV_DTYPE_BYTES, kv_capacity
from blis_simpy.kv.tiered import TieredKVCache
from blis_simpy.kv.vllm_capacity import KVCapacity
from blis_simpy.latency.base import LatencyModel
from blis_simpy.latency.coefficient_sets import PhysicsCoefficients, read_set
from blis_simpy.plugins import build_failure, is_builtin

log = logging.getLogger("blis_simpy")

DEFAULT_TOTAL_KV_BLOCKS = 1_000_000
ANALYTICAL = ("physics", "trained-physics", "roofline", "crossmodel", "trained-roofline")
#: the backends built from alpha/beta or a model config; any other name is a plugin, built
#: from its own ``latency.params`` (:meth:`~blis_simpy.latency.base.LatencyModel.build`)
BUILTIN_BACKENDS = ("blackbox", *ANALYTICAL)
#: backends timed by coefficient-set files or fixed formulas: no --alpha/--beta coefficients
NO_COEFFICIENTS = ("roofline", "physics")


def is_analytical(backend: str) -> bool:
    """A backend that needs a GPU, TP and the model's architecture: the analytical built-ins
    and a plugin whose class sets ``needs_model_config``."""
    if backend in ANALYTICAL:
        return True
    cls = LatencyModel._registry.get(backend)
    return backend not in BUILTIN_BACKENDS and cls is not None and cls.needs_model_config


def backend_options(s: Scenario) -> dict:
    """Deployment facts the parallelism-aware backends take (ignored by BLIS's backends)."""
    return {"dp": s.dp, "expert_parallel": s.enable_expert_parallel,
            "coefficients": s.latency.coefficients,
            "kv_bytes_per_element": KV_DTYPE_BYTES.get(s.engine.kv_cache_dtype) or 0.0}


@dataclass
class Deployment:
    """Everything resolved about the instances of one scenario."""

    total_kv_blocks: int
    block_size: int
    max_model_len: int
    latency_factory: Callable[[], LatencyModel]
    kv_factory: Callable[[int, int], KVCache] = KVCache
    notes: list[str] = field(default_factory=list)   # what was resolved from where
    backend: str = ""
    hardware: str = ""
    tp: int = 0
    vllm_version: str = ""
    gpu: GPUSpec | None = None
    model_config: ModelConfig | None = None
    warnings: list[str] = field(default_factory=list)
    alpha: list[float] | None = None   # the coefficients the latency model is built with
    beta: list[float] | None = None
    #: the auto-calculated KV capacity and its pieces (None: blocks given, from the catalog
    #: or the default); ``kv_source``: explicit | catalog | vllm | blis | default
    kv_capacity: KVCapacity | None = None
    kv_source: str = ""

    def new_latency_model(self) -> LatencyModel:
        return self.latency_factory()

    def new_kv_cache(self) -> KVCache:
        return self.kv_factory(self.total_kv_blocks, self.block_size)


class Resolution:
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


# ---------------------------------------------------------------------------- the steps
def _deployment_identity(r: Resolution, cat: CoefficientCatalog) -> tuple[str, int, str]:
    s = r.s
    d = cat.deployment_defaults(s.model) if s.model else None
    hardware, tp, vllm = s.hardware, s.tp, s.vllm_version
    if d is not None:
        if not hardware:
            hardware = d.gpu
            r.note(f"hardware {hardware}: default of {s.model}")
        if tp <= 0:
            tp = d.tp
            r.note(f"tp {tp}: default of {s.model}")
        if not vllm:
            vllm = d.vllm
            r.note(f"vllm version {vllm}: default of {s.model}")
    return hardware, tp, vllm


def blackbox_coefficients(r: Resolution, cat: CoefficientCatalog, hw: str, tp: int, vllm: str):
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


def global_coefficients(r: Resolution, cat: CoefficientCatalog, backend: str):
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


def _kv_blocks(r: Resolution, cat, backend, hw, tp, vllm, model_cfg, gpu) -> int:
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
        cap = auto_kv_capacity(r, model_cfg, gpu, tp, field="hardware",
                               fallback=f"using the default {DEFAULT_TOTAL_KV_BLOCKS} blocks")
        if cap is not None:
            return cap.blocks
        r.kv_source = "default"
        return DEFAULT_TOTAL_KV_BLOCKS
    r.kv_source = "default"
    if is_analytical(backend):
        r.warn(f"no KV capacity could be resolved; using the default {DEFAULT_TOTAL_KV_BLOCKS} blocks")
    else:
        r.note(f"total_kv_blocks {DEFAULT_TOTAL_KV_BLOCKS}: default (no catalog row, no model config)")
    return DEFAULT_TOTAL_KV_BLOCKS


def auto_kv_capacity(r: Resolution, model_cfg: ModelConfig, gpu: GPUSpec, tp: int, *,
                     field: str, fallback: str, what: str = "") -> KVCapacity | None:
    """KV blocks of ``r.s`` auto-calculated by ``engine.kv_capacity_model`` (noted, and kept in
    ``r.kv_capacity``). ``vllm``: a model that does not fit is a :class:`ConfigError` on
    ``field`` (one line with the GiB shortfall). ``blis``: a failure is warned (``what`` names
    the deployment, ``fallback`` says what happens instead) and gives None."""
    s, eng = r.s, r.s.engine
    name = eng.kv_capacity_model
    try:
        cap = kv_capacity(name, model_cfg, gpu, tp=tp, dp=s.dp, expert_parallel=s.enable_expert_parallel,
                          block_size=eng.block_size, gpu_memory_utilization=eng.gpu_memory_utilization,
                          max_num_batched_tokens=eng.max_num_scheduled_tokens,
                          max_num_seqs=eng.max_num_running_reqs,
                          kv_cache_dtype=eng.kv_cache_dtype)
    except KVCapacityError as exc:
        if name == "vllm":
            raise ConfigError(f"KV capacity: {exc}", field=field) from None
        r.warn(f"KV capacity auto-calculation{what} failed ({exc}); {fallback}")
        return None
    if name == "blis":
        r.note(f"total_kv_blocks {cap.blocks}: auto-calculated for {tp} x {gpu.name}, gpu memory "
               f"utilization {eng.gpu_memory_utilization}, block size {eng.block_size}")
    else:
        per = f" per DP rank (DP {s.dp})" if s.dp > 1 else ""
        r.note(f"total_kv_blocks {cap.blocks}{per}: auto-calculated for {tp} x {gpu.name}, block size "
               f"{eng.block_size} ({cap.summary()})")
    r.kv_capacity, r.kv_source = cap, name
    return cap


def _max_model_len(r: Resolution, backend: str, model_cfg, total_blocks: int) -> int:
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


#: the tiered cache's parameters default to these engine keys (BLIS's flags)
_TIER_KEYS = {"cpu_blocks": "kv_cpu_blocks", "transfer_bandwidth": "kv_transfer_bandwidth",
              "transfer_base_latency_us": "kv_transfer_base_latency_us",
              "offload_threshold": "kv_offload_threshold"}


def _kv_factory(r: Resolution) -> Callable[[int, int], KVCache]:
    """The registered KV cache (``engine.kv_cache``; unset: ``tiered`` when
    ``engine.kv_cpu_blocks > 0``, else ``gpu``) with its validated ``engine.kv_cache_params``.
    A plugin cache's constructor errors are reported as that plugin's (when the instances are
    built)."""
    eng = r.s.engine
    given = eng.kv_cache_params
    kind = eng.kv_cache if eng.kv_cache is not None else ("tiered" if eng.kv_cpu_blocks > 0 else "gpu")
    cls = KVCache.lookup(kind, field="engine.kv_cache")
    raw = dict(given)
    tiered = issubclass(cls, TieredKVCache)
    if tiered:
        raw = {key: getattr(eng, flat) for key, flat in _TIER_KEYS.items()} | raw
    try:
        params = cls.parse_params(raw, field="engine.kv_cache_params")
    except ConfigError as exc:      # a default taken from an engine key: point at that key
        key = (exc.field or "").removeprefix("engine.kv_cache_params.")
        if tiered and key in _TIER_KEYS and key not in given:
            raise ConfigError(exc.problem, field=f"engine.{_TIER_KEYS[key]}") from None
        raise
    if cls is KVCache and not given:
        return KVCache
    if tiered:
        r.note(f"CPU KV tier: {params.cpu_blocks} blocks, {params.transfer_bandwidth} blocks/us, "
               f"base latency {params.transfer_base_latency_us} us")
    try:   # TieredKVCache warns (per cache) that the offload threshold is ignored
        factory = cls.factory_for(params)
    except ValueError as exc:
        raise ConfigError(str(exc), field="engine.kv_cpu_blocks" if eng.kv_cache is None
                          else "engine.kv_cache_params") from None
    return factory if is_builtin(cls) else partial(_build_kv_plugin, cls, factory)


def _build_kv_plugin(cls: type[KVCache], factory, total_blocks: int, block_size: int) -> KVCache:
    try:
        return factory(total_blocks, block_size)
    except ConfigError:
        raise
    except Exception as exc:     # the plugin's own constructor failed
        raise build_failure(cls, exc, field="engine.kv_cache") from None


def build_backend(backend: str, model_cfg, gpu, tp, alpha, beta, compat: str,
                  extra: dict | None = None, params=None) -> LatencyModel:
    """Build one latency model; ``extra`` (:func:`backend_options`) goes to ``physics`` and
    ``trained-physics`` only. A plugin (a name outside :data:`BUILTIN_BACKENDS`) is built by
    its :meth:`~blis_simpy.latency.base.LatencyModel.build` from its validated ``params``;
    anything its constructor raises is reported as that plugin's error."""
    cls = LatencyModel.lookup(backend, field="latency.model")
    if backend not in BUILTIN_BACKENDS:
        try:
            return cls.build(params if params is not None else cls.Params(), model_config=model_cfg,
                             gpu=gpu, tp=max(int(tp or 0), 1))
        except ConfigError:
            raise
        except Exception as exc:
            raise build_failure(cls, exc, field="latency.model") from None
    try:
        if backend == "blackbox":
            return cls(alpha, beta)
        opts = {}
        if backend == "physics":
            opts = dict(extra or {})
        elif backend == "trained-physics":
            opts = {"dp": (extra or {}).get("dp", 1)}
        elif compat == "checkout":
            opts = {"moe_weight_batch_zero": True} if backend == "roofline" else {"checkout_moe_threshold": True}
        return cls.from_config(model_cfg, gpu, tp, alpha, beta, **opts)
    except ValueError as exc:
        raise ConfigError(str(exc), field="latency") from None


def _with_coefficient_set(cfg, backend: str):
    """``latency.coefficients``: a physics set is read by the backend itself (checked here);
    an alpha/beta set replaces ``alpha_coeffs`` / ``beta_coeffs`` (the set is the more
    specific choice: a file fitted for this deployment).
    Returns the latency config to use and a note (or None)."""
    if not cfg.coefficients:
        return cfg, None
    got = read_set(cfg.coefficients)
    if got.backend != backend:
        raise ConfigError(f"a {got.backend} coefficient set, but the latency backend is {backend}",
                          file=cfg.coefficients if cfg.coefficients != "default" else None,
                          field="latency.coefficients")
    note = f"{backend} coefficients: set {got.name or cfg.coefficients} ({cfg.coefficients})"
    if isinstance(got, PhysicsCoefficients):
        return cfg, note
    if cfg.alpha_coeffs is not None or cfg.beta_coeffs is not None:
        note += "; it replaces the alpha_coeffs/beta_coeffs also given"
    return cfg.model_copy(update={"alpha_coeffs": list(got.alpha_coeffs),
                                  "beta_coeffs": list(got.beta_coeffs)}), note


def resolve(scenario: Scenario, *, quiet: bool = False) -> Deployment:
    """Resolve ``scenario`` (explicit values always win). ``quiet``: log nothing."""
    backend = scenario.latency.model or "physics"
    lat_cls = LatencyModel.lookup(backend, field="latency.model")
    lat_params = lat_cls.parse_params(scenario.latency.params, field="latency.params")
    lat, set_note = _with_coefficient_set(scenario.latency, backend)
    if lat is not scenario.latency:
        scenario = scenario.model_copy(update={"latency": lat})
    r = Resolution(scenario, quiet)
    if set_note:
        r.note(set_note)
    s, eng, cfg = scenario, scenario.engine, scenario.latency
    if backend in NO_COEFFICIENTS and (cfg.alpha_coeffs is not None or cfg.beta_coeffs is not None):
        raise ConfigError(f"{backend} takes no alpha/beta coefficients (use blackbox, trained-physics, "
                          "crossmodel or trained-roofline, or drop them)", field="latency.model")
    if backend not in BUILTIN_BACKENDS and (cfg.alpha_coeffs is not None or cfg.beta_coeffs is not None):
        raise ConfigError(f"latency model {backend!r} (a plugin) takes no alpha/beta coefficients; give "
                          "its own parameters under latency.params", field="latency.model")
    cat = r.coefficients()
    hw, tp, vllm = _deployment_identity(r, cat)
    analytical = is_analytical(backend)
    gpus = r.gpus()
    gpu = None
    if analytical:
        if not hw:
            raise ConfigError(f"{backend} needs a GPU: pass --hardware (model {s.model or '(none)'} has no "
                              f"default; available: {', '.join(gpus.names())})", field="hardware")
        if tp <= 0:
            raise ConfigError(f"{backend} needs tensor parallelism > 0: pass --tp", field="tp")
        gpu = gpus.get(hw)
    elif hw and hw in gpus:
        gpu = gpus.get(hw)
    if gpu is not None:
        hw = gpu.name
    alpha = beta = None
    if backend == "blackbox":
        alpha, beta = blackbox_coefficients(r, cat, hw, tp, vllm)
    elif backend in ("crossmodel", "trained-roofline"):
        alpha, beta = global_coefficients(r, cat, backend)
    elif backend == "trained-physics":
        alpha, beta = cfg.alpha_coeffs, cfg.beta_coeffs    # None: BLIS HEAD's defaults
    model_cfg = None
    if analytical:
        model_cfg, tried = r.model_config(s.model)
        if model_cfg is None:
            raise ConfigError(f"{backend} needs the architecture of model {s.model or '(none)'}: not found "
                              f"in {' or '.join(tried) or 'any source'}; pass --model-config-folder DIR "
                              "with its HuggingFace config.json (blis-simpy never downloads)",
                              field="model_config_folder")
    total = _kv_blocks(r, cat, backend, hw, tp, vllm, model_cfg, gpu)
    max_len = _max_model_len(r, backend, model_cfg, total)
    build = partial(build_backend, backend, model_cfg, gpu, tp, alpha, beta, cfg.compat,
                    backend_options(s), lat_params)
    build()                     # validate now: errors before anything runs
    return Deployment(total_kv_blocks=total, block_size=eng.block_size, max_model_len=max_len,
                      latency_factory=build, kv_factory=_kv_factory(r), notes=r.notes, backend=backend,
                      hardware=hw, tp=tp, vllm_version=vllm, gpu=gpu, model_config=model_cfg,
                      warnings=r.warnings, alpha=alpha, beta=beta, kv_capacity=r.kv_capacity,
                      kv_source=r.kv_source)


def build_latency_model(scenario: Scenario) -> LatencyModel:
    """The scenario's latency model, fully resolved (silently: :func:`resolve` logs)."""
    return resolve(scenario, quiet=True).new_latency_model()
