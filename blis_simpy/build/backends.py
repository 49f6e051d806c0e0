"""The latency backends a deployment can be timed by, and how one is built (docs/latency-models.md).

The built-in backends are ``blackbox`` (alpha/beta coefficients) and the analytical ones,
which need a GPU, TP and the model's architecture; any other registered name is a plugin
:class:`~blis_simpy.latency.base.LatencyModel` built from its own ``latency.params``. Every
model times steps in integer µs. :func:`with_coefficient_set` applies a coefficient-set file
(``latency.coefficients``) to the latency config before the backend is built.
"""

from __future__ import annotations

from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.kv.sizing import KV_DTYPE_BYTES
from blis_simpy.latency.base import LatencyModel
from blis_simpy.latency.coefficient_sets import PhysicsCoefficients, read_set
from blis_simpy.plugins import build_failure

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


def with_coefficient_set(cfg, backend: str):
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
