"""The latency backends a deployment can be timed by, and how one is built (docs/latency-models.md).

The built-in backends are ``blackbox`` (alpha/beta coefficients) and the analytical ones,
which need a GPU, TP and the model's architecture; any other registered name is a plugin
:class:`~blis_simpy.latency.base.LatencyModel` built from its own ``latency.params``. Every
model times steps in integer µs. :func:`with_coefficient_set` applies a coefficient-set file
(``latency.coefficients``) to the latency config before the backend is built.
"""

from __future__ import annotations

import numbers
from dataclasses import replace

from blis_simpy.config.scenario import Scenario
from blis_simpy.engine.limits import MAX_STEP_US
from blis_simpy.errors import ConfigError
from blis_simpy.kv.sizing import KV_DTYPE_BYTES
from blis_simpy.latency.base import LatencyModel
from blis_simpy.latency.blackbox import BlackboxModel
from blis_simpy.latency.coefficient_sets import PhysicsCoefficients, read_set
from blis_simpy.plugins import build_failure, checked_results
from blis_simpy.request_view import as_view, hand_views

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
    """Deployment facts the parallelism-aware backends take (ignored by BLIS's backends),
    and the engine's batch limits (``step_limits``) that bound the longest step."""
    return {"dp": s.dp, "expert_parallel": s.enable_expert_parallel,
            "coefficients": s.latency.coefficients,
            "kv_bytes_per_element": KV_DTYPE_BYTES.get(s.engine.kv_cache_dtype) or 0.0,
            "step_limits": (s.engine.max_num_scheduled_tokens, s.engine.max_num_running_reqs)}


def check_step_cap(model: LatencyModel, step_limits: tuple[int, int] | None) -> LatencyModel:
    """Refuse a model whose per-token overheads, or (blackbox) longest possible step under
    ``step_limits`` = (max scheduled tokens, max running requests), exceed
    :data:`~blis_simpy.engine.limits.MAX_STEP_US` (docs/scenarios.md, "Limits"); returns it."""
    for what, us, fld in (("per-output-token overhead", model.output_token_time_us(), "alpha_coeffs"),
                          ("post-decode overhead", model.post_decode_us(), "alpha_coeffs")):
        if us > MAX_STEP_US:
            raise ConfigError(f"the {what} is {us} us, more than the {MAX_STEP_US} us (one hour) "
                              "an engine step may last", field=f"latency.{fld}")
    if isinstance(model, BlackboxModel) and step_limits is not None:
        tokens, reqs = step_limits
        worst = model.longest_step_us(tokens, reqs)
        if worst > MAX_STEP_US:
            raise ConfigError(f"the longest step these coefficients can time is {worst:.6g} us "
                              f"(beta0 + beta1 x prefill + beta2 x decode tokens, at most {tokens} "
                              f"tokens and {reqs} requests a step), more than the {MAX_STEP_US} us "
                              "(one hour) an engine step may last", field="latency.beta_coeffs")
    return model


def check_heads_split(model_cfg, tp: int, *, field: str = "tp") -> None:
    """vLLM's topology rule: TP must divide the model's attention heads (a TP of 128 on a
    40-head model is no deployment); a :class:`ConfigError` on ``field`` otherwise."""
    heads = getattr(model_cfg, "num_heads", 0) or 0
    if heads > 0 and tp > 0 and heads % tp:
        raise ConfigError(f"{model_cfg.name or 'the model'} has {heads} attention heads: TP {tp} does "
                          "not divide them (vLLM needs it to)", field=field)


def build_backend(backend: str, model_cfg, gpu, tp, alpha, beta, compat: str,
                  extra: dict | None = None, params=None) -> LatencyModel:
    """Build one latency model; ``extra`` (:func:`backend_options`) goes to ``physics`` and
    ``trained-physics`` only. A plugin (a name outside :data:`BUILTIN_BACKENDS`) is built by
    its :meth:`~blis_simpy.latency.base.LatencyModel.build` from its validated ``params``;
    anything its constructor raises is reported as that plugin's error."""
    extra = dict(extra or {})
    step_limits = extra.pop("step_limits", None)
    model = _build(backend, model_cfg, gpu, tp, alpha, beta, compat, extra, params)
    if backend in BUILTIN_BACKENDS:
        return check_step_cap(model, step_limits)
    model = checked_results(model, dict.fromkeys(_TIMES_US, whole_us), field="latency.model")
    hand_views(model, ("queueing_time_us",))
    return _prefill_views(model)


def _prefill_views(model: LatencyModel) -> LatencyModel:
    """A plugin ``model`` whose ``step_time_us`` (set on the object) sees the batch's
    prefill requests through their read-only views (:mod:`blis_simpy.request_view`)."""
    step = model.step_time_us

    def step_time_us(batch):
        if batch.prefill:
            batch = replace(batch, prefill=[as_view(r) for r in batch.prefill])
        return step(batch)

    model.step_time_us = step_time_us
    return model


#: the methods of a latency model that return a duration in µs (checked for a plugin model)
_TIMES_US = ("step_time_us", "lockstep_step_time_us", "queueing_time_us", "output_token_time_us",
             "post_decode_us")


def whole_us(value) -> int:
    """A plugin latency model's duration as an int (µs from 0 to one hour,
    :data:`MAX_STEP_US`; a NumPy integer is taken); a ValueError saying what was expected
    otherwise (a float, NaN, a negative number, None, a duration past any run: a queueing
    time of 2^80 µs would silently keep its request from ever arriving)."""
    if (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and 0 <= value <= MAX_STEP_US):
        return int(value)
    raise ValueError(f"a whole number of microseconds from 0 to {MAX_STEP_US} (one hour; an int)")


def _build(backend: str, model_cfg, gpu, tp, alpha, beta, compat: str, extra: dict,
           params) -> LatencyModel:
    cls = LatencyModel.lookup(backend, field="latency.model")
    if backend not in BUILTIN_BACKENDS:
        try:
            return cls.build(params if params is not None else cls.Params(), model_config=model_cfg,
                             gpu=gpu, tp=max(int(tp or 0), 1))
        except ConfigError:
            raise
        except Exception as exc:
            raise build_failure(cls, exc, field="latency.model") from None
    if backend in ANALYTICAL:
        check_heads_split(model_cfg, int(tp or 0))
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
