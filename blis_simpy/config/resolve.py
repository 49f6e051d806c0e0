"""Resolve a scenario into what the simulator builds: latency models, KV sizes, context caps.

A :class:`~blis_simpy.config.scenario.Scenario` says what the user asked for; some values
are left to defaults and catalogs (spec/09 §3, spec/04 §7). :func:`resolve` turns it into a
:class:`Deployment`: a factory for each instance's latency model and KV cache, plus the
final KV block count and MaxModelLen. :class:`~blis_simpy.cluster.simulation.Simulation`
only ever sees a Deployment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.kv.cache import KVCache
from blis_simpy.latency.base import LatencyModel

DEFAULT_TOTAL_KV_BLOCKS = 1_000_000


@dataclass
class Deployment:
    """Everything resolved about the instances of one scenario."""

    total_kv_blocks: int
    block_size: int
    max_model_len: int
    latency_factory: Callable[[], LatencyModel]
    kv_factory: Callable[[int, int], KVCache] = KVCache
    notes: list[str] = field(default_factory=list)   # what was resolved from where

    def new_latency_model(self) -> LatencyModel:
        return self.latency_factory()

    def new_kv_cache(self) -> KVCache:
        return self.kv_factory(self.total_kv_blocks, self.block_size)


def build_latency_model(scenario: Scenario) -> LatencyModel:
    """Instantiate the scenario's latency backend from explicit coefficients."""
    cfg = scenario.latency
    cls = LatencyModel.lookup(cfg.model, field="latency.model")
    if cfg.model == "blackbox":
        if cfg.alpha_coeffs is None or cfg.beta_coeffs is None:
            raise ConfigError("blackbox needs both alpha_coeffs and beta_coeffs",
                              field="latency.alpha_coeffs")
        if not any(cfg.alpha_coeffs) and not any(cfg.beta_coeffs):
            raise ConfigError("No trained coefficients found: alpha and beta are all zero",
                              field="latency.beta_coeffs")
        try:
            return cls(cfg.alpha_coeffs, cfg.beta_coeffs)
        except ValueError as exc:
            raise ConfigError(str(exc), field="latency") from None
    raise ConfigError(f"latency model {cfg.model!r} is not available yet", field="latency.model")


def resolve(scenario: Scenario) -> Deployment:
    """Resolve defaults for ``scenario`` (explicit values always win)."""
    eng = scenario.engine
    build_latency_model(scenario)            # validate now: errors before anything runs
    return Deployment(
        total_kv_blocks=eng.total_kv_blocks or DEFAULT_TOTAL_KV_BLOCKS,
        block_size=eng.block_size,
        max_model_len=eng.max_model_len,
        latency_factory=lambda: build_latency_model(scenario))
