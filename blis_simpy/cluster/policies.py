"""Build the control plane's policies from a scenario (admission, routers, the gateway
policy, autoscaling)."""

from __future__ import annotations

from blis_simpy.admission.base import AdmissionPolicy
from blis_simpy.admission.gateway import GatewayPolicy, GatewaySettings
from blis_simpy.autoscaling import AutoscalePolicy
from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.rng import RngStreams
from blis_simpy.routing.base import Router
from blis_simpy.units import round_half_away, seconds_to_us


def build_admission(scenario: Scenario) -> AdmissionPolicy:
    """The scenario's admission policy with its validated parameters."""
    cfg = scenario.cluster.admission
    cls = AdmissionPolicy.lookup(cfg.policy, field="cluster.admission.policy")
    return cls(cls.parse_params(cfg.params, field="cluster.admission.params"))


def build_router(scenario: Scenario, rng: RngStreams, block_size: int, *,
                 stream: str = "router", cfg=None, field: str = "cluster.routing") -> Router:
    """A routing policy (the scenario's main one, or ``cfg``); it draws tie-breaks from RNG
    stream ``stream``."""
    cfg = cfg if cfg is not None else scenario.cluster.routing
    cls = Router.lookup(cfg.policy, field=f"{field}.policy")
    params = cls.parse_params(cfg.params, field=f"{field}.params")
    try:
        router = cls(params, rng=rng.get(stream), block_size=block_size)
    except ConfigError as exc:
        if exc.field and not exc.field.startswith(field.split(".")[0] + "."):
            raise ConfigError(exc.problem, field=f"{field}.params.{exc.field}") from None
        raise
    router.config_field = field
    return router


def build_gateway_policy(scenario: Scenario) -> GatewayPolicy:
    """The gateway policy of ``cluster.gateway`` (which must be set) with its settings: the
    gateway keys and each SLO class's TTFT target in µs (for ``order: slo-deadline``)."""
    g = scenario.cluster.gateway
    cls = GatewayPolicy.lookup(g.policy, field="cluster.gateway.policy")
    params = cls.parse_params(g.params, field="cluster.gateway.params")
    slo = scenario.slo

    def us(ms):
        return None if ms is None else round_half_away(ms * 1000)

    budgets = {}
    if slo is not None:
        for name, t in sorted(slo.classes.items()):
            ms = t.ttft_ms if t.ttft_ms is not None else slo.ttft_ms
            budgets[name] = us(ms)
    fs = g.fair_share
    settings = GatewaySettings(
        order=g.order, shed=g.shed, detector=g.detector, max_concurrency=g.max_concurrency,
        queue_depth_threshold=g.queue_depth_threshold, kv_util_threshold=g.kv_util_threshold,
        fair_key=fs.key if fs is not None else "tenant", fair_share=fs is not None,
        weights=tuple(sorted(fs.weights.items())) if fs is not None else (),
        default_weight=fs.default_weight if fs is not None else 1.0,
        ttft_budget_us=tuple((k, v) for k, v in budgets.items() if v is not None),
        default_ttft_budget_us=us(slo.ttft_ms) if slo is not None else None)
    policy = cls(settings, params)
    policy.config_field = "cluster.gateway"
    return policy
def build_autoscale_policy(scenario: Scenario) -> AutoscalePolicy:
    """The scenario's autoscaling policy with its validated parameters
    (``cluster.autoscaler``, which must be set)."""
    a = scenario.cluster.autoscaler
    cls = AutoscalePolicy.lookup(a.policy, field="cluster.autoscaler.policy")
    params = cls.parse_params(a.params, field="cluster.autoscaler.params")
    return cls(params, interval_us=seconds_to_us(a.interval_s))
