"""Load a scenario YAML file into a :class:`~blis_simpy.config.scenario.Scenario`.

Every problem becomes one :class:`~blis_simpy.errors.ConfigError` that names the file, the
1-based line of the offending key and its dotted path (``engine.max_num_running_reqs``):
a missing/unreadable file, YAML syntax errors, duplicate keys, unknown keys, wrong types,
values out of range (negative, NaN, Inf) and the semantic rules of :func:`check_scenario`.

Line numbers come from PyYAML's composed node tree (:func:`yaml.compose`): :class:`Source`
maps every key path of the document to the line where the key is written. Relative file
paths inside a scenario (the trace ``header`` / ``data`` of a trace workload, the ``path``
of a workload-spec workload) resolve against the directory of the scenario file.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field

import pydantic
import yaml

from blis_simpy.config.scenario import DistributionWorkload, Scenario, SpecWorkload, TraceWorkload
from blis_simpy.errors import ConfigError, validation_problem
from blis_simpy.yaml_input import CappedLoader, parse, read_text


class _Loader(CappedLoader):
    """The capped safe loader (:mod:`blis_simpy.yaml_input`) with YAML 1.2 floats: ``1e3``
    and ``2.5E-4`` are numbers, not strings."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))

Loc = tuple  # a key path: ("engine", "max_num_running_reqs"), ("plugins", 0)


@dataclass
class Source:
    """Where a scenario came from: its file and the line of every key path in it."""

    path: str | None = None
    lines: dict[Loc, int] = field(default_factory=dict)

    @classmethod
    def from_node(cls, path: str, node: yaml.Node | None) -> Source:
        src = cls(path)
        stack: list[tuple[Loc, yaml.Node]] = [((), node)] if node is not None else []
        while stack:
            loc, n = stack.pop()
            if isinstance(n, yaml.MappingNode):
                for k, v in n.value:
                    if isinstance(k, yaml.ScalarNode):
                        src.lines[loc + (k.value,)] = k.start_mark.line + 1
                        stack.append((loc + (k.value,), v))
            elif isinstance(n, yaml.SequenceNode):
                for i, item in enumerate(n.value):
                    src.lines[loc + (i,)] = item.start_mark.line + 1
                    stack.append((loc + (i,), item))
        return src

    def has(self, loc: Loc) -> bool:
        return tuple(loc) in self.lines

    def line(self, loc: Loc) -> int | None:
        """Line of ``loc``, or of its deepest ancestor written in the file."""
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return None

    def error(self, problem: str, loc: Loc) -> ConfigError:
        return ConfigError(problem, file=self.path, line=self.line(loc) if self.path else None,
                           field=dotted(loc) or None)


def dotted(loc: Loc) -> str:
    """``("plugins", 0)`` → ``plugins[0]``; ``("engine", "block_size")`` → ``engine.block_size``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def undotted(path: str) -> Loc:
    """Inverse of :func:`dotted`."""
    return tuple(int(m[1]) if m[1] else m[2] for m in re.finditer(r"\[(\d+)\]|([^.\[\]]+)", path))


def mapping_at(data: dict, *path: str) -> dict | None:
    """The nested mapping at ``path`` in a raw dict (created when missing); None if
    something else is there (left to validation to report)."""
    cur = data
    for p in path:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            return None
        cur = nxt
    return cur


def set_dotted(data: dict, key: str, value) -> bool:
    """Set the dotted key ``a.b.c`` in a raw scenario dict, creating mappings on the way;
    False (nothing set) when an ancestor is not a mapping (left to validation to report)."""
    *parents, last = key.split(".")
    cur = mapping_at(data, *parents)
    if cur is None:
        return False
    cur[last] = value
    return True


# ---------------------------------------------------------------------------- reading
@functools.cache
def _node_capped(max_nodes: int, kind: str) -> type[_Loader]:
    return type("_NodeCappedLoader", (_Loader,), {"max_nodes": max_nodes, "kind": kind})


def read_yaml(path: str, *, max_nodes: int | None = None, kind: str = "this file") -> tuple[object, Source]:
    """Parse one YAML document through the capped reader (:mod:`blis_simpy.yaml_input`:
    size, nesting and alias caps; ``max_nodes`` keys and values at most, refused while
    composing as too many for ``kind``); returns the data and its :class:`Source`."""
    path = str(path)
    loader = _Loader if max_nodes is None else _node_capped(max_nodes, kind)
    text = read_text(path)
    found: list[Source] = []

    def check(node: yaml.Node) -> None:
        found.append(Source.from_node(path, node))
        _check_duplicate_keys(node, found[0])

    data, _ = parse(text, path, loader=loader, check=check)
    return data, (found[0] if found else Source(path))


def _check_duplicate_keys(node: yaml.Node | None, src: Source) -> None:
    stack: list[tuple[Loc, yaml.Node | None]] = [((), node)]
    while stack:
        loc, n = stack.pop()
        if isinstance(n, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen:
                        raise ConfigError("duplicate key", file=src.path, line=k.start_mark.line + 1,
                                          field=dotted(loc + (k.value,)))
                    seen.add(k.value)
                    stack.append((loc + (k.value,), v))
        elif isinstance(n, yaml.SequenceNode):
            stack.extend((loc + (i,), item) for i, item in enumerate(n.value))


# ---------------------------------------------------------------------------- validation
def _model_loc(data: object, loc: Loc) -> Loc:
    """Drop pydantic's union tags (``workload.trace.header`` → ``workload.header``)."""
    out: list = []
    cur = data
    tagged = None   # the mapping whose union tag was dropped (a spec workload has a `spec` key)
    for part in loc:
        if isinstance(part, str) and any(c in part for c in "[]()"):
            continue  # validator wrappers such as "function-after[...]"
        if isinstance(cur, dict) and cur is not tagged and part == cur.get("kind") and (
                part not in cur or cur.get("kind") == "spec"):
            tagged = cur
            continue
        out.append(part)
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            cur = cur[part]
        else:
            cur = None
    return tuple(out)


