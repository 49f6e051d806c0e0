"""The glue between the command line and the run layer (:mod:`blis_simpy.run`).

``prepare`` turns (command, given flags, optional scenario file) into an :class:`Invocation`: the
flags become overrides keyed by scenario paths (:func:`flag_overrides`) and the run layer
validates them into a :class:`~blis_simpy.run.describe.RunDescription`; ``execute`` runs it
and returns the run layer's :class:`~blis_simpy.run.execute.Outcome`::

    scenario file ─┐
                   ├─► run.prepare (validated RunDescription) ─► run.execute ─► Outcome (report)
    given flags ───┘ (→ overrides)

Errors keep pointing at what the user wrote: a scenario key (``FILE:LINE: dotted.key``) or
a flag (``--flag-name``), see :meth:`Invocation.attribute`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from blis_simpy.atomic import Batch
from blis_simpy.cli import plugin_optin, startup_gc
from blis_simpy.cli.flag_rules import apply_flags
from blis_simpy.cli.flags import REPLAY, flag_for_path
from blis_simpy.config.loader import Source, load_raw, undotted
from blis_simpy.config.scenario import Scenario, TraceWorkload
from blis_simpy.deploy.resolve import build_latency_model
from blis_simpy.errors import ConfigError
from blis_simpy.metrics.report import Report, planning_part, write_results
from blis_simpy.metrics.summary import metrics_output, replay_results
from blis_simpy.request import COMPLETED, TIMED_OUT
from blis_simpy.run import workload as W
from blis_simpy.run.describe import (
    DEFAULT_LATENCY_MODEL,
    Outputs,
    PluginsRefused,
    RunDescription,
    ancestors,
    describe,
    plugin_folders,
    scenario_plugins,
)
from blis_simpy.run.execute import Outcome
from blis_simpy.run.execute import execute as run_execute
from blis_simpy.run.outputs import ROWS_FIELD, TIMELINE_FIELD
from blis_simpy.units import MAX_INT64

__all__ = ["BLIS_DEFAULT_LATENCY_MODEL", "Outcome", "Invocation", "execute", "flag_overrides", "prepare"]

log = logging.getLogger("blis_simpy.cli")

#: The backend when neither --latency-model nor coefficients are given (the run layer's default)
BLIS_DEFAULT_LATENCY_MODEL = DEFAULT_LATENCY_MODEL

#: flags whose output needs every request kept in memory
_NEEDS_REQUESTS = {"--results-path": "keeps every request for its rows (use --requests-out)",
                   "--trace-output": "needs every request at the end"}


def preset(name: str) -> dict | None:
    """A workload preset as scenario keys (``None`` if unknown)."""
    from blis_simpy.workload import PRESETS
    p = PRESETS.get(name)
    if p is None:
        return None
    dist = lambda lp: {"mean": lp.mean, "stdev": lp.stdev, "min": lp.min, "max": lp.max}  # noqa: E731
    return {"prefix_tokens": p.prefix_tokens, "prompt_tokens": dist(p.prompt),
            "output_tokens": dist(p.output)}


@dataclass
class Invocation:
    """A command's run description plus where each of its values came from."""

    command: str
    src: Source
    origin: dict[str, str] = field(default_factory=dict)   # scenario path -> flag name
    given: dict = field(default_factory=dict)              # flag name -> parsed value
    description: RunDescription | None = None
    unchecked: list[str] = field(default_factory=list)   # names plugins not imported may register

    @property
    def scenario(self) -> Scenario:
        return self.description.scenario

    @scenario.setter
    def scenario(self, s: Scenario) -> None:
        self.description = replace(self.description, scenario=s)

    @property
    def pending_plugins(self) -> list[str]:
        return list(self.description.pending_plugins)

    def attribute(self, err: ConfigError) -> ConfigError:
        """Re-locate an error on a scenario key: to the flag that set it, or to its line."""
        if isinstance(err, PluginsRefused):
            return ConfigError(plugin_optin.refusal(err.modules), file=err.file, line=err.line,
                               field="plugins")
        if err.file and err.field in self.origin:      # a file named by a flag
            return ConfigError(err.problem, file=err.file, line=err.line, field=self.origin[err.field])
        if err.file or not err.field or err.field.startswith("--"):
            return err
        path = err.field
        flag = next((self.origin[p] for p in ancestors(path) if p in self.origin), None)
        if flag is None and self.src.path is None:
            f = flag_for_path(path)
            flag = f.name if f is not None and self.command in f.commands else None
        if flag is not None:
            return ConfigError(err.problem, field=flag)
        if self.src.path:
            return ConfigError(err.problem, file=self.src.path, line=self.src.line(undotted(path)),
                               field=path)
        return err


