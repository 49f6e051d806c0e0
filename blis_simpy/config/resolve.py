"""Resolve a scenario into what the simulator builds: latency models, KV sizes, context caps.

A :class:`~blis_simpy.config.scenario.Scenario` says what the user asked for; the rest comes
from the offline catalogs (:mod:`blis_simpy.catalog`). :func:`resolve` applies BLIS's order
(spec/09 §2–§3, spec/04 §7–§8) and returns a :class:`Deployment`, the only thing
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
   with a model config) > 1,000,000 (warning when the auto-calculation failed);
6. MaxModelLen: explicit, else derived from the model config (analytical backends), then
   capped to the KV capacity with a warning;
7. KV store: a CPU tier (``TieredKVCache``) when ``engine.kv_cpu_blocks > 0``.

``Deployment.notes`` records where each value came from.

:func:`resolve_pools` adds prefill/decode disaggregation (spec/06 §1, §4): it validates the
pool topology and the PD settings and returns a :class:`PoolPlan` — the role of every
instance, one :class:`Deployment` per role (pool overrides applied to a copy of the
scenario), the KV-transfer parameters, the decider, the interference factors, the per-pool
routers and the compatibility mode.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

from blis_simpy.catalog.coefficients import CoefficientCatalog, builtin_coefficients, read_blis_defaults
from blis_simpy.catalog.hardware import GPUCatalog, gpu_catalog
from blis_simpy.catalog.models import builtin_models
from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.config.scenario import PoolOverrides, RoutingConfig, Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.kv.cache import KVCache
from blis_simpy.latency.base import LatencyModel

log = logging.getLogger("blis_simpy")

DEFAULT_TOTAL_KV_BLOCKS = 1_000_000
ANALYTICAL = ("roofline", "crossmodel", "trained-roofline")


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

    def new_latency_model(self) -> LatencyModel:
        return self.latency_factory()

    def new_kv_cache(self) -> KVCache:
        return self.kv_factory(self.total_kv_blocks, self.block_size)


class _Resolution:
    """One pass over a scenario; collects notes and warnings as it goes."""

    def __init__(self, s: Scenario, quiet: bool, prefix: str = ""):
        self.s = s
        self.quiet = quiet
        self.prefix = prefix            # "prefill pool: " for a pool's resolution
        self.notes: list[str] = []
        self.warnings: list[str] = []

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
        from blis_simpy.catalog.hfconfig import looks_like_hf_config, parse_hf_config
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
                from blis_simpy.catalog.hfconfig import load_hf_json
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
def _deployment_identity(r: _Resolution, cat: CoefficientCatalog) -> tuple[str, int, str]:
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


def _blackbox_coefficients(r: _Resolution, cat: CoefficientCatalog, hw: str, tp: int, vllm: str):
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


def _global_coefficients(r: _Resolution, cat: CoefficientCatalog, backend: str):
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


def _kv_blocks(r: _Resolution, cat, backend, hw, tp, vllm, model_cfg, gpu) -> int:
    s = r.s
    eng = s.engine
    if eng.total_kv_blocks is not None:
        return eng.total_kv_blocks
    if s.model and hw and tp > 0:
        kv = cat.kv_blocks(s.model, hw, tp, vllm)
        if kv is not None:
            r.note(f"total_kv_blocks {kv}: catalog row {s.model} {hw} TP{tp} {vllm}")
            return kv
    if model_cfg is None and backend not in ANALYTICAL and gpu is not None and tp > 0 and s.model:
        model_cfg = r.model_config(s.model)[0]      # blackbox: only a config available offline
    if model_cfg is not None and gpu is not None and tp > 0:
        from blis_simpy.kv.capacity import KVCapacityError, kv_capacity_blocks
        try:
            kv = kv_capacity_blocks(model_cfg, gpu, tp, eng.block_size, eng.gpu_memory_utilization)
        except KVCapacityError as exc:
            r.warn(f"KV capacity auto-calculation failed ({exc}); using the default "
                   f"{DEFAULT_TOTAL_KV_BLOCKS} blocks")
            return DEFAULT_TOTAL_KV_BLOCKS
        r.note(f"total_kv_blocks {kv}: auto-calculated for {tp} x {gpu.name}, gpu memory "
               f"utilization {eng.gpu_memory_utilization}, block size {eng.block_size}")
        return kv
    if backend in ANALYTICAL:
        r.warn(f"no KV capacity could be resolved; using the default {DEFAULT_TOTAL_KV_BLOCKS} blocks")
    else:
        r.note(f"total_kv_blocks {DEFAULT_TOTAL_KV_BLOCKS}: default (no catalog row, no model config)")
    return DEFAULT_TOTAL_KV_BLOCKS


def _max_model_len(r: _Resolution, backend: str, model_cfg, total_blocks: int) -> int:
    from blis_simpy.catalog.hfconfig import cap_max_model_len, derive_max_model_len
    eng = r.s.engine
    m = eng.max_model_len
    if backend not in ANALYTICAL:
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


def _kv_factory(r: _Resolution) -> Callable[[int, int], KVCache]:
    eng = r.s.engine
    if eng.kv_cpu_blocks <= 0:
        return KVCache
    from blis_simpy.kv.tiered import TieredKVCache
    r.note(f"CPU KV tier: {eng.kv_cpu_blocks} blocks, {eng.kv_transfer_bandwidth} blocks/us, "
           f"base latency {eng.kv_transfer_base_latency_us} us")
    try:   # TieredKVCache warns (per cache) that the offload threshold is ignored
        return TieredKVCache.factory(cpu_blocks=eng.kv_cpu_blocks, transfer_bandwidth=eng.kv_transfer_bandwidth,
                                     transfer_base_latency_us=eng.kv_transfer_base_latency_us,
                                     offload_threshold=eng.kv_offload_threshold)
    except ValueError as exc:
        raise ConfigError(str(exc), field="engine.kv_cpu_blocks") from None


def _build(backend: str, model_cfg, gpu, tp, alpha, beta, compat: str) -> LatencyModel:
    cls = LatencyModel.lookup(backend, field="latency.model")
    try:
        if backend == "blackbox":
            return cls(alpha, beta)
        opts = {}
        if compat == "checkout":
            opts = {"moe_weight_batch_zero": True} if backend == "roofline" else {"checkout_moe_threshold": True}
        return cls.from_config(model_cfg, gpu, tp, alpha, beta, **opts)
    except ValueError as exc:
        raise ConfigError(str(exc), field="latency") from None


def resolve(scenario: Scenario, *, quiet: bool = False) -> Deployment:
    """Resolve ``scenario`` (explicit values always win). ``quiet``: log nothing."""
    import blis_simpy.latency  # noqa: F401  (registers every built-in backend)
    r = _Resolution(scenario, quiet)
    s, eng, cfg = scenario, scenario.engine, scenario.latency
    backend = cfg.model or "roofline"
    LatencyModel.lookup(backend, field="latency.model")
    if backend == "roofline" and (cfg.alpha_coeffs is not None or cfg.beta_coeffs is not None):
        raise ConfigError("roofline takes no alpha/beta coefficients (use blackbox, crossmodel or "
                          "trained-roofline, or drop them)", field="latency.model")
    cat = r.coefficients()
    hw, tp, vllm = _deployment_identity(r, cat)
    analytical = backend in ANALYTICAL
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
        alpha, beta = _blackbox_coefficients(r, cat, hw, tp, vllm)
    elif backend in ("crossmodel", "trained-roofline"):
        alpha, beta = _global_coefficients(r, cat, backend)
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
    build = partial(_build, backend, model_cfg, gpu, tp, alpha, beta, cfg.compat)
    build()                     # validate now: errors before anything runs
    return Deployment(total_kv_blocks=total, block_size=eng.block_size, max_model_len=max_len,
                      latency_factory=build, kv_factory=_kv_factory(r), notes=r.notes, backend=backend,
                      hardware=hw, tp=tp, vllm_version=vllm, gpu=gpu, model_config=model_cfg,
                      warnings=r.warnings, alpha=alpha, beta=beta)


def build_latency_model(scenario: Scenario) -> LatencyModel:
    """The scenario's latency model, fully resolved (silently: :func:`resolve` logs)."""
    return resolve(scenario, quiet=True).new_latency_model()


