"""BLIS's ``convert`` kinds that print a workload-spec v2 (docs/workloads.md,
"Converting").

* :func:`preset_workload` — a preset as a one-client spec (client ``preset-<name>``, constant
  arrivals, Gaussian lengths); presets from a BLIS ``defaults.yaml`` ``workloads:`` section
  when one is given, else the built-in ones;
* :func:`servegen_workload` — one client per usable ServeGen chunk;
* :func:`inference_perf_workload` — the ``N × M`` clients of an inference-perf section.

:func:`spec_to_yaml` prints a spec: keys in the order docs/workloads.md lists them, unset and default
values left out, integer-valued token counts of empirical PMFs as integer keys. The text
reads back (``--workload-spec``) as the same spec.
"""

from __future__ import annotations

import os

import yaml
from pydantic import ValidationError

from blis_simpy.errors import ConfigError
from blis_simpy.workload import _yaml
from blis_simpy.workload.distribution import PRESETS, LengthParams, Preset, preset_spec
from blis_simpy.workload.expand import expand_inference_perf, load_servegen, stage_durations_us
from blis_simpy.workload.spec import (
    InferencePerfSpec,
    ServeGenDataSpec,
    WorkloadSpecV2,
    parse_workload_spec,
)

DEFAULT_SEED = 42
_PRESET_KEYS = ("prefix_tokens", "prompt_tokens", "prompt_tokens_stdev", "prompt_tokens_min",
                "prompt_tokens_max", "output_tokens", "output_tokens_stdev", "output_tokens_min",
                "output_tokens_max")


def _int_keys(params: dict) -> dict:
    out = {}
    for k, v in params.items():
        try:
            f = float(k)
            out[int(f) if f.is_integer() and "." not in k and "e" not in k.lower() else k] = v
        except ValueError:
            out[k] = v
    return out


def spec_to_yaml(spec: WorkloadSpecV2) -> str:
    """The spec as YAML (module docstring)."""
    data = spec.model_dump(exclude_defaults=True, exclude_none=True)
    data = {"version": spec.version or "2", **{k: v for k, v in data.items() if k != "version"}}
    for c in data.get("clients", []):
        for key in ("input_distribution", "output_distribution"):
            d = c.get(key)
            if not d:
                continue
            if d.get("type") == "empirical":
                d["params"] = _int_keys(d["params"])
            else:                               # 256.0 -> 256 (reads back as the same float)
                d["params"] = {k: int(v) if float(v).is_integer() else v for k, v in d["params"].items()}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True,
                          width=10_000)


def _lengths(vals: dict, w: str) -> LengthParams:
    return LengthParams(vals[f"{w}_tokens"], vals[f"{w}_tokens_stdev"], vals[f"{w}_tokens_min"],
                        vals[f"{w}_tokens_max"])


def _defaults_preset(path: str, name: str) -> Preset:
    """Preset ``name`` of a BLIS defaults.yaml ``workloads:`` section (errors name file,
    line and key; absent keys are 0, as Go leaves them)."""
    data, node = _yaml.load_yaml(path)
    section = data.get("workloads") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise ConfigError("no workloads: section", file=path, line=1, field="workloads")
    if name not in section:
        raise ConfigError(f"unknown preset {name!r} (valid: {', '.join(map(str, section))})",
                          file=path, field="--name")
    p = section[name]
    loc = ("workloads", name)
    if not isinstance(p, dict):
        raise ConfigError("must be a mapping", file=path, line=_yaml.line_of(node, loc),
                          field=f"workloads.{name}")
    vals = {}
    for k in _PRESET_KEYS:
        v = p.get(k, 0)
        if type(v) is not int or v < 0:
            raise ConfigError(f"must be an integer >= 0, got {v!r}", file=path,
                              line=_yaml.line_of(node, (*loc, k)) or _yaml.line_of(node, loc),
                              field=f"workloads.{name}.{k}")
        vals[k] = v
    return Preset(vals["prefix_tokens"], _lengths(vals, "prompt"), _lengths(vals, "output"))


def preset_workload(name: str, rate: float = 1.0, num_requests: int = 100,
                    defaults_filepath: str = "", seed: int = DEFAULT_SEED) -> WorkloadSpecV2:
    """``convert preset``: the preset as a spec with client ``preset-<name>``; ``rate`` in
    req/s. Presets come from ``defaults_filepath``'s ``workloads:`` when given."""
    if defaults_filepath:
        table = {name: _defaults_preset(defaults_filepath, name)}
    else:
        table = PRESETS
        if name not in table:
            raise ConfigError(f"unknown preset {name!r} (valid: {', '.join(table)})", field="--name")
    return preset_spec(name, rate, num_requests, seed, client_id=f"preset-{name}", presets=table)


def servegen_workload(path: str, seed: int = DEFAULT_SEED) -> WorkloadSpecV2:
    """``convert servegen``: one client per usable chunk of the directory ``path``; the
    aggregate rate is the sum of the chunks' rates (each client's ``rate_fraction`` is its
    chunk's rate in req/s, so the spec generates the ServeGen rates)."""
    if not os.path.isdir(path):
        raise ConfigError("no such directory", file=path, field="--path")
    spec = WorkloadSpecV2(version="2", seed=seed, category="language",
                          servegen_data=ServeGenDataSpec(path=path))
    out = load_servegen(spec)
    total = sum(c.rate_fraction for c in out.clients)
    return out.model_copy(update={"aggregate_rate": total})


def inference_perf_workload(path: str) -> WorkloadSpecV2:
    """``convert inference-perf``: ``path`` holds either an inference-perf section (``stages``
    and ``shared_prefix`` at the top) or a whole v2 spec with an ``inference_perf:`` section;
    the result is the expanded spec (its seed, or 42 for a bare section) with ``horizon`` =
    the stages' total duration (µs) unless the spec sets ``horizon`` or ``num_requests``,
    so the output runs as it is (no ``--horizon``)."""
    data, node = _yaml.load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping with stages and shared_prefix, or a v2 spec with an "
                          "inference_perf section", file=path, line=1)
    if "inference_perf" in data:
        spec = parse_workload_spec(data, path, node)
    else:
        try:
            ip = InferencePerfSpec.model_validate(data)
        except ValidationError as e:
            raise _yaml.from_validation_error(e, path, node, InferencePerfSpec) from None
        spec = WorkloadSpecV2(version="2", seed=DEFAULT_SEED, category="language", inference_perf=ip)
    out = expand_inference_perf(spec)
    if out.horizon == 0 and out.num_requests == 0:
        out = out.model_copy(update={"horizon": sum(stage_durations_us(spec.inference_perf))})
    return out
