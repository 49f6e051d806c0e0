"""Sweep points and their config hashes.

A point is ``{"command": "run" | "replay", "scenario": <scenario dict>}`` plus, for a sweep,
its ``seed``, its axis values and its hashes. The **config hash** identifies what a point
runs: the SHA-256 of the canonical JSON (sorted keys, no spaces) of the command and the
*resolved* scenario — the validated scenario with every key left at its default dropped, so
``rate: 10`` and ``rate: 10.0`` (or a key written at its default value) hash the same. The
seed is part of the scenario, so each seed of a configuration is its own point; the
**config key** is the same hash with the seed left out (the points that differ only by
seed, averaged by :func:`blis_simpy.planner.dataset.summarize`).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blis_simpy.config.loader import Source, load_raw, resolve_paths, set_dotted, undotted, validate
from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError, did_you_mean, known_keys
from blis_simpy.planner.sweep_file import SweepSpec, axis_values, base_path, load_sweep
from blis_simpy.units import MAX_INT64


def canonical_json(obj) -> str:
    """Sorted keys, no spaces, no NaN: the same object always gives the same text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True)


#: the latency backend a resolved scenario leaves out: the scenario default when sweep hashes
#: were defined. The default is physics now; hashing it as a default would give a physics
#: point the hash of a blackbox point of an earlier dataset (resumed as done, wrong numbers)
HASHED_DEFAULT_BACKEND = "blackbox"


def resolved(scenario) -> dict:
    """The resolved form of a scenario (a :class:`~blis_simpy.config.scenario.Scenario` or a
    raw dict, validated here without the cross-key checks): keys at their default dropped,
    except ``latency.model``, which is dropped when it is :data:`HASHED_DEFAULT_BACKEND`."""
    if isinstance(scenario, dict):
        scenario = validate(scenario, Source(None), semantic=False)
    cfg = scenario.model_dump(mode="json", exclude_defaults=True)
    lat = {k: v for k, v in cfg.get("latency", {}).items() if k != "model"}
    if scenario.latency.model != HASHED_DEFAULT_BACKEND:
        lat = {"model": scenario.latency.model, **lat}
    if lat:
        cfg["latency"] = lat
    else:
        cfg.pop("latency", None)
    return cfg


def _sha(obj) -> str:
    return hashlib.sha256(canonical_json(obj).encode("ascii")).hexdigest()


def config_hash(command: str, resolved_scenario: dict) -> str:
    """SHA-256 (hex) of the command and the resolved scenario, seed included."""
    return _sha({"command": command, "scenario": resolved_scenario})


def config_key(command: str, resolved_scenario: dict) -> str:
    """:func:`config_hash` without the seed: the same for every seed of one configuration."""
    return _sha({"command": command,
                 "scenario": {k: v for k, v in resolved_scenario.items() if k != "seed"}})


# ---------------------------------------------------------------------------- expansion
@dataclass
class Point:
    """One run of a sweep: a configuration (axis values) and a seed."""

    index: int
    command: str
    seed: int
    axes: dict[str, Any]        # axis key -> value of this point
    scenario: dict              # the raw scenario data (base + slo + axes + seed)
    config: dict                # the resolved scenario (:func:`resolved`)
    config_hash: str
    config_key: str

    plugin_dirs: tuple[str, ...] = ()     # folders searched first for its plugin modules

    def job(self) -> dict:
        """What :func:`blis_simpy.run.point.run_point` takes."""
        return {"command": self.command, "scenario": self.scenario, "config_hash": self.config_hash,
                "plugin_dirs": list(self.plugin_dirs)}


@dataclass
class Sweep:
    """A sweep file, its base scenario and its points."""

    path: str
    spec: SweepSpec
    src: Source
    base: dict
    base_src: Source | None        # the base scenario file's lines (None: inline base)
    combos: list[dict[str, Any]] = field(default_factory=list)   # axis values per configuration
    seeds: list[int | None] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)

    @property
    def plugin_dirs(self) -> tuple[str, ...]:
        """Where a point's plugin modules are looked up first, as ``run`` looks beside its
        scenario: the base scenario's folder, then the sweep file's (axes, inline base)."""
        here = os.path.dirname(self.path)
        base = os.path.dirname(os.path.abspath(self.base_src.path)) if self.base_src else here
        return tuple(dict.fromkeys((base, here)))