# ============================================================================ PD pools
PREFILL, DECODE, UNASSIGNED = "prefill", "decode", "unassigned"
ROLES = (PREFILL, DECODE, UNASSIGNED)
#: BLIS's --pd-kv-bytes-per-token default (spec/06 §3.4; spec/10 quirk 14)
BLIS_KV_BYTES_PER_TOKEN = 512
#: the built-in deciders (spec/06 §2), used to check names before the registry is imported
BUILTIN_DECIDERS = ("never", "always", "prefix-threshold", "direct-to-decode")
_OVERRIDE_FIELDS = ("tp", "hardware", "latency_model", "max_model_len", "total_kv_blocks")


@dataclass(frozen=True)
class PoolPlan:
    """The prefill/decode split of a scenario's instances, fully resolved (spec/06 §1–§6).

    Built by :func:`resolve_pools`; the cluster reads only this (and never the scenario's
    ``disaggregation`` section directly):

    * ``enabled``: pools exist (both instance counts > 0). When ``False`` every instance is
      ``"unassigned"``, ``decider`` is ``"never"`` and the run is the plain cluster.
    * ``roles[i]``: role of ``instance_i`` — ``"prefill"`` for ``0 … P-1``, ``"decode"`` for
      ``P … P+D-1``, ``"unassigned"`` for the rest (INV-PD-5: fixed for the whole run).
    * ``deployments[role]``: the :class:`Deployment` to build that role's instances with
      (latency model, KV blocks, MaxModelLen). ``"unassigned"`` is the global deployment; a
      pool without overrides shares it. Pool overrides never touch the global one (INV-P2-1).
    * ``kv_bytes_per_token``: KV bytes of one token **across all TP ranks** (what crosses the
      fabric for one prompt token): given, else ``2 × layers × kv_heads × head_dim ×
      bytes_per_param`` of the model (``head_dim = hidden / heads``), else 512 (BLIS's
      default; always 512 under compat ``checkout`` unless given).
    * ``bandwidth_gbps`` (GB/s, 1 GB = 1e9 B), ``base_latency_ms``: the transfer fabric.
    * ``contention``: ``"none"`` (every transfer gets the full bandwidth), ``"snapshot"``
      (BLIS: ``bandwidth / active`` fixed at the start) or ``"fair-share"`` (processor
      sharing). Unset in the scenario ⇒ ``"fair-share"``, or ``"none"`` under ``checkout``.
    * ``decider`` / ``decider_params``: the validated decider name and its raw parameters.
    * ``interference_prefill`` / ``interference_decode``: the co-location factors (spec/06 §6);
      both 0 ⇒ no wrapper.
    * ``routing[role]``: the pool's own router config (``"prefill"`` / ``"decode"``), or
      ``None`` to use the main policy (see :attr:`shares_main_router`).
    * ``compat``: ``"fixed"`` (ours) or ``"checkout"`` (the Go checkout's PD behaviour); the
      boolean properties below spell out what it switches.
    * ``warnings`` / ``notes``: what :func:`resolve_pools` warned about / resolved from where.
    """

    enabled: bool
    roles: tuple[str, ...]
    deployments: Mapping[str, Deployment]
    kv_bytes_per_token: int = BLIS_KV_BYTES_PER_TOKEN
    bandwidth_gbps: float = 25.0
    base_latency_ms: float = 0.05
    contention: str = "none"
    decider: str = "never"
    decider_params: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    interference_prefill: float = 0.0
    interference_decode: float = 0.0
    routing: Mapping[str, RoutingConfig | None] = field(
        default_factory=lambda: MappingProxyType({PREFILL: None, DECODE: None}))
    compat: str = "fixed"
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    # ------------------------------------------------------------------ membership
    @property
    def num_instances(self) -> int:
        return len(self.roles)

    def members(self, role: str) -> tuple[int, ...]:
        """Instance indices of ``role`` in index order."""
        return tuple(i for i, r in enumerate(self.roles) if r == role)

    @property
    def prefill_instances(self) -> int:
        return self.roles.count(PREFILL)

    @property
    def decode_instances(self) -> int:
        return self.roles.count(DECODE)

    def role_of(self, index: int) -> str:
        return self.roles[index]

    def deployment_for(self, index: int) -> Deployment:
        """The deployment ``instance_<index>`` is built with."""
        return self.deployments[self.roles[index]]

    @property
    def global_deployment(self) -> Deployment:
        return self.deployments[UNASSIGNED]

    def routing_for(self, role: str) -> RoutingConfig | None:
        """The pool's own router config, or ``None`` for the main policy."""
        return self.routing.get(role)

    # ------------------------------------------------------------------ what compat switches
    @property
    def checkout(self) -> bool:
        return self.compat == "checkout"

    @property
    def local_routing(self) -> str:
        """Where non-disaggregated requests go when pools exist (spec/10 A2): ``"decode-pool"``
        (the decode pool, with the decode pool's router — seed, ours) or ``"all"`` (every
        routable instance with the main policy — checkout)."""
        return "all" if self.checkout else "decode-pool"

    @property
    def shares_main_router(self) -> bool:
        """spec/10 quirk 3: under ``checkout`` a pool without its own router uses the main
        policy **object** (one round-robin counter for everything); otherwise each such pool
        gets its own instance of the main policy."""
        return self.checkout

    @property
    def checkout_parent_timing(self) -> bool:
        """spec/10 C2: the checkout's parent TTFT (= prefill TTFT) and E2E (= detection time −
        arrival) instead of the corrected ones."""
        return self.checkout

    @property
    def interference(self) -> bool:
        return self.interference_prefill > 0 or self.interference_decode > 0


