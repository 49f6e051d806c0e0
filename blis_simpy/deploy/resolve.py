"""Resolve a scenario into what the simulator builds: latency models, KV sizes, context caps.

A :class:`~blis_simpy.config.scenario.Scenario` says what the user asked for; the rest comes
from the offline catalogs (:mod:`blis_simpy.catalog`). :func:`resolve` applies BLIS's order
(docs/latency-models.md, "Catalogs and resolution") and returns a :class:`Deployment`, the only thing
:class:`~blis_simpy.run.simulation.Simulation` reads:

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
   profiles it) or ``blis`` (BLIS's formula); under both a model that does not fit is an
   error (BLIS's blis fallback to 1,000,000 blocks is not kept) > 1,000,000.
   ``Deployment.kv_capacity`` keeps the pieces;
6. MaxModelLen: explicit, else derived from the model config (analytical backends), then
   capped to the KV capacity with a warning;
7. KV store: BLIS's CPU mirror tier (``TieredKVCache``) when ``engine.kv_cpu_blocks > 0``;
   vLLM's CPU offload tier (``OffloadKVCache``) when ``engine.kv_cpu_gib > 0``, its blocks
   sized from the model's KV bytes per block and its transfers timed by the GPU's host link.

``Deployment.notes`` records where each value came from.

The steps live in their own modules: the backends and how one is built in
:mod:`blis_simpy.deploy.backends`; the catalogs, the deployment identity and the coefficients
in :mod:`blis_simpy.deploy.lookups`; KV blocks and MaxModelLen in
:mod:`blis_simpy.deploy.kv_capacity`. This module holds :class:`Deployment`, the KV-store step
and :func:`resolve`, which runs them in order.

Prefill/decode pools are resolved on top of this by :mod:`blis_simpy.deploy.pools`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from blis_simpy.catalog.models import builtin_models
from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.backends import (
    BUILTIN_BACKENDS,
    NO_COEFFICIENTS,
    backend_options,
    build_backend,
    is_analytical,
    with_coefficient_set,
)
from blis_simpy.deploy.kv_capacity import default_tp, resolve_kv_blocks, resolve_max_model_len
from blis_simpy.deploy.lookups import (
    Lookups,
    blackbox_coefficients,
    deployment_identity,
    global_coefficients,
)
from blis_simpy.errors import ConfigError, did_you_mean
from blis_simpy.kv.cache import KVCache
from blis_simpy.kv.offload import OffloadKVCache, offload_blocks
from blis_simpy.kv.sizing import KV_DTYPE_BYTES
from blis_simpy.kv.tiered import TieredKVCache, offload_threshold_warning
from blis_simpy.kv.vllm_capacity import KVCapacity, page_bytes
from blis_simpy.latency.base import LatencyModel
from blis_simpy.plugins import build_failure, checked_results, fraction, is_builtin, non_negative


@dataclass
class Deployment:
    """Everything resolved about the instances of one scenario: ``total_kv_blocks`` per
    instance (blocks of ``block_size`` tokens), ``max_model_len`` in tokens (0 = unlimited),
    and factories for each instance's latency model (µs) and KV cache."""

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


#: the tiered cache's parameters default to these engine keys (BLIS's flags)
_TIER_KEYS = {"cpu_blocks": "kv_cpu_blocks", "transfer_bandwidth": "kv_transfer_bandwidth",
              "transfer_base_latency_us": "kv_transfer_base_latency_us",
              "offload_threshold": "kv_offload_threshold"}


def _offload_params(r: Lookups, model: ModelConfig | None, gpu: GPUSpec | None, tp: int) -> dict:
    """The offload tier's parameters from ``engine.kv_cpu_gib`` (docs/kv-cache.md, "CPU offload
    (vLLM OffloadingConnector)"): CPU blocks = int(G · 2^30) // (one block's bytes on one GPU ×
    TP), the bytes as vLLM's KV page (``kv_cache_dtype``); the GPU's ``host_link_gbps``."""
    eng = r.s.engine
    field = "engine.kv_cpu_gib"
    if model is None or model.num_layers <= 0:
        raise ConfigError("the CPU offload tier is sized from the model's KV bytes per block: it needs "
                          "the model's config.json (--model-config-folder, or a catalog model)", field=field)
    if gpu is None:
        raise ConfigError("the CPU offload tier's transfers are timed by the GPU's host link: pass "
                          "--hardware", field=field)
    if gpu.host_link_gbps <= 0:
        raise ConfigError(f"GPU {gpu.name} has no host_link_gbps (host <-> GPU GB/s per direction): set it "
                          "under gpus: in the scenario or in --hardware-config", field=field)
    kv_bytes = KV_DTYPE_BYTES.get(eng.kv_cache_dtype) or model.bytes_per_param
    ranks = max(tp, 1)
    block = page_bytes(model, ranks, eng.block_size, kv_bytes) * model.num_layers
    if block <= 0:
        raise ConfigError(f"cannot size the CPU offload tier: model {model.name or '(unnamed)'} gives "
                          "0 KV bytes per block", field=field)
    n = offload_blocks(eng.kv_cpu_gib, block, ranks)
    if n <= 0:
        raise ConfigError(f"{eng.kv_cpu_gib:g} GiB holds no KV block ({block:,} bytes per GPU x TP {ranks})",
                          field=field)
    r.note(f"CPU KV offload tier: {eng.kv_cpu_gib:g} GiB = {n:,} blocks ({block:,} bytes per block per "
           f"GPU x TP {ranks}); {gpu.name} host link {gpu.host_link_gbps:g} GB/s, "
           f"{eng.kv_cpu_latency_us} us per transfer")
    return {"cpu_blocks": n, "block_bytes": block, "link_gbps": gpu.host_link_gbps,
            "link_latency_us": eng.kv_cpu_latency_us}