def load(path: str) -> Sweep:
    """Read a sweep file and its base scenario; expand its configurations and seeds (the
    points come from :func:`expand`)."""
    spec, src = load_sweep(path)
    bpath = base_path(spec, path)
    if bpath is not None:
        try:
            base, bsrc = load_raw(bpath)
        except ConfigError as exc:
            if exc.file == bpath and exc.problem == "no such file":
                raise src.error(f"no such scenario file: {bpath}", ("base",)) from None
            raise
    else:
        base, bsrc = copy.deepcopy(spec.base), None
        w = base.get("workload")
        if isinstance(w, dict) and "kind" not in w:
            w["kind"] = "distribution"
        resolve_paths(base, os.path.dirname(os.path.abspath(path)))
    if base.get("variants"):
        raise src.error("a sweep's base cannot have variants: make what they change an axis", ("base",))
    sweep = Sweep(os.path.abspath(path), spec, src, base, bsrc)
    values = {k: axis_values(a) for k, a in spec.axes.items()}
    if spec.mode == "list":
        n = len(next(iter(values.values()))) if values else 1
        sweep.combos = [{k: v[i] for k, v in values.items()} for i in range(n)]
    else:
        sweep.combos = [dict(zip(values, c, strict=True)) for c in itertools.product(*values.values())]
    base_seed = base.get("seed", 42)
    if spec.repeats is not None and type(base_seed) is not int:     # repeats count up from it
        raise locate(sweep, {}, ConfigError(f"input should be a valid integer, got {base_seed!r}",
                                            field="seed"))
    if spec.repeats is not None and base_seed + spec.repeats - 1 > MAX_INT64:
        raise src.error(f"the last seed, base seed {base_seed} + {spec.repeats - 1}, is out of the "
                        "int64 range", ("repeats",))
    if spec.seeds is not None:
        sweep.seeds = list(spec.seeds)
    elif spec.repeats is not None:
        sweep.seeds = [base_seed + i for i in range(spec.repeats)]
    else:
        sweep.seeds = [None]    # the base scenario's own seed
    return sweep


def scenario_for(sweep: Sweep, combo: dict, seed: int | None) -> dict:
    """The raw scenario of one point: base, then ``slo:``, then the axis values, then the seed."""
    data = copy.deepcopy(sweep.base)
    if sweep.spec.slo is not None:
        data["slo"] = copy.deepcopy(sweep.spec.slo)
    for key, value in combo.items():
        if not set_dotted(data, key, copy.deepcopy(value)):
            raise _axis_error(sweep, key, value, "a parent of this key is not a mapping in the scenario")
    w = data.get("workload")
    if isinstance(w, dict) and "kind" not in w:
        w["kind"] = "distribution"
    resolve_paths(data, os.path.dirname(sweep.path))   # relative paths given by axes or slo
    if seed is not None:
        data["seed"] = seed
    return data


def expand(sweep: Sweep, check: Callable[[dict], None] | None = None) -> list[Point]:
    """Every point of the sweep, validated before any runs. ``check(job)`` validates one
    configuration as the runner would (:func:`blis_simpy.run.point.check_point`); its first
    error is re-located on the axis (or base key) that caused it."""
    points: list[Point] = []
    command = sweep.spec.command
    for combo in sweep.combos:
        for j, seed in enumerate(sweep.seeds):
            data = scenario_for(sweep, combo, seed)
            try:
                if j == 0 and check is not None:   # the seed changes nothing that is checked
                    check({"command": command, "scenario": data, "plugin_dirs": sweep.plugin_dirs})
                cfg = resolved(data)
            except ConfigError as exc:
                raise locate(sweep, combo, exc) from None
            s = cfg.get("seed", 42)
            points.append(Point(len(points), command, s, dict(combo), data, cfg,
                                config_hash(command, cfg), config_key(command, cfg),
                                sweep.plugin_dirs))
    sweep.points = points
    return points


def _axis_loc(sweep: Sweep, key: str, value) -> tuple:
    axis = sweep.spec.axes[key]
    if isinstance(axis, list):
        for i, v in enumerate(axis):
            if v == value and type(v) is type(value):
                return ("axes", key, i)
    return ("axes", key)


def _axis_error(sweep: Sweep, key: str, value, problem: str) -> ConfigError:
    loc = _axis_loc(sweep, key, value)
    if len(loc) == 2:
        problem = f"{problem} (at {key} = {value!r})"
    return sweep.src.error(problem, loc)


def _describe(combo: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in combo.items())


def locate(sweep: Sweep, combo: dict, err: ConfigError) -> ConfigError:
    """Put a point's validation error where it was written: the axis whose value caused it,
    the sweep's ``slo:``, or the base scenario's key."""
    f = err.field or ""
    if err.file or not f:
        return err
    for key, value in combo.items():
        if f == key and err.problem.startswith("unknown key"):
            parent, _, leaf = key.rpartition(".")
            near = did_you_mean(leaf, known_keys(Scenario, tuple(key.split("."))),
                                prefix=f"{parent}." if parent else "")
            return sweep.src.error("unknown scenario key" + near, ("axes", key))
        if f == key or f.startswith((key + ".", key + "[")) or key.startswith(f + "."):
            problem = err.problem if f == key else f"{f}: {err.problem}"
            return _axis_error(sweep, key, value, problem)
    if (f == "slo" or f.startswith("slo.")) and sweep.spec.slo is not None:
        return sweep.src.error(err.problem, undotted(f))
    where = f" (point {_describe(combo)})" if combo else ""
    if sweep.base_src is not None:
        return ConfigError(err.problem + where, file=sweep.base_src.path,
                           line=sweep.base_src.line(undotted(f)), field=f)
    return sweep.src.error(err.problem + where, ("base",) + undotted(f))