def kv_bytes_per_token(model: ModelConfig) -> int:
    """KV-cache bytes of one token, K and V, all layers, across all TP ranks:
    ``2 × num_layers × kv_heads × head_dim × bytes_per_param`` with ``head_dim =
    hidden_size // num_heads`` (BLIS ignores config.json's ``head_dim``, spec/10 quirk 16) and
    ``kv_heads = num_key_value_heads`` (``num_heads`` when absent). Qwen3-14B (40 layers, 8 KV
    heads, 5120 / 40 = 128, bf16): 163,840. Raises ``ValueError`` for an incomplete shape."""
    L, H, h, bpp = model.num_layers, model.num_heads, model.hidden_size, model.bytes_per_param
    if L <= 0 or H <= 0 or h <= 0:
        raise ValueError(f"the model shape is incomplete (layers {L}, heads {H}, hidden size {h})")
    if not (math.isfinite(bpp) and bpp > 0):
        raise ValueError(f"the model's bytes per parameter are unknown ({bpp})")
    kvh = model.num_kv_heads if model.num_kv_heads > 0 else H
    v = int(2 * L * kvh * (h // H) * bpp)
    if v <= 0:
        raise ValueError(f"the model's KV footprint is {v} bytes per token")
    return v


def decider_registry():
    """The decider registry (``DisaggregationDecider``), or ``None`` if not importable."""
    try:
        from blis_simpy.disagg.deciders import DisaggregationDecider
    except ModuleNotFoundError as exc:
        if exc.name not in ("blis_simpy.disagg.deciders",):
            raise
        return None
    return DisaggregationDecider


def decider_names() -> list[str]:
    reg = decider_registry()
    return reg.names() if reg is not None else list(BUILTIN_DECIDERS)


def check_decider(name: str, params: Mapping | None = None, *, field: str = "disaggregation.decider"):
    """Check a decider name (``""`` = ``never``) and its parameters; returns the name."""
    name = name or "never"
    reg = decider_registry()
    if reg is not None:
        cls = reg.lookup(name, field=f"{field}.policy")
        if params is not None:
            cls.parse_params(dict(params), field=f"{field}.params")
        return name
    if name not in BUILTIN_DECIDERS:
        raise ConfigError(f"unknown disaggregation decider {name!r}; valid: {', '.join(BUILTIN_DECIDERS)}",
                          field=f"{field}.policy")
    for key, v in (params or {}).items():
        if key != "threshold" or name not in ("prefix-threshold", "direct-to-decode"):
            raise ConfigError("unknown parameter", field=f"{field}.params.{key}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"must be an integer >= 0, got {v!r}", field=f"{field}.params.{key}")
    return name


def _decider_warnings(name: str, params: Mapping, block_size: int) -> list[str]:
    """The decider's own notes on a legal but probably unintended configuration."""
    reg = decider_registry()
    if reg is None:
        if name == "direct-to-decode" and params.get("threshold", 256) == 0:
            return ["direct-to-decode threshold 0: every non-empty request is disaggregated"]
        return []
    cls = reg.lookup(name)
    return list(cls(cls.parse_params(dict(params)), block_size=block_size).config_warnings())


def check_topology(prefill: int, decode: int, num_instances: int) -> bool:
    """spec/06 §1; returns whether pools exist. Raises BLIS's "Invalid PD pool topology"."""
    if prefill < 0 or decode < 0:
        which, v = ("prefill", prefill) if prefill < 0 else ("decode", decode)
        raise ConfigError(f"Invalid PD pool topology: {which}-instances must be >= 0, got {v}",
                          field=f"disaggregation.{which}_instances")
    if prefill == 0 and decode == 0:
        return False
    if prefill == 0 or decode == 0:
        which = "prefill" if prefill > 0 else "decode"     # the one that was set
        raise ConfigError(f"Invalid PD pool topology: prefill-instances ({prefill}) and decode-instances "
                          f"({decode}) must both be > 0 (or both 0 to disable disaggregation)",
                          field=f"disaggregation.{which}_instances")
    if prefill + decode > num_instances:
        raise ConfigError(f"Invalid PD pool topology: prefill-instances ({prefill}) + decode-instances "
                          f"({decode}) = {prefill + decode} exceeds num-instances ({num_instances})",
                          field="disaggregation.prefill_instances")
    return True


def _given_overrides(ov: PoolOverrides) -> list[str]:
    return [k for k in (*_OVERRIDE_FIELDS, "routing") if getattr(ov, k) is not None]


def resolve_pools(scenario: Scenario, *, quiet: bool = False,
                  deployment: Deployment | None = None) -> PoolPlan:
    """Validate the scenario's PD settings and resolve its pools (spec/06 §1–§6).

    ``deployment``: the already resolved global deployment (else :func:`resolve` is called).
    ``quiet``: log nothing (warnings are still in ``PoolPlan.warnings``). Raises
    :class:`ConfigError` naming the scenario key (the CLI maps it to the flag that set it).
    """
    import blis_simpy.latency  # noqa: F401  (registers every built-in backend)
    s, d = scenario, scenario.disaggregation
    n = s.cluster.num_instances
    P, D = d.prefill_instances, d.decode_instances
    enabled = check_topology(P, D, n)
    checkout = d.compat == "checkout"
    r = _Resolution(s, quiet, prefix="PD: ")
    glob = deployment if deployment is not None else resolve(s, quiet=quiet)

    decider = check_decider(d.decider.policy, d.decider.params)
    if decider != "never" and not enabled:
        if not checkout:
            raise ConfigError(f"decider {decider!r} needs PD pools: set --prefill-instances and "
                              "--decode-instances (both > 0), or use --pd-decider never",
                              field="disaggregation.decider.policy")
        r.warn(f"decider {decider!r} has no effect: PD disaggregation is disabled "
               "(--prefill-instances and --decode-instances are 0)")
    always = False
    if enabled:
        for text in _decider_warnings(decider, d.decider.params, glob.block_size):
            r.warn(text)
        reg = decider_registry()
        always = (reg.lookup(decider).constant_decision is True) if reg is not None else decider == "always"

    t = d.transfer
    contention = t.contention
    if contention is not None and contention != "none" and not enabled:
        raise ConfigError(f"transfer contention ({contention}) needs PD pools: set --prefill-instances "
                          "and --decode-instances (both > 0)", field="disaggregation.transfer.contention")
    if contention is None:
        contention = "none" if checkout else "fair-share"

    f_p, f_d = d.interference.prefill, d.interference.decode
    if not enabled:
        for role, ov in ((PREFILL, d.prefill_pool), (DECODE, d.decode_pool)):
            keys = _given_overrides(ov)
            if keys:
                r.warn(f"{role} pool overrides ({', '.join(keys)}) have no effect: PD disaggregation "
                       "is disabled (--prefill-instances and --decode-instances are 0)")
        return PoolPlan(enabled=False, roles=(UNASSIGNED,) * n,
                        deployments=MappingProxyType({UNASSIGNED: glob}),
                        kv_bytes_per_token=t.kv_bytes_per_token or BLIS_KV_BYTES_PER_TOKEN,
                        bandwidth_gbps=t.bandwidth_gbps, base_latency_ms=t.base_latency_ms,
                        contention="none", interference_prefill=f_p, interference_decode=f_d,
                        compat=d.compat, warnings=tuple(r.warnings), notes=tuple(r.notes))

    if P + D < n and not checkout:
        idle = f"instance_{P + D}" if n - P - D == 1 else f"instance_{P + D} … instance_{n - 1}"
        r.warn(f"{n - P - D} unassigned instance(s) ({idle}) sit idle: "
               "requests that are not disaggregated go to the decode pool (--pd-compat checkout "
               "routes them over all instances)")
    if (f_p > 0 or f_d > 0) and always:
        r.warn(f"the interference factors do not affect pool instances with the {decider} decider "
               "(their batches are phase-pure); they still slow mixed batches elsewhere")

    kvb = _kv_bytes(r, s, glob, checkout)
    cat, gpus = r.coefficients(silent=True), r.gpus()
    deployments = {UNASSIGNED: glob}
    warnings, notes = list(r.warnings), list(r.notes)
    for role, ov in ((PREFILL, d.prefill_pool), (DECODE, d.decode_pool)):
        dep = _pool_deployment(s, glob, ov, role, checkout, quiet, cat, gpus)
        deployments[role] = dep
        if dep is not glob:
            warnings += [f"{role} pool: {w}" for w in dep.warnings]
            notes += [f"{role} pool: {x}" for x in dep.notes]
    routing = {role: _pool_routing(s, ov.routing, f"disaggregation.{role}_pool.routing")
               for role, ov in ((PREFILL, d.prefill_pool), (DECODE, d.decode_pool))}
    roles = tuple(PREFILL if i < P else DECODE if i < P + D else UNASSIGNED for i in range(n))
    return PoolPlan(enabled=True, roles=roles, deployments=MappingProxyType(deployments),
                    kv_bytes_per_token=kvb, bandwidth_gbps=t.bandwidth_gbps,
                    base_latency_ms=t.base_latency_ms, contention=contention, decider=decider,
                    decider_params=MappingProxyType(dict(d.decider.params)),
                    interference_prefill=f_p, interference_decode=f_d,
                    routing=MappingProxyType(routing), compat=d.compat, warnings=tuple(warnings),
                    notes=tuple(notes))


def _kv_bytes(r: _Resolution, s: Scenario, glob: Deployment, checkout: bool) -> int:
    """Given > compat checkout's 512 > derived from the model shape > 512 with a warning."""
    given = s.disaggregation.transfer.kv_bytes_per_token
    if given is not None:
        return given
    if checkout:
        r.note(f"KV bytes per token {BLIS_KV_BYTES_PER_TOKEN}: BLIS's default (compat checkout)")
        return BLIS_KV_BYTES_PER_TOKEN
    cfg = glob.model_config
    if cfg is None and s.model:
        try:          # blackbox: a model config available offline (folder, defaults dir, catalog)
            cfg = r.model_config(s.model)[0]
        except ConfigError:
            cfg = None
    if cfg is not None:
        try:
            v = kv_bytes_per_token(cfg)
        except ValueError as exc:
            r.warn(f"KV bytes per token cannot be derived ({exc}); using BLIS's default "
                   f"{BLIS_KV_BYTES_PER_TOKEN} (set --pd-kv-bytes-per-token)")
            return BLIS_KV_BYTES_PER_TOKEN
        kvh = cfg.num_kv_heads if cfg.num_kv_heads > 0 else cfg.num_heads
        r.note(f"KV bytes per token {v}: 2 x {cfg.num_layers} layers x {kvh} KV heads x "
               f"{cfg.hidden_size // cfg.num_heads} head dim x {cfg.bytes_per_param:g} bytes (all TP ranks)")
        return v
    r.warn(f"KV bytes per token: no model config for {s.model or '(no model)'}; using BLIS's default "
           f"{BLIS_KV_BYTES_PER_TOKEN}, which makes transfers almost free (set --pd-kv-bytes-per-token)")
    return BLIS_KV_BYTES_PER_TOKEN


def _pool_routing(s: Scenario, cfg: RoutingConfig | None, key: str) -> RoutingConfig | None:
    """A pool's own router, checked; it inherits the main ``tie_break`` when it has none."""
    if cfg is None:
        return None
    from blis_simpy.routing.base import Router
    cls = Router.lookup(cfg.policy, field=f"{key}.policy")
    params = dict(cfg.params)
    main = s.cluster.routing.params
    if "tie_break" in cls.Params.model_fields and "tie_break" not in params and "tie_break" in main:
        params["tie_break"] = main["tie_break"]
    cls.parse_params(params, field=f"{key}.params")
    return RoutingConfig(policy=cfg.policy, params=params)


def _pool_deployment(s: Scenario, glob: Deployment, ov: PoolOverrides, role: str, checkout: bool,
                     quiet: bool, cat: CoefficientCatalog, gpus: GPUCatalog) -> Deployment:
    """One pool's deployment: the global one with the pool's overrides (spec/06 §4).

    The overrides go into a deep copy of the scenario (INV-P2-1). TP, latency backend and
    MaxModelLen replace the global values. GPU: the pool's hardware calibration drives its
    latency model (spec/10 quirk 4 fixed); under compat ``checkout`` only the label and the KV
    auto-calculation change. KV blocks: the pool's ``total_kv_blocks``, else — analytical
    backends whose TP or GPU differs from the global one — the auto-calculation (spec/03 §7)
    with the pool's TP and GPU; the pool's MaxModelLen (if not given) is then lowered to
    ``pool_blocks × block_size`` when that is below the global one. A failed auto-calculation
    is a warning and the pool keeps the global KV blocks and MaxModelLen.
    """
    given = {k: getattr(ov, k) for k in _OVERRIDE_FIELDS if getattr(ov, k) is not None}
    if not given:
        return glob
    key = f"disaggregation.{role}_pool"
    ps = s.model_copy(deep=True)
    if ov.tp is not None:
        ps.tp = ov.tp
    if ov.hardware is not None:
        ps.hardware = ov.hardware
    if ov.latency_model is not None:
        ps.latency.model = ov.latency_model
    if ov.max_model_len is not None:
        ps.engine.max_model_len = ov.max_model_len
    if ov.total_kv_blocks is not None:
        ps.engine.total_kv_blocks = ov.total_kv_blocks
    r = _Resolution(ps, quiet, prefix=f"{role} pool: ")
    for k, v in given.items():
        r.note(f"{k} {v}: pool override")
    eng = ps.engine
    backend = ps.latency.model or "roofline"
    LatencyModel.lookup(backend, field=f"{key}.latency_model")
    analytical = backend in ANALYTICAL
    tp = ov.tp if ov.tp is not None else glob.tp
    hw = glob.hardware
    gpu = glob.gpu
    if ov.hardware is not None:
        if analytical or ov.hardware in gpus:
            gpu = gpus.get(ov.hardware, field=f"{key}.hardware")
            hw = gpu.name
        else:          # blackbox: a GPU outside the catalog is a label (as for the global one)
            gpu, hw = None, ov.hardware
    if analytical:
        if gpu is None:
            if not hw:
                raise ConfigError(f"{backend} needs a GPU: set the {role} pool's hardware",
                                  field=f"{key}.hardware")
            gpu = gpus.get(hw, field=f"{key}.hardware")
            hw = gpu.name
        if tp <= 0:
            raise ConfigError(f"{backend} needs tensor parallelism > 0", field=f"{key}.tp")
    changed = tp != glob.tp or hw != glob.hardware

    model_cfg = glob.model_config
    if analytical and model_cfg is None:
        model_cfg, tried = r.model_config(s.model)
        if model_cfg is None:
            raise ConfigError(f"{backend} needs the architecture of model {s.model or '(none)'}: not found "
                              f"in {' or '.join(tried) or 'any source'}", field=f"{key}.latency_model")

    # which hardware calibration times this pool's steps (spec/10 quirk 4)
    lat_gpu = gpu
    if checkout and analytical and glob.gpu is not None and hw != glob.hardware:
        lat_gpu = glob.gpu
        r.note(f"latency model keeps the global hardware calibration {glob.gpu.name} (compat checkout)")

    alpha, beta = _pool_coefficients(r, cat, backend, glob, hw, tp, checkout, changed, key)

    # KV blocks and MaxModelLen
    total, max_len = glob.total_kv_blocks, glob.max_model_len
    if analytical and glob.backend not in ANALYTICAL and eng.max_model_len == 0 and max_len == 0:
        from blis_simpy.catalog.hfconfig import derive_max_model_len
        max_len = derive_max_model_len(model_cfg)
    if ov.total_kv_blocks is not None:
        total = ov.total_kv_blocks
    elif analytical and changed:
        from blis_simpy.kv.capacity import KVCapacityError, kv_capacity_blocks
        try:
            total = kv_capacity_blocks(model_cfg, gpu, tp, eng.block_size, eng.gpu_memory_utilization)
            r.note(f"total_kv_blocks {total}: auto-calculated for {tp} x {gpu.name}")
        except KVCapacityError as exc:
            r.warn(f"KV capacity auto-calculation for {tp} x {gpu.name} failed ({exc}); the pool keeps "
                   f"the global {glob.total_kv_blocks} KV blocks and max_model_len {glob.max_model_len}")
            total, max_len = glob.total_kv_blocks, glob.max_model_len
    bs = eng.block_size
    if ov.max_model_len is not None:
        max_len = ov.max_model_len
        if analytical and max_len > total * bs:
            r.warn(f"max_model_len {max_len} exceeds the pool's KV capacity ({total} blocks x {bs} "
                   f"tokens); capped to {total * bs}")
            max_len = total * bs
    elif total != glob.total_kv_blocks and 0 < total * bs < max_len:
        r.note(f"max_model_len {total * bs}: lowered to the pool's KV capacity ({total} blocks x {bs} tokens)")
        max_len = total * bs

    build = partial(_build, backend, model_cfg, lat_gpu, tp, alpha, beta, s.latency.compat)
    try:
        build()
    except ConfigError as exc:
        culprit = next((k for k in ("latency_model", "hardware", "tp") if k in given), None)
        raise ConfigError(exc.problem, field=f"{key}.{culprit}" if culprit else key) from None
    return Deployment(total_kv_blocks=total, block_size=bs, max_model_len=max_len, latency_factory=build,
                      kv_factory=glob.kv_factory, notes=r.notes, backend=backend, hardware=hw, tp=tp,
                      vllm_version=glob.vllm_version, gpu=lat_gpu, model_config=model_cfg,
                      warnings=r.warnings, alpha=alpha, beta=beta)


def _pool_coefficients(r: _Resolution, cat: CoefficientCatalog, backend: str, glob: Deployment,
                       hw: str, tp: int, checkout: bool, changed: bool, key: str):
    """alpha/beta of a pool. Same backend: the global ones — except a blackbox pool whose TP or
    GPU differs and whose coefficients were not given explicitly, which takes the catalog row
    of its own deployment when one exists (not under compat checkout: BLIS's coefficients are
    global). Another backend: that backend's own catalog coefficients."""
    s, lat = r.s, r.s.latency
    if backend == glob.backend:
        explicit = lat.alpha_coeffs is not None and lat.beta_coeffs is not None
        if backend == "blackbox" and changed and not checkout and not explicit and s.model:
            row = cat.find(s.model, hw, tp, glob.vllm_version)
            if row is not None and (any(row.alpha) or any(row.beta)):
                r.note(f"blackbox coefficients: catalog row {s.model} {row.key}")
                return list(row.alpha), list(row.beta)
            r.warn(f"no blackbox coefficients for {s.model} on {tp} x {hw}; the pool uses the global ones")
        return glob.alpha, glob.beta
    lat.alpha_coeffs = lat.beta_coeffs = None    # the given ones belong to the global backend
    try:
        if backend == "blackbox":
            return _blackbox_coefficients(r, cat, hw, tp, glob.vllm_version)
        if backend in ("crossmodel", "trained-roofline"):
            return _global_coefficients(r, cat, backend)
    except ConfigError as exc:
        raise ConfigError(exc.problem, field=f"{key}.latency_model") from None
    return None, None
