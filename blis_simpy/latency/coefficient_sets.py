"""Coefficient-set files: one YAML file of coefficients for one latency backend.

A set is what ``blis-simpy fit`` writes and what ``--coefficients FILE`` (scenario key
``latency.coefficients``) loads. Two shapes, told apart by the ``backend`` key:

* ``backend: physics`` (the default when the key is absent): the multipliers and fixed
  costs of :class:`PhysicsCoefficients` (docs/latency-models.md, "physics").
* ``backend: blackbox | trained-physics | roofline | trained-roofline | crossmodel``:
  ``alpha_coeffs`` and ``beta_coeffs`` in that backend's layout (the same lists as the
  scenario keys ``latency.alpha_coeffs`` / ``latency.beta_coeffs``).

Both carry ``name``, ``description``, ``gpu`` (the GPU the set was fitted on, catalog
key) and ``fit`` (free-form provenance: the command, the traces, in-sample and
cross-validated error). Built-in physics sets live in ``catalog/data/physics/<GPU>.yaml``
and ``default.yaml``; ``latency.coefficients: default`` names the physical default set.
Pure code: no SimPy.
"""

from __future__ import annotations

import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from blis_simpy.atomic import atomic_write
from blis_simpy.errors import ConfigError, validation_problem
from blis_simpy.infile import read_input_text
from blis_simpy.latency.frontend import FrontendParams
from blis_simpy.yaml_input import parse as parse_yaml

_Mult = Field(1.0, ge=0, le=1000, allow_inf_nan=False)
_Cost = Field(0.0, ge=0, le=1e9, allow_inf_nan=False)
FIELD = "latency.coefficients"
#: backends whose coefficients are alpha/beta lists
ALPHA_BETA_BACKENDS = ("blackbox", "trained-physics", "roofline", "trained-roofline", "crossmodel")
MAX_SET_BYTES = 1 << 20          # a coefficient set is a few hundred bytes; refuse > 1 MiB
MAX_COEFFS = 64