def error_loc(data: object, first: dict) -> Loc:
    """The key path of one pydantic error in ``data`` (as :class:`Source` knows it)."""
    loc = _model_loc(data, tuple(first["loc"]))
    if first["type"].startswith("union_tag"):    # a bad or missing union tag: the kind key
        loc = loc if loc[-1:] == ("kind",) else loc + ("kind",)
    if first["type"] == "invalid_key" and loc:   # ``1: x``: a key, not a list index
        loc = loc[:-1] + (str(loc[-1]),)
    return loc


def validate(data: dict, src: Source, *, semantic: bool = True) -> Scenario:
    """Build a Scenario from plain data; the first error becomes a located ConfigError.

    ``semantic=False`` skips :func:`check_scenario` (the caller runs it later).
    """
    try:
        scenario = Scenario.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise src.error(validation_problem(first, Scenario), error_loc(data, first)) from None
    if not semantic:
        return scenario
    try:
        check_scenario(scenario)
    except ConfigError as exc:
        raise locate(exc, src) from None
    return scenario


def locate(err: ConfigError, src: Source) -> ConfigError:
    """Add the scenario file and line to an error that names only a dotted field."""
    if err.file or not src.path or not err.field or err.field.startswith("--"):
        return err
    return ConfigError(err.problem, file=src.path, line=src.line(undotted(err.field)), field=err.field)


def check_scenario(s: Scenario) -> None:
    """Cross-key rules pydantic cannot express; raises ConfigError(field=dotted path)."""
    w = s.workload
    if isinstance(w, DistributionWorkload):
        for which in ("prompt_tokens", "output_tokens"):
            d = getattr(w, which)
            for loc, problem in distribution_problems(d):
                raise ConfigError(problem, field=f"workload.{which}.{loc}")
        if w.num_requests <= 0 and s.horizon_us is None:
            raise ConfigError("a workload without num_requests needs a horizon (horizon_us)",
                              field="workload.num_requests")
    check_load_shape(w)


def check_load_shape(w) -> None:
    """Closed-loop clients and time-varying open load (docs/workloads.md): which keys go
    together, and the order of a rate schedule's points."""
    if w.concurrency is not None and w.concurrency_stages is not None:
        raise ConfigError("give workload.concurrency or workload.concurrency_stages, not both",
                          field="workload.concurrency_stages")
    for i, st in enumerate(w.concurrency_stages or ()):
        if (st.duration_s is None) == (st.num_requests is None):
            raise ConfigError("give exactly one of duration_s and num_requests",
                              field=f"workload.concurrency_stages[{i}]")
        if st.num_requests is not None and st.concurrency == 0:
            raise ConfigError("a stage of num_requests needs concurrency > 0",
                              field=f"workload.concurrency_stages[{i}].concurrency")
    t = w.think_time
    if t is not None and not w.closed_loop:
        key = next((k for k in ("dist", "mean_ms", "sigma") if k in t.model_fields_set), None)
        raise ConfigError("applies to closed-loop clients: set workload.concurrency or "
                          "workload.concurrency_stages",
                          field="workload.think_time" + (f".{key}" if key else ""))
    if t is not None and t.dist == "lognormal" and t.mean_ms <= 0:
        raise ConfigError("a lognormal think time needs workload.think_time.mean_ms > 0",
                          field="workload.think_time.dist")
    if not isinstance(w, DistributionWorkload):
        return
    given = [k for k in ("stages", "rate_schedule", "rate_csv") if getattr(w, k) is not None]
    if len(given) > 1:
        raise ConfigError(f"give one of workload.stages, workload.rate_schedule and "
                          f"workload.rate_csv, not both {given[0]} and {given[1]}",
                          field=f"workload.{given[1]}")
    if given and w.closed_loop:
        raise ConfigError("open-loop arrivals cannot be combined with closed-loop clients "
                          "(workload.concurrency)", field=f"workload.{given[0]}")
    pts = w.rate_schedule or []
    for i in range(1, len(pts)):
        if pts[i].at_s <= pts[i - 1].at_s:
            raise ConfigError(f"{pts[i].at_s:g} is not after the previous point's "
                              f"{pts[i - 1].at_s:g}", field=f"workload.rate_schedule[{i}].at_s")


