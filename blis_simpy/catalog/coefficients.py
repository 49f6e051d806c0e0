"""The coefficient catalog: trained latency coefficients and per-model deployment defaults.

``catalog/data/coefficients.yaml`` (our format; BLIS's defaults.yaml figures) holds:

* ``defaults`` — per model, the GPU / TP / vLLM version used when the user gives none;
* ``blackbox`` — per model, rows keyed by (GPU, TP, vLLM version) with α/β and the measured
  KV block count; the first matching row wins (docs/latency-models.md, "Catalogs and resolution");
* ``crossmodel`` and ``trained_roofline`` — one global coefficient set each.

A BLIS ``defaults.yaml`` given with ``--defaults-filepath`` is read in memory by
:func:`read_blis_defaults` and layered over the built-in catalog (its entries win).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from functools import lru_cache

from blis_simpy.catalog.shipped import read_shipped
from blis_simpy.errors import ConfigError
from blis_simpy.yaml_input import load as load_yaml

VLLM_IMAGE_PREFIX = "vllm/vllm-openai:"


def normalize_vllm(version: str) -> str:
    """``vllm/vllm-openai:v0.8.4`` and ``v0.8.4`` are the same version."""
    v = (version or "").strip()
    return v[len(VLLM_IMAGE_PREFIX):] if v.startswith(VLLM_IMAGE_PREFIX) else v


@dataclass(frozen=True)
class DeploymentDefaults:
    gpu: str
    tp: int
    vllm: str


@dataclass(frozen=True)
class BlackboxRow:
    model: str
    gpu: str
    tp: int
    vllm: str
    kv_blocks: int
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    loss: float | None = None

    @property
    def key(self) -> str:
        return f"{self.gpu} TP{self.tp} {self.vllm}"

    def matches(self, gpu: str, tp: int, vllm: str) -> bool:
        return self.gpu == gpu and self.tp == tp and self.vllm == normalize_vllm(vllm)


@dataclass(frozen=True)
class CoefficientSet:
    alpha: tuple[float, ...]
    beta: tuple[float, ...]


@dataclass(frozen=True)
class CoefficientCatalog:
    defaults: Mapping[str, DeploymentDefaults] = dc_field(default_factory=dict)
    blackbox: Mapping[str, tuple[BlackboxRow, ...]] = dc_field(default_factory=dict)
    crossmodel: CoefficientSet | None = None
    trained_roofline: CoefficientSet | None = None
    origin: str = "built-in"

    def deployment_defaults(self, model: str) -> DeploymentDefaults | None:
        return self.defaults.get(model.lower())

    def rows(self, model: str) -> tuple[BlackboxRow, ...]:
        return self.blackbox.get(model.lower(), ())

    def find(self, model: str, gpu: str, tp: int, vllm: str) -> BlackboxRow | None:
        """The first row of ``model`` with this GPU, TP and vLLM version (BLIS's rule)."""
        return next((r for r in self.rows(model) if r.matches(gpu, tp, vllm)), None)

    def kv_blocks(self, model: str, gpu: str, tp: int, vllm: str) -> int | None:
        """The catalog KV block count of this deployment, if it has one (> 0)."""
        r = self.find(model, gpu, tp, vllm)
        return r.kv_blocks if r is not None and r.kv_blocks > 0 else None

    def available(self, model: str) -> str:
        """What exists for ``model``, for one-line error messages."""
        rows = self.rows(model)
        if rows:
            return f"available for {model}: " + ", ".join(r.key for r in rows)
        return (f"no blackbox coefficients exist for {model}; models with coefficients: "
                + ", ".join(self.blackbox))

    def blackbox_row(self, model: str, gpu: str, tp: int, vllm: str, *, field: str = "latency.model") -> BlackboxRow:
        """The blackbox coefficients of a deployment; missing or all-zero ⇒ one-line error."""
        r = self.find(model, gpu, tp, vllm)
        if r is None or (not any(r.alpha) and not any(r.beta)):
            raise ConfigError(
                f"No trained coefficients found for model={model}, GPU={gpu}, TP={tp}, "
                f"vllm-version={normalize_vllm(vllm) or '(none)'} ({self.available(model)}); "
                "pass --alpha-coeffs/--beta-coeffs or use --latency-model roofline", field=field)
        return r

    def layered_over(self, base: CoefficientCatalog) -> CoefficientCatalog:
        """This catalog's entries first, ``base`` for everything it does not have."""
        defaults = dict(base.defaults)
        defaults.update(self.defaults)
        blackbox = dict(base.blackbox)
        for model, rows in self.blackbox.items():
            blackbox[model] = tuple(rows) + tuple(base.blackbox.get(model, ()))
        return CoefficientCatalog(defaults, blackbox, self.crossmodel or base.crossmodel,
                                  self.trained_roofline or base.trained_roofline,
                                  f"{self.origin} over {base.origin}")


# ---------------------------------------------------------------------------- reading
def _floats(v, what: str, where: str) -> tuple[float, ...]:
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{what} must be a list of numbers, got {v!r}", field=where)
    return tuple(float(x) for x in v)


def _row(model: str, e: Mapping, where: str, *, blis: bool) -> BlackboxRow:
    k = ("GPU", "tensor_parallelism", "vllm_version", "total_kv_blocks", "alpha_coeffs", "beta_coeffs",
         "best_loss") if blis else ("gpu", "tp", "vllm", "kv_blocks", "alpha", "beta", "loss")
    try:
        tp, kv = int(e.get(k[1], 0)), int(e.get(k[3], 0))
    except (TypeError, ValueError):
        raise ConfigError(f"{model}: {k[1]} and {k[3]} must be integers", field=where) from None
    loss = e.get(k[6])
    return BlackboxRow(model.lower(), str(e.get(k[0], "")), tp, normalize_vllm(str(e.get(k[2], ""))), kv,
                       _floats(e.get(k[4], []), f"{model}: {k[4]}", where),
                       _floats(e.get(k[5], []), f"{model}: {k[5]}", where),
                       float(loss) if isinstance(loss, (int, float)) else None)


def _set(raw, where: str, *, blis: bool) -> CoefficientSet | None:
    if raw is None:
        return None
    a, b = ("alpha_coeffs", "beta_coeffs") if blis else ("alpha", "beta")
    return CoefficientSet(_floats(raw.get(a, []), a, where), _floats(raw.get(b, []), b, where))


@lru_cache(maxsize=1)
def builtin_coefficients() -> CoefficientCatalog:
    """The coefficients shipped with blis-simpy (``catalog/data/coefficients.yaml``)."""
    where = "catalog/data/coefficients.yaml"
    raw = read_shipped("coefficients.yaml")
    defaults = {m.lower(): DeploymentDefaults(str(d["gpu"]), int(d["tp"]), normalize_vllm(str(d["vllm"])))
                for m, d in raw["defaults"].items()}
    blackbox = {m.lower(): tuple(_row(m, e, where, blis=False) for e in rows)
                for m, rows in raw["blackbox"].items()}
    return CoefficientCatalog(defaults, blackbox, _set(raw["crossmodel"], where, blis=False),
                              _set(raw["trained_roofline"], where, blis=False))


BLIS_TOP_KEYS = {"defaults", "workloads", "models", "crossmodel_defaults", "trained_roofline_defaults",
                 "version"}


def read_blis_defaults(path: str, *, field: str = "defaults_filepath") -> CoefficientCatalog:
    """A BLIS ``defaults.yaml`` as a catalog, in memory (its ``workloads`` are not used)."""
    try:
        raw, _ = load_yaml(path)       # the capped reader: size, nesting, aliases
    except ConfigError as exc:
        if exc.problem == "no such file":
            raise ConfigError(f"no such file: {path}", field=field) from None
        raise ConfigError(exc.problem, file=exc.file, line=exc.line, field=exc.field or field) from None
    if not isinstance(raw, dict):
        raise ConfigError("expected a BLIS defaults.yaml mapping", file=path, field=field)
    unknown = sorted(set(raw) - BLIS_TOP_KEYS)
    if unknown:
        raise ConfigError(f"unknown top-level keys {unknown} (BLIS defaults.yaml is strict)", file=path,
                          field=field)
    defaults = {}
    for m, d in (raw.get("defaults") or {}).items():
        if not isinstance(d, dict):
            raise ConfigError(f"defaults.{m} must be a mapping", file=path, field=field)
        defaults[m.lower()] = DeploymentDefaults(str(d.get("GPU", "")), int(d.get("tensor_parallelism", 0)),
                                                 normalize_vllm(str(d.get("vllm_version", ""))))
    blackbox: dict[str, tuple[BlackboxRow, ...]] = {}
    for e in raw.get("models") or []:
        if not isinstance(e, dict) or "id" not in e:
            raise ConfigError("every models[] entry needs an id", file=path, field=field)
        r = _row(str(e["id"]), e, path, blis=True)
        blackbox[r.model] = blackbox.get(r.model, ()) + (r,)
    return CoefficientCatalog(defaults, blackbox, _set(raw.get("crossmodel_defaults"), path, blis=True),
                              _set(raw.get("trained_roofline_defaults"), path, blis=True), str(path))


__all__ = ["BlackboxRow", "CoefficientCatalog", "CoefficientSet", "DeploymentDefaults",
           "builtin_coefficients", "normalize_vllm", "read_blis_defaults"]