def _kv_factory(r: Lookups, model: ModelConfig | None = None, gpu: GPUSpec | None = None,
                tp: int = 1) -> Callable[[int, int], KVCache]:
    """The registered KV cache (``engine.kv_cache``; unset: ``offload`` when
    ``engine.kv_cpu_gib > 0``, ``tiered`` when ``engine.kv_cpu_blocks > 0``, else ``gpu``) with
    its validated ``engine.kv_cache_params``. A plugin cache's constructor errors are reported
    as that plugin's (when the instances are built)."""
    eng = r.s.engine
    given = eng.kv_cache_params
    kind = eng.kv_cache if eng.kv_cache is not None else (
        "offload" if eng.kv_cpu_gib > 0 else "tiered" if eng.kv_cpu_blocks > 0 else "gpu")
    cls = KVCache.lookup(kind, field="engine.kv_cache")
    if eng.kv_cpu_gib > 0 and not issubclass(cls, OffloadKVCache):
        raise ConfigError(f"engine.kv_cpu_gib needs the offload KV cache, not {kind!r}: leave "
                          "engine.kv_cache unset", field="engine.kv_cpu_gib")
    raw = dict(given)
    if issubclass(cls, OffloadKVCache) and eng.kv_cpu_gib > 0:
        raw = _offload_params(r, model, gpu, tp) | raw
    tiered = issubclass(cls, TieredKVCache)
    if tiered:
        # the offload threshold is ignored: not passed on; a warning when the user set it
        raw = {key: getattr(eng, flat) for key, flat in _TIER_KEYS.items()
               if key != "offload_threshold"} | raw
        if "kv_offload_threshold" in eng.model_fields_set and eng.kv_offload_threshold != 0:
            r.warn(offload_threshold_warning(eng.kv_offload_threshold))
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
        kv = factory(total_blocks, block_size)
    except ConfigError:
        raise
    except Exception as exc:     # the plugin's own constructor failed
        raise build_failure(cls, exc, field="engine.kv_cache") from None
    # the rates it reports reach snapshots and the results: NaN there broke the JSON report
    return checked_results(kv, {"cache_hit_rate": fraction, "kv_thrashing_rate": non_negative},
                           field="engine.kv_cache")


def _model_config(r: Lookups, backend: str) -> ModelConfig:
    """The architecture an analytical backend needs; a model found nowhere is "unknown
    model" with the catalog's closest names."""
    s = r.s
    model_cfg, tried = r.model_config(s.model)
    if model_cfg is None:
        near = did_you_mean(s.model, builtin_models().names()) if s.model else ""
        what = f"unknown model {s.model}{near}" if s.model else "no model given"
        raise ConfigError(f"{what}: {backend} needs its architecture, not found in "
                          f"{' or '.join(tried) or 'any source'}; pass --model-config-folder DIR "
                          "with its HuggingFace config.json (blis-simpy never downloads)",
                          field="model_config_folder" if s.model_config_folder else "model")
    return model_cfg


def resolve(scenario: Scenario, *, quiet: bool = False) -> Deployment:
    """Resolve ``scenario`` (explicit values always win). ``quiet``: log nothing."""
    backend = scenario.latency.model or "physics"
    lat_cls = LatencyModel.lookup(backend, field="latency.model")
    lat_params = lat_cls.parse_params(scenario.latency.params, field="latency.params")
    lat, set_note = with_coefficient_set(scenario.latency, backend)
    if lat is not scenario.latency:
        scenario = scenario.model_copy(update={"latency": lat})
    r = Lookups(scenario, quiet)
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
    analytical = is_analytical(backend)
    # the TP of an analytical run: given, a defaults file the user passed, else one rule
    # for every model (default_tp); the built-in per-model TPs serve blackbox's rows
    hw, tp, vllm = deployment_identity(r, cat, catalog_tp=not analytical or bool(s.defaults_filepath))
    gpus = r.gpus()
    gpu = None
    model_cfg = None
    if analytical:
        model_cfg = _model_config(r, backend)
        if not hw:
            raise ConfigError(f"{backend} needs a GPU: pass --hardware (model {s.model or '(none)'} has no "
                              f"default; available: {', '.join(gpus.names())})", field="hardware")
        gpu = gpus.get(hw)
        if tp <= 0:
            tp = default_tp(r, model_cfg, gpu)
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
    total = resolve_kv_blocks(r, cat, backend, hw, tp, vllm, model_cfg, gpu)
    offload_model = model_cfg
    if eng.kv_cpu_gib > 0 and offload_model is None and s.model:
        offload_model = r.model_config(s.model)[0]   # blackbox: a config found offline sizes the tier
    max_len = resolve_max_model_len(r, backend, model_cfg, total)
    build = partial(build_backend, backend, model_cfg, gpu, tp, alpha, beta, cfg.compat,
                    backend_options(s), lat_params)
    build()                     # validate now: errors before anything runs
    return Deployment(total_kv_blocks=total, block_size=eng.block_size, max_model_len=max_len,
                      latency_factory=build, kv_factory=_kv_factory(r, offload_model, gpu, tp), notes=r.notes, backend=backend,
                      hardware=hw, tp=tp, vllm_version=vllm, gpu=gpu, model_config=model_cfg,
                      warnings=r.warnings, alpha=alpha, beta=beta, kv_capacity=r.kv_capacity,
                      kv_source=r.kv_source)


def build_latency_model(scenario: Scenario) -> LatencyModel:
    """The scenario's latency model, fully resolved (silently: :func:`resolve` logs)."""
    return resolve(scenario, quiet=True).new_latency_model()