def _diff(old: dict, new: dict, prefix: str, out: dict) -> None:
    """The ``path: value`` overrides that turn ``old`` into ``new`` (a mapping that lost a
    key is replaced whole)."""
    for k, v in new.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        was = old.get(k, _MISSING)
        if isinstance(was, dict) and isinstance(v, dict) and not set(was) - set(v):
            _diff(was, v, path, out)
        elif was is _MISSING or type(was) is not type(v) or was != v:
            out[path] = copy.deepcopy(v)


_MISSING = object()


def _value_at(data: dict, path: str):
    cur = data
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def flag_overrides(data: dict, given: dict[str, str], command: str):
    """The given flags as run-layer overrides: ``(overrides, flags)`` where ``overrides``
    maps scenario paths to values (every key a flag set, and what the cross-flag rules
    changed) and ``flags`` is the :class:`~blis_simpy.cli.flag_rules.Overrides` (parsed
    values, path → flag). ``data`` (the raw scenario) is left as it is."""
    applied = copy.deepcopy(data)
    ov = apply_flags(applied, given, command, presets=preset)
    overrides: dict = {}
    _diff(data, applied, "", overrides)
    for path in ov.origin:
        value = _value_at(applied, path)
        if value is not _MISSING and path not in overrides:
            overrides[path] = copy.deepcopy(value)
    if ov.values.get("--trace-output-decisions"):   # implies the decision trace
        overrides["trace.level"] = "decisions"
    return overrides, ov


def flag_outputs(command: str, ov) -> Outputs:
    """The run-layer outputs the given flags ask for (``ov``: the parsed flags)."""
    fitness = not (command == REPLAY and ov.origin.get("fitness_weights") == "--fitness-weights")
    labels = {ROWS_FIELD: "--requests-out"}
    if TIMELINE_FIELD in ov.origin:
        labels[TIMELINE_FIELD] = ov.origin[TIMELINE_FIELD]
    return Outputs(requests_out=ov.values.get("--requests-out") or None,
                   keep_requests="--trace-output" in ov.values, fitness=fitness, labels=labels)


def prepare(command: str, given: dict[str, str], scenario_path: str | None = None, *,
            data: dict | None = None, need_trace: bool = True, plugin_dirs: tuple[str, ...] = (),
            allow_plugins: bool | None = None) -> Invocation:
    """Scenario file (optional) + given flags → an :class:`Invocation`. ``data``: scenario keys to
    start from instead of a file, its plugin modules looked up in ``plugin_dirs`` first;
    ``need_trace=False``: a replay whose workload comes from elsewhere (calibrate/fit replay
    a measured run).

    A scenario's ``plugins:`` are imported only with ``allow_plugins`` (None: the command's
    opt-in, :mod:`blis_simpy.cli.plugin_optin`); without it the command ``validate`` imports
    nothing and records them in :attr:`Invocation.pending_plugins`, any other refuses them."""
    if data is not None:
        src = Source()
    elif scenario_path is not None:
        data, src = load_raw(scenario_path)
    else:
        if "--model" not in given:
            raise ConfigError("is required (or pass --scenario FILE.yaml)", field="--model")
        data, src = {"latency": {"model": BLIS_DEFAULT_LATENCY_MODEL}}, Source()
    folders = plugin_folders(src, plugin_dirs)
    allow = plugin_optin.allowed() if allow_plugins is None else allow_plugins
    try:
        pending = scenario_plugins(data, src, folders, allow=allow, defer=command == "validate")
    except PluginsRefused as exc:
        raise Invocation(command, src).attribute(exc) from None
    inv = prepare_data(command, given, data, src, plugin_dirs=folders, pending_plugins=pending)
    inv.unchecked = list(inv.description.unchecked)
    if command == REPLAY and need_trace and not isinstance(inv.scenario.workload, TraceWorkload):
        raise ConfigError("replay needs a trace: pass --trace-header and --trace-data, or a "
                          "scenario whose workload has kind: trace", field="--trace-header")
    startup_gc.resume()     # start-up ends here (main() paused the collector)
    return inv


