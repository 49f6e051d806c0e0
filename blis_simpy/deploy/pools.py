"""Prefill/decode pools resolved from a scenario (docs/disaggregation.md, "PD in the simulator").

:func:`resolve_pools` adds prefill/decode disaggregation to the global resolution
(:func:`~blis_simpy.deploy.resolve.resolve`): it validates the pool topology and the PD
settings and returns a :class:`PoolLayout` — the role of every instance, one
:class:`~blis_simpy.deploy.resolve.Deployment` per role (pool overrides applied to a copy of
the scenario, :mod:`blis_simpy.deploy.pool_deployment`), the KV-transfer parameters, the
decider, the interference factors, the per-pool routers and the compatibility mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from blis_simpy.catalog.types import ModelConfig
from blis_simpy.config.scenario import PoolOverrides, RoutingConfig, Scenario
from blis_simpy.deploy.lookups import Lookups
from blis_simpy.deploy.pool_deployment import OVERRIDE_FIELDS, resolve_pool_deployment
from blis_simpy.deploy.resolve import Deployment, resolve
from blis_simpy.disagg.deciders import DisaggregationDecider, make_decider
from blis_simpy.errors import ConfigError
from blis_simpy.routing.base import Router

PREFILL, DECODE, UNASSIGNED = "prefill", "decode", "unassigned"
ROLES = (PREFILL, DECODE, UNASSIGNED)
#: BLIS's --pd-kv-bytes-per-token default (docs/disaggregation.md, "KV-transfer fabric"; divergences P4)
BLIS_KV_BYTES_PER_TOKEN = 512
#: the built-in deciders (docs/disaggregation.md), used to check names before the registry is imported


@dataclass(frozen=True)
class PoolLayout:
    """The prefill/decode split of a scenario's instances, fully resolved (docs/disaggregation.md).

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
    * ``interference_prefill`` / ``interference_decode``: the co-location factors
      (docs/disaggregation.md, "Interference"); both 0 ⇒ no wrapper.
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
        """Where non-disaggregated requests go when pools exist (divergences.md P1): ``"decode-pool"``
        (the decode pool, with the decode pool's router — ours) or ``"all"`` (every
        routable instance with the main policy — checkout)."""
        return "all" if self.checkout else "decode-pool"

    @property
    def shares_main_router(self) -> bool:
        """divergences.md P2: under ``checkout`` a pool without its own router uses the main
        policy **object** (one round-robin counter for everything); otherwise each such pool
        gets its own instance of the main policy."""
        return self.checkout

    @property
    def checkout_parent_timing(self) -> bool:
        """divergences.md P3: the checkout's parent TTFT (= prefill TTFT) and E2E (= detection time −
        arrival) instead of the corrected ones."""
        return self.checkout

    @property
    def interference(self) -> bool:
        return self.interference_prefill > 0 or self.interference_decode > 0


def kv_bytes_per_token(model: ModelConfig) -> int:
    """KV-cache bytes of one token, K and V, all layers, across all TP ranks:
    ``2 × num_layers × kv_heads × head_dim × bytes_per_param`` with ``head_dim =
    hidden_size // num_heads`` (BLIS ignores config.json's ``head_dim``) and
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


def check_decider(name: str, params: Mapping | None = None, *, field: str = "disaggregation.decider"):
    """Check a decider name (``""`` = ``never``) and its parameters; returns the name."""
    name = name or "never"
    cls = DisaggregationDecider.lookup(name, field=f"{field}.policy")
    if params is not None:
        cls.parse_params(dict(params), field=f"{field}.params")
    return name


def _decider_warnings(name: str, params: Mapping, block_size: int) -> list[str]:
    """The decider's own notes on a legal but probably unintended configuration."""
    decider = make_decider(name, dict(params), block_size=block_size, field="disaggregation.decider")
    return list(decider.config_warnings())


def check_topology(prefill: int, decode: int, num_instances: int) -> bool:
    """The pool topology (docs/disaggregation.md); returns whether pools exist. Raises
    BLIS's "Invalid PD pool topology"."""
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
    return [k for k in (*OVERRIDE_FIELDS, "routing") if getattr(ov, k) is not None]


def resolve_pools(scenario: Scenario, *, quiet: bool = False,
                  deployment: Deployment | None = None) -> PoolLayout:
    """Validate the scenario's PD settings and resolve its pools (docs/disaggregation.md).

    ``deployment``: the already resolved global deployment (else :func:`resolve` is called).
    ``quiet``: log nothing (warnings are still in ``PoolLayout.warnings``). Raises
    :class:`ConfigError` naming the scenario key (the CLI maps it to the flag that set it).
    """
    s, d = scenario, scenario.disaggregation
    n = s.cluster.num_instances
    P, D = d.prefill_instances, d.decode_instances
    enabled = check_topology(P, D, n)
    checkout = d.compat == "checkout"
    r = Lookups(s, quiet, prefix="PD: ")
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
        always = DisaggregationDecider.lookup(decider).constant_decision is True

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
        return PoolLayout(enabled=False, roles=(UNASSIGNED,) * n,
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
        dep = resolve_pool_deployment(s, glob, ov, role, checkout, quiet, cat, gpus)
        deployments[role] = dep
        if dep is not glob:
            warnings += [f"{role} pool: {w}" for w in dep.warnings]
            notes += [f"{role} pool: {x}" for x in dep.notes]
    routing = {role: _pool_routing(s, ov.routing, f"disaggregation.{role}_pool.routing")
               for role, ov in ((PREFILL, d.prefill_pool), (DECODE, d.decode_pool))}
    roles = tuple(PREFILL if i < P else DECODE if i < P + D else UNASSIGNED for i in range(n))
    return PoolLayout(enabled=True, roles=roles, deployments=MappingProxyType(deployments),
                    kv_bytes_per_token=kvb, bandwidth_gbps=t.bandwidth_gbps,
                    base_latency_ms=t.base_latency_ms, contention=contention, decider=decider,
                    decider_params=MappingProxyType(dict(d.decider.params)),
                    interference_prefill=f_p, interference_decode=f_d,
                    routing=MappingProxyType(routing), compat=d.compat, warnings=tuple(warnings),
                    notes=tuple(notes))


def _kv_bytes(r: Lookups, s: Scenario, glob: Deployment, checkout: bool) -> int:
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
    cls = Router.lookup(cfg.policy, field=f"{key}.policy")
    params = dict(cfg.params)
    main = s.cluster.routing.params
    if "tie_break" in cls.Params.model_fields and "tie_break" not in params and "tie_break" in main:
        params["tie_break"] = main["tie_break"]
    cls.parse_params(params, field=f"{key}.params")
    return RoutingConfig(policy=cfg.policy, params=params)