class _Set(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    description: str = ""
    gpu: str = ""
    fit: dict[str, Any] | None = None


class PhysicsCoefficients(_Set):
    """One coefficient set of the ``physics`` backend (see catalog/data/physics/default.yaml).

    Multipliers are dimensionless (1 = the catalog GPU's peak rate); ``*_us`` are µs."""

    backend: Literal["physics"] = "physics"
    prefill_compute: float = _Mult
    decode_compute: float = _Mult
    attention_compute: float = _Mult
    weight_reads: float = _Mult
    prefill_memory: float = _Mult
    decode_kv_reads: float = _Mult
    moe_compute: float = _Mult
    moe_expert_reads: float = _Mult
    tp_allreduce: float = _Mult
    ep_dispatch_combine: float = _Mult
    sampling: float = _Mult
    elementwise: float = _Mult
    layer_launch_us: float = _Cost
    request_cpu_us: float = _Cost
    step_cpu_us: float = _Cost
    queueing_us: float = _Cost
    queueing_per_input_token_us: float = _Cost
    output_token_us: float = _Cost
    post_decode_us: float = _Cost
    #: the API server in front of the instance (docs/frontend.md): all 0 = none
    frontend: FrontendParams = FrontendParams()


class AlphaBetaSet(_Set):
    """A set for a backend timed by alpha/beta lists (µs-based, each ≥ 0)."""

    backend: Literal["blackbox", "trained-physics", "roofline", "trained-roofline", "crossmodel"]
    alpha_coeffs: list[float] = Field(..., max_length=MAX_COEFFS)
    beta_coeffs: list[float] = Field(..., max_length=MAX_COEFFS)

    def model_post_init(self, _ctx) -> None:
        for key in ("alpha_coeffs", "beta_coeffs"):
            for i, v in enumerate(getattr(self, key)):
                if not (v >= 0 and v < float("inf")):
                    raise ValueError(f"{key}[{i}] must be finite and >= 0, got {v}")


CoefficientSet = PhysicsCoefficients | AlphaBetaSet


def parse_set(text: str, where: str) -> CoefficientSet:
    """Validate the YAML ``text`` of a set; errors name ``where``, the line and the key."""
    raw, _ = parse_yaml(text, where)      # the capped reader: size, nesting, aliases
    if not isinstance(raw, dict):
        raise ConfigError("a coefficient set must be a mapping of key: value", file=where)
    backend = raw.get("backend", "physics")
    cls = AlphaBetaSet if backend in ALPHA_BETA_BACKENDS else PhysicsCoefficients
    try:
        return cls(**raw)
    except (ValidationError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            e = exc.errors(include_url=False)[0]
            loc, msg = ".".join(str(p) for p in e["loc"]), validation_problem(e, cls)
        else:
            loc, msg = "", str(exc)
        raise ConfigError(msg, file=where, line=_key_line(text, loc.split(".")[0]),
                          field=loc or None) from None


def _key_line(text: str, key: str) -> int | None:
    if not key:
        return None
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith(f"{key}:"):
            return n
    return None


@lru_cache(maxsize=32)
def builtin_set(stem: str) -> PhysicsCoefficients | None:
    """The built-in physics set ``catalog/data/physics/<stem>.yaml``, or None."""
    res = resources.files("blis_simpy.catalog").joinpath(f"data/physics/{stem}.yaml")
    if not res.is_file():
        return None
    got = parse_set(res.read_text("utf-8"), f"catalog/data/physics/{stem}.yaml")
    assert isinstance(got, PhysicsCoefficients)
    return got


def read_set(path: str) -> CoefficientSet:
    """Read a set file (``default`` = the built-in physical default set)."""
    if path == "default":
        return builtin_set("default")
    p = Path(path)
    try:
        if p.stat().st_size > MAX_SET_BYTES:
            raise ConfigError(f"larger than {MAX_SET_BYTES} bytes: not a coefficient set", file=path,
                              field=FIELD)
        text = read_input_text(p)
    except FileNotFoundError:
        raise ConfigError("no such file", file=path, field=FIELD) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a coefficient set file", file=path, field=FIELD) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=path, field=FIELD) from None
    return parse_set(text, path)


def load_physics_set(gpu: str = "", path: str = "") -> tuple[PhysicsCoefficients, str]:
    """The physics set for ``gpu``: ``path`` if given (``default`` = the built-in default
    set), else the built-in set named after the GPU, else the built-in default. Returns the
    set and where it came from."""
    if path:
        got = read_set(path)
        if not isinstance(got, PhysicsCoefficients):
            raise ConfigError(f"a {got.backend} coefficient set, not a physics one", file=path, field=FIELD)
        return got, ("built-in set default" if path == "default" else path)
    if gpu:
        got = builtin_set(gpu)
        if got is not None:
            return got, f"built-in set {gpu}"
    return builtin_set("default"), "built-in set default"


def _yaml_value(v) -> str:
    return yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=10_000).strip().removesuffix("...").strip()


def render_set(cs: CoefficientSet, comment: str = "") -> str:
    """The YAML text of a set: ``comment`` lines first (``# ``-prefixed), then the keys in
    declaration order; floats in shortest round-trip form."""
    lines = [f"# {c}".rstrip() for c in comment.splitlines()] if comment else []
    data = cs.model_dump()
    order = ["backend", "name", "description", "gpu"] + [k for k in data
                                                        if k not in ("backend", "name", "description", "gpu", "fit")]
    for k in order:
        lines.append(f"{k}: {_yaml_value(data[k])}")
    if data.get("fit"):
        lines.append(yaml.safe_dump({"fit": data["fit"]}, sort_keys=False, width=10_000).rstrip())
    return "\n".join(lines) + "\n"


def write_set(path: str | os.PathLike, cs: CoefficientSet, comment: str = "", *,
              field: str | None = None) -> None:
    """Write a set all-or-nothing (:mod:`blis_simpy.atomic`); re-reads it to check first.
    Errors name ``path`` and ``field`` (the flag that named it)."""
    final = Path(path)
    text = render_set(cs, comment)
    parse_set(text, str(final))           # what we write must load
    with atomic_write(final, field=field, what="cannot write", binary=False) as f:
        f.write(text)