def _mode(command: str) -> str:
    return "replay" if command == REPLAY else "run"


def prepare_data(command: str, given: dict, data: dict, src: Source, *,
                 components: bool = True, unchecked: list[str] | None = None,
                 plugin_dirs: tuple[str, ...] = (), pending_plugins: list[str] = ()) -> Invocation:
    """A :class:`Invocation` of an already-loaded scenario dict (edited in place), its plugins
    already handled (:func:`prepare`: ``plugin_dirs``, ``pending_plugins``) or none: a
    variant of a prepared scenario, ``observe``'s workload (``components`` False: no backend
    or policy check; ``unchecked``: names the plugins may register)."""
    overrides, ov = flag_overrides(data, given, command)
    inv = Invocation(command, src, ov.origin, ov.values)
    try:
        inv.description = describe(data, overrides, src=src, mode=_mode(command),
                                    outputs=flag_outputs(command, ov), components=components,
                                    unchecked=unchecked, plugin_dirs=plugin_dirs,
                                    pending_plugins=pending_plugins)
    except ConfigError as exc:
        raise inv.attribute(exc) from None
    return inv


def check_point(point: dict) -> None:
    """Validate a sweep or plan point (:func:`blis_simpy.run.point.check_point`) under this
    command's plugin opt-in; a refused plugin names the opt-in."""
    from blis_simpy.run.point import check_point as run_check_point
    try:
        run_check_point(point, plugin_optin.allowed())
    except PluginsRefused as exc:
        raise ConfigError(plugin_optin.refusal(exc.modules), file=exc.file, line=exc.line,
                          field="plugins") from None


# ---------------------------------------------------------------------------- running
def _located(inv: Invocation, fn, *args, **kw):
    try:
        return fn(inv.description, *args, **kw)
    except ConfigError as exc:
        raise inv.attribute(exc) from None


def load_trace(inv: Invocation):
    """Read the invocation's trace (a :class:`~blis_simpy.workload.TraceV2`)."""
    return _located(inv, W.load_trace)


def build_workload(inv: Invocation, *, lazy: bool = False) -> tuple[list, int, object | None, int]:
    """The requests, horizon (µs), session manager and workload seed of the invocation's workload
    (``lazy``: a stream where the workload allows, :func:`blis_simpy.run.workload.build_workload`)."""
    return _located(inv, W.build_workload, lazy=lazy)


def build_requests(inv: Invocation) -> tuple[list, int]:
    """The requests of the invocation's workload and the simulation horizon (µs)."""
    return build_workload(inv)[:2]


def spec_workload(inv: Invocation, *, check_only: bool = False):
    """:func:`blis_simpy.run.workload.spec_workload` with the errors on the flags given."""
    return _located(inv, W.spec_workload, check_only=check_only)


def execute(inv: Invocation, progress: Callable[[int, int], None] | None = None, *,
            outputs: Batch | None = None, interruptible: bool = False) -> Outcome:
    """Run the invocation (:func:`blis_simpy.run.execute.execute`): the flags that cannot go
    together are refused first, errors name the flag that set a key, and a replay stopped
    by its default horizon says so on stderr."""
    s = inv.scenario
    if s.metrics.streaming:
        for flag, why in _NEEDS_REQUESTS.items():
            if inv.given.get(flag):
                raise ConfigError(f"cannot be combined with --streaming-metrics: it {why}",
                                  field=flag)
    if s.fitness_weights and not inv.description.outputs.fitness:
        log.warning("--fitness-weights is ignored by replay")
    out = _located(inv, run_execute, progress, outputs=outputs, interruptible=interruptible)
    if inv.command == REPLAY and s.horizon_us is None and not out.interrupted:
        warn_unfinished(len(out.requests), out.report, out.horizon_us, W.last_arrival_us(out.requests))
    return out


# ---------------------------------------------------------------------------- files
def write_results_file(out: Outcome, path: str, batch: Batch | None = None) -> None:
    """``--results-path``: run → MetricsOutput + rows; replay → SimResult array (docs/metrics.md).
    With ``batch``, staged to commit with the batch's other outputs."""
    if out.description.mode == "replay":
        obj = replay_results(out.report.cluster)
    else:
        obj = metrics_output(out.report.cluster, include_requests=True) | planning_part(out.report)
    write_results(path, obj, field="--results-path", batch=batch)


