"""Build the control plane's policies from a scenario (admission, routers, autoscaling)."""

from __future__ import annotations

from blis_simpy.admission.base import AdmissionPolicy
from blis_simpy.autoscaling import AutoscalePolicy
from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.rng import RngStreams
from blis_simpy.routing.base import Router


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


def build_autoscale_policy(scenario: Scenario) -> AutoscalePolicy:
    """The scenario's autoscaling policy with its validated parameters
    (``cluster.autoscaler``, which must be set)."""
    a = scenario.cluster.autoscaler
    cls = AutoscalePolicy.lookup(a.policy, field="cluster.autoscaler.policy")
    params = cls.parse_params(a.params, field="cluster.autoscaler.params")
    return cls(params, interval_us=round(a.interval_s * 1e6))