def distribution_problems(d) -> list[tuple[str, str]]:
    """BLIS's distribution-mode rules (docs/workloads.md, "Distribution mode and
    presets"), as ``(key, problem)`` pairs.

    min and max >= 1, min <= max, stdev >= 0, and — a BLIS quirk kept for parity — both the
    mean **and the stdev** must lie in ``[min, max]``.
    """
    out = []
    for key in ("min", "max"):
        if getattr(d, key) < 1:
            out.append((key, f"must be >= 1, got {getattr(d, key)}"))
    if d.min > d.max:
        out.append(("min", f"min ({d.min}) must be <= max ({d.max})"))
    if d.stdev < 0:
        out.append(("stdev", f"must be >= 0, got {d.stdev:g}"))
    for key in ("mean", "stdev"):
        v = getattr(d, key)
        if not d.min <= v <= d.max:
            side = f"below min {d.min}" if v < d.min else f"above max {d.max}"
            rule = f"the {key} must lie in [min, max] = [{d.min}, {d.max}]"
            if key == "stdev":      # the quirk: say it is meant
                rule += " like the mean (BLIS's rule, kept for parity; docs/workloads.md)"
            out.append((key, f"{v:g} is {side}: {rule}"))
    return out


# ---------------------------------------------------------------------------- entry point
#: top-level scenario keys holding file or folder paths
PATH_KEYS = ("model_config_folder", "hardware_config", "defaults_filepath")


def resolve_paths(data: dict, base_dir: str) -> None:
    """Make the file paths of a scenario (trace files, model config folder, hardware and
    defaults files) relative to ``base_dir`` (in place)."""
    for key in PATH_KEYS:
        p = data.get(key)
        if isinstance(p, str) and p and not os.path.isabs(p):
            data[key] = os.path.normpath(os.path.join(base_dir, p))
    lat = data.get("latency")
    if isinstance(lat, dict):
        p = lat.get("coefficients")
        if isinstance(p, str) and p and p != "default" and not os.path.isabs(p):
            lat["coefficients"] = os.path.normpath(os.path.join(base_dir, p))
    w = data.get("workload")
    if isinstance(w, dict) and isinstance(w.get("rate_csv"), str) and w["rate_csv"] \
            and not os.path.isabs(w["rate_csv"]):
        w["rate_csv"] = os.path.normpath(os.path.join(base_dir, w["rate_csv"]))
    if isinstance(w, dict) and w.get("kind") in ("trace", "spec"):
        for key in ("header", "data") if w["kind"] == "trace" else ("path",):
            p = w.get(key)
            if isinstance(p, str) and p and not os.path.isabs(p):
                w[key] = os.path.normpath(os.path.join(base_dir, p))


def read_mapping(path: str, what: str) -> tuple[dict, Source]:
    """Read a YAML file that must hold a mapping (an empty file is ``{}``); ``what`` names
    the document in the error ("a scenario", "a policy bundle")."""
    data, src = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a mapping of keys, got {type(data).__name__}",
                          file=src.path, line=1)
    return data, src


def load_raw(path: str) -> tuple[dict, Source]:
    """Read a scenario file into a plain dict (paths resolved) and its :class:`Source`."""
    data, src = read_mapping(path, "a scenario")
    w = data.get("workload")
    if isinstance(w, dict) and "kind" not in w:
        w["kind"] = "distribution"
    resolve_paths(data, os.path.dirname(str(path)))
    return data, src


def load_scenario(path: str) -> Scenario:
    """Load and validate a scenario YAML file. Raises a located :class:`ConfigError`."""
    data, src = load_raw(path)
    return validate(data, src)


def summary(s: Scenario) -> str:
    """One line describing a scenario (``blis-simpy validate`` prints it)."""
    w = s.workload
    if isinstance(w, TraceWorkload):
        work = f"trace workload {w.header} + {w.data}"
    elif isinstance(w, SpecWorkload):
        work = f"workload spec {w.path or '(inline)'}"
    elif w.time_varying:
        shape = next(k for k in ("stages", "rate_schedule", "rate_csv") if getattr(w, k) is not None)
        work = f"distribution workload (time-varying rate: {shape})"
    else:
        work = f"distribution workload ({w.num_requests} requests at {w.rate:g} req/s)"
    if w.concurrency is not None:
        work += f" sent by {w.concurrency} closed-loop client{'s' if w.concurrency != 1 else ''}"
    elif w.concurrency_stages is not None:
        work += f" sent by closed-loop clients in {len(w.concurrency_stages)} stages"
    n = s.cluster.num_instances
    horizon = (f"horizon {s.horizon_us} us" if s.horizon_us is not None else
               "the spec's horizon" if isinstance(w, SpecWorkload) else "no horizon")
    name = f"{s.name}: " if s.name else ""
    return (f"{name}model {s.model or '(none)'}, {s.latency.model} latency, {n} instance"
            f"{'s' if n != 1 else ''}, {s.cluster.routing.policy} routing, {work}, {horizon}")
