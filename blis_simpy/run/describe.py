"""A run description: a scenario, validated and frozen, with everything a run needs resolved.

:func:`prepare` turns a scenario (a file path, or a dict of scenario keys) and plain-data
overrides keyed by scenario paths (``{"engine.max_num_running_reqs": 64}``; a path may name
a whole subtree, ``{"workload": {...}}``) into a :class:`RunDescription`: the validated
:class:`~blis_simpy.config.scenario.Scenario` (latency backend, policies and pools checked),
where it came from (for errors located at ``FILE:LINE``), the mode (``run`` or ``replay``)
and the :class:`Outputs` wanted. :func:`~blis_simpy.run.execute.execute` runs it.

Nothing here knows a command-line flag: the CLI translates its flags into overrides and
re-labels errors on an overridden path with the flag that set it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from blis_simpy.config.loader import Source, check_scenario, load_raw, set_dotted, undotted, validate
from blis_simpy.config.scenario import Scenario, TraceWorkload
from blis_simpy.deploy.policy import policy_families
from blis_simpy.deploy.pools import resolve_pools
from blis_simpy.deploy.resolve import build_latency_model
from blis_simpy.engine.batching import BatchingPolicy
from blis_simpy.errors import ConfigError, UnknownName
from blis_simpy.plugins import load_plugins
from blis_simpy.run.simulation import component_classes

__all__ = ["DEFAULT_LATENCY_MODEL", "MODES", "Outputs", "PluginsRefused", "RunDescription",
           "apply_overrides", "check_components", "describe", "prepare",
           "scenario_plugins"]

#: The latency backend of a scenario that names none: ``physics`` (BLIS 89bece82 used
#: roofline, BLIS HEAD trained-physics; both stay one key away).
DEFAULT_LATENCY_MODEL = "physics"

#: ``run``: a generated (or spec) workload; ``replay``: a TraceV2 workload, BLIS's replay
#: report (no fitness section asked of it is dropped, the results file is a SimResult array)
MODES = ("run", "replay")


@dataclass(frozen=True)
class Outputs:
    """What the run writes or keeps besides its report.

    ``requests_out``: the per-request rows file (None: none); ``keep_requests``: every
    request object is needed after the run (a trace is then read whole, not streamed);
    ``fitness``: add the fitness section when the scenario has ``fitness_weights``;
    ``labels``: what the caller calls an output file in error lines (``outputs.requests_out``,
    ``output.timeline`` → e.g. the CLI's flag), that name when absent;
    ``stop_when_saturated``: end the run at its last pre-generated arrival when it is
    saturated by then (docs/metrics.md, "Saturation"; the plan's early drop, docs/planning.md):
    the drain is not simulated."""

    requests_out: str | None = None
    keep_requests: bool = False
    fitness: bool = True
    stop_when_saturated: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)

    def label(self, key: str) -> str:
        """The name errors give the output ``key``."""
        return self.labels.get(key, key)


@dataclass(frozen=True)
class RunDescription:
    """A validated scenario and where each of its values came from (frozen: a change is a
    new description, :func:`dataclasses.replace`).

    ``overridden``: the scenario paths an override set; ``seed_given``: the seed was
    written or overridden (a workload spec's own seed yields to it); ``plugin_dirs``:
    folders searched first for the scenario's plugin modules; ``pending_plugins``: modules
    not imported (no opt-in, validation only) and ``unchecked`` the names they may register."""

    scenario: Scenario
    mode: str = "run"
    src: Source = field(default_factory=Source)
    overridden: frozenset[str] = frozenset()
    seed_given: bool = False
    outputs: Outputs = Outputs()
    plugin_dirs: tuple[str, ...] = ()
    pending_plugins: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()

    def attribute(self, err: ConfigError) -> ConfigError:
        """Locate an error on a scenario key written in the scenario file at its line; an
        error on an overridden key (or a located one) is returned as it is."""
        if err.file or not err.field or err.field.startswith("--") or not self.src.path:
            return err
        if any(p in self.overridden for p in ancestors(err.field)):
            return err
        return ConfigError(err.problem, file=self.src.path,
                           line=self.src.line(undotted(err.field)), field=err.field)


def ancestors(path: str):
    """``a.b[1].c``, ``a.b[1]``, ``a.b``, ``a``: a dotted path and its ancestors."""
    while path:
        yield path
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""


class PluginsRefused(ConfigError):
    """A scenario names plugin modules and the caller did not opt in to import them."""

    def __init__(self, modules: list[str], *, file: str | None = None, line: int | None = None):
        self.modules = list(modules)
        names = ", ".join(repr(m) for m in modules)
        word = "module" if len(modules) == 1 else "modules"
        super().__init__(f"would import the plugin {word} {names} (code that runs) without "
                         "the caller's opt-in", file=file, line=line, field="plugins")


def apply_overrides(data: dict, overrides: dict | None) -> frozenset[str]:
    """Set each ``path: value`` of ``overrides`` in the raw scenario dict ``data`` (in place,
    in the given order; values copied); returns the paths set."""
    done = []
    for path, value in (overrides or {}).items():
        if set_dotted(data, path, copy.deepcopy(value)):
            done.append(path)
    return frozenset(done)


def scenario_plugins(data: dict, src: Source, folders: tuple[str, ...], *, allow: bool,
                     defer: bool = False) -> list[str]:
    """Import the entry-point plugins, then the modules of the scenario's ``plugins:``
    (looked up in the scenario's folder and ``folders`` first) when ``allow``; otherwise
    return them (``defer``: validation only) or raise :class:`PluginsRefused`. A value
    that is not a list of names is left to the scenario's validation."""
    load_plugins()      # entry points: the scenario may name their classes with no plugins key
    plugins = data.get("plugins")
    if not (isinstance(plugins, list) and plugins and all(isinstance(p, str) for p in plugins)):
        return []
    line = src.line(("plugins",)) if src.path else None
    if not allow:
        if defer:
            return list(plugins)
        raise PluginsRefused(plugins, file=src.path, line=line)
    try:
        load_plugins(plugins, source=src.path, folders=folders)
    except ConfigError as exc:
        raise ConfigError(exc.problem, file=src.path, line=line, field="plugins") from None
    return []


def plugin_folders(src: Source, plugin_dirs: tuple[str, ...]) -> tuple[str, ...]:
    """Where the scenario's plugin modules are looked up first: its own folder, then ``plugin_dirs``."""
    folders = tuple(plugin_dirs)
    if src.path:
        folders = (os.path.dirname(os.path.abspath(src.path)), *folders)
    return folders


def describe(data: dict, overrides: dict | None = None, *, src: Source | None = None,
             mode: str = "run", outputs: Outputs = Outputs(), plugin_dirs: tuple[str, ...] = (),
             pending_plugins: list[str] | tuple[str, ...] = (), components: bool = True,
             unchecked: list[str] | None = None, seed_given: bool = False) -> RunDescription:
    """Validate a raw scenario dict (edited in place by ``overrides``) into a description.

    ``components``: also check the latency backend, the policies and the pools
    (:func:`check_components`); names no registry holds go to ``unchecked`` when it is given
    (plugins not imported). The seed counts as given when ``seed_given``, written in the
    file or overridden. Errors are located (:meth:`RunDescription.attribute`)."""
    if mode not in MODES:
        raise ConfigError(f"must be one of {', '.join(MODES)}, got {mode!r}", field="mode")
    src = src if src is not None else Source()
    seed_given = seed_given or src.has(("seed",)) or "seed" in (overrides or {})
    done = apply_overrides(data, overrides)
    desc = RunDescription(Scenario(), mode, src, done, seed_given, outputs, tuple(plugin_dirs),
                          tuple(pending_plugins))
    found: list[str] = [] if unchecked is None else unchecked
    try:
        scenario = validate(data, Source(None), semantic=False)
        if components:   # backend and policies first, as BLIS does (docs/cli.md)
            check_components(scenario, unchecked=found if (pending_plugins or unchecked is not None)
                             else None)
        check_scenario(scenario)
    except ConfigError as exc:
        raise desc.attribute(exc) from None
    return RunDescription(scenario, mode, src, done, seed_given, outputs, tuple(plugin_dirs),
                          tuple(pending_plugins), tuple(found))


def prepare(scenario: str | dict, overrides: dict | None = None, *, mode: str = "run",
            outputs: Outputs = Outputs(), plugin_dirs: tuple[str, ...] = (),
            allow_plugins: bool = False, validate_only: bool = False,
            need_trace: bool = True) -> RunDescription:
    """A scenario file (path) or a dict of scenario keys (copied), with ``overrides`` on top
    (scenario path → value) → a validated, frozen :class:`RunDescription` (a dict's
    ``seed`` counts as written: a workload spec's own seed yields to it).

    The scenario's ``plugins:`` are imported only with ``allow_plugins``; without it a
    scenario naming some is refused (:class:`PluginsRefused`), or with ``validate_only`` its
    plugins are recorded as pending and everything else is checked. ``need_trace``: a
    ``replay`` needs a trace workload (False: its workload comes from elsewhere)."""
    if isinstance(scenario, dict):
        data, src = copy.deepcopy(scenario), Source()
        seed = data.get("seed")
        written_seed = isinstance(seed, int) and not isinstance(seed, bool)
    else:
        data, src = load_raw(scenario)
        written_seed = False
    folders = plugin_folders(src, plugin_dirs)
    pending = scenario_plugins(data, src, folders, allow=allow_plugins, defer=validate_only)
    desc = describe(data, overrides, src=src, mode=mode, outputs=outputs, plugin_dirs=folders,
                    pending_plugins=pending, seed_given=written_seed)
    if mode == "replay" and need_trace and not isinstance(desc.scenario.workload, TraceWorkload):
        raise ConfigError("replay needs a trace: a scenario whose workload has kind: trace",
                          field="workload.kind")
    return desc


def check_components(s: Scenario, *, unchecked: list[str] | None = None) -> None:
    """Latency backend and coefficients, policy names and parameters (cheap lookups only).

    ``unchecked``: a name that no registry holds (:class:`UnknownName`: a plugin not
    imported may register it) is appended there, with the check it stopped, instead of
    raised; the other checks go on."""
    fam = policy_families()

    def policy(key, cfg):
        fam[key].lookup(cfg.policy, field=f"cluster.{key}.policy").parse_params(
            cfg.params, field=f"cluster.{key}.params")

    steps = (
        lambda: build_latency_model(s),
        lambda: fam["scheduler"].lookup(s.engine.scheduler, field="engine.scheduler"),
        lambda: fam["priority"].lookup(s.engine.priority_policy, field="engine.priority_policy"),
        lambda: policy("admission", s.cluster.admission),
        lambda: policy("routing", s.cluster.routing),
        lambda: BatchingPolicy.lookup(s.engine.batching, field="engine.batching").parse_params(
            s.engine.batching_params, field="engine.batching_params"),
        # PD topology, decider, pools (docs/cli.md, "Validation order")
        lambda: resolve_pools(s, quiet=True),
        lambda: component_classes(s, s.disaggregation.enabled),  # engine, cluster, fabric classes
    )
    for step in steps:
        try:
            step()
        except UnknownName as exc:
            if unchecked is None:
                raise
            unchecked.append(f"{exc.field}: {exc.name}" if exc.field else exc.name)
