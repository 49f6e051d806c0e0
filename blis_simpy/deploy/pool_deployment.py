"""One PD pool's deployment: the global one with the pool's overrides (docs/disaggregation.md,
"Per-pool overrides"; divergences.md P5).

:func:`resolve_pool_deployment` is called by :func:`~blis_simpy.deploy.pools.resolve_pools`
for the prefill and the decode pool; it reuses the steps of the global resolution
(:mod:`blis_simpy.deploy.resolve`) on a deep copy of the scenario.
"""

from __future__ import annotations

from functools import partial

from blis_simpy.catalog.coefficients import CoefficientCatalog
from blis_simpy.catalog.hardware import GPUCatalog
from blis_simpy.catalog.hfconfig import derive_max_model_len
from blis_simpy.config.scenario import PoolOverrides, Scenario
from blis_simpy.deploy.backends import ANALYTICAL, backend_options, build_backend, is_analytical
from blis_simpy.deploy.kv_capacity import auto_kv_capacity
from blis_simpy.deploy.lookups import Lookups, blackbox_coefficients, global_coefficients
from blis_simpy.deploy.resolve import Deployment
from blis_simpy.errors import ConfigError
from blis_simpy.latency.base import LatencyModel

#: the pool keys that override the global deployment
OVERRIDE_FIELDS = ("tp", "hardware", "latency_model", "max_model_len", "total_kv_blocks")


def resolve_pool_deployment(s: Scenario, glob: Deployment, ov: PoolOverrides, role: str, checkout: bool,
                     quiet: bool, cat: CoefficientCatalog, gpus: GPUCatalog) -> Deployment:
    """One pool's deployment: the global one with the pool's overrides.

    The overrides go into a deep copy of the scenario (INV-P2-1). TP, latency backend and
    MaxModelLen replace the global values. GPU: the pool's hardware calibration drives its
    latency model (divergences.md P5); under compat ``checkout`` only the label and the KV
    auto-calculation change. KV blocks: the pool's ``total_kv_blocks``, else — analytical
    backends whose TP or GPU differs from the global one — the auto-calculation by the
    scenario's ``engine.kv_capacity_model`` with the pool's TP and GPU; the pool's MaxModelLen
    (if not given) is then lowered to ``pool_blocks × block_size`` when that is below the global
    one. A model that does not fit the pool is a ConfigError on the pool's key, under both
    capacity models (kv-capacity.md).
    """
    given = {k: getattr(ov, k) for k in OVERRIDE_FIELDS if getattr(ov, k) is not None}
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
    r = Lookups(ps, quiet, prefix=f"{role} pool: ")
    for k, v in given.items():
        r.note(f"{k} {v}: pool override")
    eng = ps.engine
    backend = ps.latency.model or "physics"
    lat_cls = LatencyModel.lookup(backend, field=f"{key}.latency_model")
    analytical = is_analytical(backend)
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

    # which hardware calibration times this pool's steps (docs/divergences.md P5)
    lat_gpu = gpu
    if checkout and analytical and glob.gpu is not None and hw != glob.hardware:
        lat_gpu = glob.gpu
        r.note(f"latency model keeps the global hardware calibration {glob.gpu.name} (compat checkout)")

    alpha, beta = _pool_coefficients(r, cat, backend, glob, hw, tp, checkout, changed, key)

    # KV blocks and MaxModelLen
    total, max_len = glob.total_kv_blocks, glob.max_model_len
    kv_cap, kv_source = glob.kv_capacity, glob.kv_source
    if analytical and glob.backend not in ANALYTICAL and eng.max_model_len == 0 and max_len == 0:
        max_len = derive_max_model_len(model_cfg)
    if ov.total_kv_blocks is not None:
        total, kv_cap, kv_source = ov.total_kv_blocks, None, "explicit"
    elif analytical and changed:
        cap = auto_kv_capacity(r, model_cfg, gpu, tp, field=f"{key}.{'hardware' if ov.hardware else 'tp'}",
                               what=f" for {tp} x {gpu.name}")
        total, kv_cap, kv_source = cap.blocks, cap, r.kv_source
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

    # the scenario's latency.params belong to the global backend; another one gets its defaults
    params = lat_cls.parse_params(s.latency.params if backend == glob.backend else None,
                                  field="latency.params")
    build = partial(build_backend, backend, model_cfg, lat_gpu, tp, alpha, beta, s.latency.compat,
                    backend_options(s), params)
    try:
        build()
    except ConfigError as exc:
        culprit = next((k for k in ("latency_model", "hardware", "tp") if k in given), None)
        raise ConfigError(exc.problem, field=f"{key}.{culprit}" if culprit else key) from None
    return Deployment(total_kv_blocks=total, block_size=bs, max_model_len=max_len, latency_factory=build,
                      kv_factory=glob.kv_factory, notes=r.notes, backend=backend, hardware=hw, tp=tp,
                      vllm_version=glob.vllm_version, gpu=lat_gpu, model_config=model_cfg,
                      warnings=r.warnings, alpha=alpha, beta=beta, kv_capacity=kv_cap,
                      kv_source=kv_source)


def _pool_coefficients(r: Lookups, cat: CoefficientCatalog, backend: str, glob: Deployment,
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
            return blackbox_coefficients(r, cat, hw, tp, glob.vllm_version)
        if backend in ("crossmodel", "trained-roofline"):
            return global_coefficients(r, cat, backend)
    except ConfigError as exc:
        raise ConfigError(exc.problem, field=f"{key}.latency_model") from None
    return None, None