def export_trace(out: Outcome, prefix: str, batch: Batch | None = None) -> None:
    """``--trace-output PREFIX``: the run's workload as TraceV2 (docs/workloads.md, "TraceV2");
    with ``batch``, staged to commit with the batch's other outputs."""
    from blis_simpy.workload import TraceHeader, TraceRecord, write_trace
    s = out.description.scenario
    cluster = out.report.cluster
    post = build_latency_model(s).post_decode_us()
    rows = []
    reqs = list(out.requests)
    if out.sessions is not None:      # closed-loop follow-ups are part of the workload
        reqs += out.sessions.followups
    for i, r in enumerate(sorted(reqs, key=lambda q: q.arrival_us)):
        first = last = 0
        ttft = cluster.ttft.get(r.id)     # the cluster record: PD parents are projected there
        if ttft is not None:
            first = r.origin_us + ttft      # latencies count from there (docs/frontend.md)
            e2e = cluster.e2e.get(r.id)
            itl_sum = (e2e - ttft - (post if r.output_len > 0 else 0)
                       if e2e is not None else sum(r.itl))  # itl: set for unfinished requests
            last = first + itl_sum
        status = {COMPLETED: "ok", TIMED_OUT: "timeout"}.get(r.state, "incomplete")
        rows.append(TraceRecord(
            request_id=i, client_id=r.client_id, tenant_id=r.tenant_id, slo_class=r.slo_class,
            session_id=r.session_id, round_index=r.round_index, prefix_group=r.prefix_group,
            prefix_length=r.prefix_length, streaming=r.streaming,
            input_tokens=r.input_len - r.prefix_length, output_tokens=r.output_len,
            text_tokens=r.text_tokens, image_tokens=r.image_tokens, audio_tokens=r.audio_tokens,
            video_tokens=r.video_tokens, reason_ratio=r.reason_ratio, model=r.model,
            deadline_us=r.deadline_us, arrival_time_us=r.arrival_us, send_time_us=r.arrival_us,
            first_chunk_time_us=first, last_chunk_time_us=last, status=status))
    seed = out.workload_seed if out.workload_seed is not None else s.seed
    header = TraceHeader(trace_version=2, mode="generated", workload_seed=seed)
    write_trace(prefix, header, rows, field="--trace-output", batch=batch)


def warn_unfinished(n_requests: int, report: Report, horizon_us: int, last_arrival_us: int) -> None:
    """One ``warning:`` line on stderr when replay's default horizon (BLIS: 2x the last
    arrival) stopped the run with requests neither completed, timed out, dropped nor
    rejected. Nothing else changes (stdout and results files stay BLIS's)."""
    import sys
    c = report.cluster
    done = (c.completed_requests + c.dropped_unservable + c.timed_out_requests
            + report.rejected_by_admission + report.rejected_at_routing)
    left = n_requests - done
    if left <= 0 or horizon_us >= MAX_INT64:
        return
    why = ("600 s as every request arrives at 0" if last_arrival_us <= 0
           else "2x the last arrival")
    print(f"warning: {left} of {n_requests} requests unfinished at the horizon "
          f"{horizon_us / 1e6:.1f} s (replay's default, {why}); pass --horizon or horizon_us "
          "to replay to completion", file=sys.stderr)


def horizon_text(h: int) -> str:
    return "unbounded" if h >= MAX_INT64 else f"{h} us"


def count_text(n: int, noun: str) -> str:
    """``1 request``, ``2,000 requests``: a count and its noun, plural unless ``n`` is 1."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def offered_text(out: Outcome) -> str:
    """The run header's requests: ``500 requests``, ``+ N session follow-ups`` with closed-loop
    sessions, or what closed-loop clients sent (docs/workloads.md)."""
    clients = getattr(out.sessions, "clients", None)
    if clients is not None:
        return (f"{count_text(len(out.sessions.followups), 'request')} sent by "
                f"{count_text(clients, 'closed-loop client')}")
    extra = f" + {len(out.sessions.followups)} session follow-ups" if out.sessions else ""
    return f"{count_text(len(out.requests), 'request')}{extra}"
