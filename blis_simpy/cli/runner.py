"""The glue between the command line and the library.

``prepare`` turns (command, given flags, optional scenario file) into a validated
:class:`Plan`; ``execute`` turns a plan into an :class:`Outcome`::

    scenario file ─┐
                   ├─► Scenario ─► requests (trace replay | generated) ─► Simulation.run
    given flags ───┘                                          ─► SimulationResult ─► Report

Errors keep pointing at what the user wrote: a scenario key (``FILE:LINE: dotted.key``) or
a flag (``--flag-name``), see :meth:`Plan.attribute`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from blis_simpy.atomic import Batch
from blis_simpy.build.pools import resolve_pools
from blis_simpy.build.resolve import build_latency_model
from blis_simpy.cli import plugin_optin, slo_cost, startup_gc, streaming
from blis_simpy.cli.flag_rules import apply_flags
from blis_simpy.cli.flags import BY_NAME, REPLAY, flag_for_path
from blis_simpy.cluster.simulation import Simulation, SimulationResult, component_classes
from blis_simpy.config.loader import Source, check_scenario, load_raw, undotted, validate
from blis_simpy.config.scenario import Scenario, SpecWorkload, TraceWorkload
from blis_simpy.engine.batching import BatchingPolicy
from blis_simpy.errors import ConfigError, UnknownName
from blis_simpy.metrics.fitness import compute_fitness
from blis_simpy.metrics.report import Report, planning_part, write_results
from blis_simpy.metrics.summary import metrics_output, replay_results
from blis_simpy.plugins import load_plugins, running_plugin
from blis_simpy.request import COMPLETED, TIMED_OUT
from blis_simpy.units import MAX_INT64

log = logging.getLogger("blis_simpy.cli")

#: The backend when neither --latency-model nor coefficients are given: ``physics`` (BLIS
#: 89bece82 used roofline, BLIS HEAD trained-physics; both stay one flag away).
BLIS_DEFAULT_LATENCY_MODEL = "physics"


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
class Plan:
    """A validated scenario plus where each of its values came from."""

    command: str
    scenario: Scenario
    src: Source
    origin: dict[str, str] = field(default_factory=dict)   # scenario path -> flag name
    given: dict = field(default_factory=dict)              # flag name -> parsed value
    plugin_dirs: tuple[str, ...] = ()     # folders searched first for the plugin modules
    pending_plugins: list[str] = field(default_factory=list)   # not imported (validate, no opt-in)
    unchecked: list[str] = field(default_factory=list)   # names they may register, not checked

    def attribute(self, err: ConfigError) -> ConfigError:
        """Re-locate an error on a scenario key: to the flag that set it, or to its line."""
        if err.file or not err.field or err.field.startswith("--"):
            return err
        path = err.field
        flag = next((self.origin[p] for p in _ancestors(path) if p in self.origin), None)
        if flag is None and self.src.path is None:
            f = flag_for_path(path)
            flag = f.name if f is not None and self.command in f.commands else None
        if flag is not None:
            return ConfigError(err.problem, field=flag)
        if self.src.path:
            return ConfigError(err.problem, file=self.src.path, line=self.src.line(undotted(path)),
                               field=path)
        return err


def _ancestors(path: str):
    while path:
        yield path
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""


def prepare(command: str, given: dict[str, str], scenario_path: str | None = None, *,
            data: dict | None = None, need_trace: bool = True, plugin_dirs: tuple[str, ...] = (),
            allow_plugins: bool | None = None) -> Plan:
    """Scenario file (optional) + given flags → a validated :class:`Plan`. ``data``: scenario
    keys to start from instead of a file, its plugin modules looked up in ``plugin_dirs``
    first (a sweep's or a plan's base scenario folder); ``need_trace=False``: a replay whose
    workload comes from elsewhere (calibrate/fit replay a measured run).

    A scenario's ``plugins:`` are imported only with ``allow_plugins`` (None: the command's
    opt-in, :mod:`blis_simpy.cli.plugin_optin`); without it the command ``validate`` imports
    nothing and records them in :attr:`Plan.pending_plugins`, any other refuses them."""
    folders = tuple(plugin_dirs)
    if data is not None:
        src = Source()
    elif scenario_path is not None:
        data, src = load_raw(scenario_path)
    else:
        if "--model" not in given:
            raise ConfigError("is required (or pass --scenario FILE.yaml)", field="--model")
        data, src = {"latency": {"model": BLIS_DEFAULT_LATENCY_MODEL}}, Source()
    load_plugins()      # entry points: the scenario may name their classes with no plugins key
    if src.path:
        folders = (os.path.dirname(os.path.abspath(src.path)), *folders)
    allow = plugin_optin.allowed() if allow_plugins is None else allow_plugins
    pending = _scenario_plugins(data, src, folders, allow=allow, defer=command == "validate")
    ov = apply_flags(data, given, command, presets=preset)
    plan = Plan(command, Scenario(), src, ov.origin, ov.values, folders, pending)
    try:
        plan.scenario = validate(data, Source(None), semantic=False)
        # backend and policies first, as BLIS does (docs/cli.md)
        check_components(plan.scenario, unchecked=plan.unchecked if pending else None)
        check_scenario(plan.scenario)
    except ConfigError as exc:
        raise plan.attribute(exc) from None
    if command == REPLAY and need_trace and not isinstance(plan.scenario.workload, TraceWorkload):
        raise ConfigError("replay needs a trace: pass --trace-header and --trace-data, or a "
                          "scenario whose workload has kind: trace", field="--trace-header")
    startup_gc.resume()     # start-up ends here (main() paused the collector)
    return plan


def _scenario_plugins(data: dict, src: Source, folders: tuple[str, ...], *, allow: bool,
                      defer: bool) -> list[str]:
    """Import the modules of the scenario's ``plugins:`` (looked up in ``folders`` first)
    when ``allow``; otherwise return them (``defer``: ``validate``) or refuse them. A value
    that is not a list of names is left to the scenario's validation."""
    plugins = data.get("plugins")
    if not (isinstance(plugins, list) and plugins and all(isinstance(p, str) for p in plugins)):
        return []

    def located(problem: str) -> ConfigError:
        line = src.line(("plugins",)) if src.path else None
        return ConfigError(problem, file=src.path, line=line, field="plugins")

    if not allow:
        if defer:
            return list(plugins)
        raise located(plugin_optin.refusal(plugins))
    try:
        load_plugins(plugins, source=src.path, folders=folders)
    except ConfigError as exc:
        raise located(exc.problem) from None
    return []


def check_components(s: Scenario, *, unchecked: list[str] | None = None) -> None:
    """Latency backend and coefficients, policy names and parameters (cheap lookups only).

    ``unchecked``: a name that no registry holds (:class:`UnknownName`: a plugin not
    imported may register it) is appended there, with the check it stopped, instead of
    raised; the other checks go on."""
    from blis_simpy.cli.flag_values import families
    fam = families()

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


# ---------------------------------------------------------------------------- running
@dataclass
class Outcome:
    plan: Plan
    result: SimulationResult
    report: Report
    requests: list
    horizon_us: int
    sessions: object | None = None        # SessionManager of closed-loop sessions (docs/workloads.md)
    workload_seed: int | None = None      # seed the workload was generated with (None: scenario seed)
    kv_line: str = ""                     # "KV capacity: N blocks (...)" for the run header
    interrupted: bool = False             # Ctrl-C ended the run: the report covers it so far


def trace_paths(plan: Plan) -> tuple[str, str]:
    """The trace header and data paths of a trace workload; both files must exist."""
    out = []
    for key in ("header", "data"):
        path = getattr(plan.scenario.workload, key)
        if not os.path.isfile(path):
            why = "is a directory, expected a file" if os.path.isdir(path) else "no such file"
            flag = plan.origin.get(f"workload.{key}")
            if flag is not None:
                raise ConfigError(why, file=path, field=flag)
            raise plan.attribute(ConfigError(f"{why}: {path}", field=f"workload.{key}"))
        out.append(path)
    return out[0], out[1]


def load_trace(plan: Plan):
    """Read the plan's trace (a :class:`~blis_simpy.workload.TraceV2`)."""
    from blis_simpy.workload import read_trace
    return read_trace(*trace_paths(plan))


def build_requests(plan: Plan) -> tuple[list, int]:
    """The requests of the plan's workload and the simulation horizon (µs)."""
    return build_workload(plan)[:2]


def build_workload(plan: Plan, *, lazy: bool = False) -> tuple[list, int, object | None, int]:
    """The requests of the plan's workload, the simulation horizon (µs), the session manager
    of its closed-loop sessions (or None) and the workload seed. ``lazy``: a trace in arrival
    order comes as a :class:`~blis_simpy.workload.trace_stream.TraceRequestStream` (built as
    the run reaches it) instead of a list."""
    s = plan.scenario
    w = s.workload
    if isinstance(w, SpecWorkload):
        return spec_workload(plan)
    if isinstance(w, TraceWorkload):
        from blis_simpy.workload import default_replay_horizon, trace_requests
        stream = streaming.trace_stream(*trace_paths(plan), s.seed, plan.given) if lazy else None
        if stream is not None:
            horizon = s.horizon_us if s.horizon_us is not None else stream.default_horizon_us()
            return stream, horizon, None, s.seed
        trace = load_trace(plan)
        horizon = s.horizon_us if s.horizon_us is not None else default_replay_horizon(trace.records)
        return trace_requests(trace.records, s.seed), horizon, None, s.seed
    from blis_simpy.workload import LengthParams, distribution_spec, generate_requests
    lp = lambda d: LengthParams(d.mean, d.stdev, d.min, d.max)  # noqa: E731
    try:
        spec = distribution_spec(w.rate, w.num_requests, s.seed, lp(w.prompt_tokens),
                                 lp(w.output_tokens), w.prefix_tokens, w.arrival, w.arrival_cv)
        horizon = s.horizon
        reqs = generate_requests(spec, seed=s.seed, horizon=horizon, max_requests=w.num_requests)
    except ConfigError as exc:
        if exc.field and exc.field.startswith("--") and plan.src.path:
            f = BY_NAME.get(exc.field)
            if f is not None and f.path and f.path not in plan.origin:
                exc = ConfigError(exc.problem, field=f.path)
        raise plan.attribute(exc) from None
    return reqs, horizon, None, s.seed


def spec_workload(plan: Plan, *, check_only: bool = False) -> tuple[list, int, object | None, int]:
    """A workload-spec workload (``--workload-spec`` / ``kind: spec``; docs/workloads.md): the
    spec's ``seed`` unless ``--seed`` (or the scenario's ``seed`` key) is given; its
    ``horizon`` (if > 0) unless ``--horizon`` / ``horizon_us`` is; its ``num_requests``
    unless ``--num-requests`` / ``workload.num_requests`` is. Errors point into the spec
    file, or at ``workload.spec.…`` of the scenario for an inline spec. ``check_only``
    (``validate``): every check, no request generated (returns no requests)."""
    from blis_simpy.workload import _yaml, generate_workload
    from blis_simpy.workload.generator import check_workload
    from blis_simpy.workload.spec import parse_workload_spec
    s = plan.scenario
    w = s.workload
    node = None
    if w.path:
        path = w.path
        try:
            data, node = _yaml.load_yaml(path)
        except ConfigError as exc:
            flag = plan.origin.get("workload.path")
            raise (ConfigError(exc.problem, file=exc.file, line=exc.line, field=flag)
                   if flag and exc.line is None else exc) from None
        base = os.path.dirname(path)
    else:
        path, data = None, w.spec
        base = os.path.dirname(plan.src.path) if plan.src.path else None

    def located(exc: ConfigError) -> ConfigError:
        if exc.file or not exc.field:
            return exc
        if path is not None:
            return _yaml.locate(exc, path, node)
        return ConfigError(exc.problem, file=plan.src.path,
                           line=plan.src.line(("workload", "spec") + _yaml.parse_field(exc.field)),
                           field=f"workload.spec.{exc.field}")

    seed_given = "--seed" in plan.given or plan.src.has(("seed",))
    seed = s.seed if seed_given else None
    try:
        spec = parse_workload_spec(data, path, node)
        if check_only:
            check_workload(spec, horizon=s.horizon_us, max_requests=w.num_requests, base_dir=base)
            return [], 0, None, 0
        wl = generate_workload(spec, seed=seed, horizon=s.horizon_us, max_requests=w.num_requests,
                               base_dir=base)
    except ConfigError as exc:
        raise located(exc) from None
    return wl.requests, wl.horizon_us, wl.session_manager(), wl.seed


def execute(plan: Plan, progress: Callable[[int, int], None] | None = None, *,
            outputs: Batch | None = None, interruptible: bool = False) -> Outcome:
    """Build the requests, run the simulation, and assemble the report.

    ``outputs``: stage the run's files (``--requests-out``, ``--timeline``) in this batch, for
    the caller to commit with its own (all-or-nothing); None commits them here.
    ``interruptible``: the first Ctrl-C (SIGINT) during the simulation ends it between two
    events and returns the partial outcome (``interrupted`` True, no file written)."""
    s = plan.scenario
    if plan.pending_plugins:
        raise ConfigError(plugin_optin.refusal(plan.pending_plugins), file=plan.src.path,
                          field="plugins")
    load_plugins(s.plugins, source=plan.src.path, folders=plan.plugin_dirs)
    requests, horizon, sessions, workload_seed = build_workload(plan, lazy=True)
    try:
        sim = Simulation(s, requests, horizon_us=horizon, sessions=sessions)
    except ConfigError as exc:
        raise plan.attribute(exc) from None
    tap = streaming.start(plan, sim)     # --streaming-metrics, --requests-out
    from blis_simpy.cli import timeline_out
    batch = Batch() if outputs is None else outputs
    try:
        timeline = timeline_out.start(plan, sim)   # --timeline (docs/planning.md, "Reports")
        out = _run(plan, sim, tap, requests, horizon, sessions, workload_seed, progress,
                   batch, interruptible)
        if out.interrupted:
            tap.abort()
            return out
        timeline.commit(out, batch)
        if outputs is None:
            batch.commit()
        return out
    except BaseException:
        tap.abort()
        batch.abort()
        raise


class _Stop(Exception):
    """Raised by the Ctrl-C event: the simulation stops between two events."""


def _raise_stop(_arg) -> None:
    raise _Stop


@contextlib.contextmanager
def _ctrl_c_stops(sim: Simulation, enabled: bool):
    """While the simulation runs, the first SIGINT schedules an event at the current time
    that raises :class:`_Stop` when processed (so the run ends between two events, its state
    whole); a second SIGINT interrupts at once (KeyboardInterrupt), and so does the first
    while a plugin's code runs (it may never return). Yields a list that holds
    the signal once it came. Off (yields an empty list) unless ``enabled`` and in the main
    thread with Python's default SIGINT handler."""
    import signal
    import threading
    hit: list[int] = []
    if (not enabled or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield hit
        return

    def on_sigint(signum, frame):
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if running_plugin(frame) is not None:    # it may never return to the event loop
            raise KeyboardInterrupt
        hit.append(signum)
        sim.env.call_at(sim.env.now, 0, _raise_stop)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield hit
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _partial_result(sim: Simulation) -> SimulationResult:
    """The result of a run stopped by Ctrl-C at ``sim.env.now`` (as a horizon there would
    have stopped it; the end-of-run invariants are not checked)."""
    from blis_simpy.cluster.pd import finish_pd
    now = int(sim.env.now)
    metrics = [inst.finalize() for inst in sim.instances]
    sessions = (sim.sessions.finalize(stopped_at_horizon=True, end_us=now)
                if sim.sessions is not None else None)
    cluster = pd = None
    if sim.plan.enabled:
        cluster, pd = finish_pd(sim.cluster, metrics, sim.plan)
    return SimulationResult(sim.scenario, metrics, sim.cluster.counters, now, 0, 0.0, sim.trace,
                            sessions, cluster=cluster, pd=pd, gpus=sim.gpus, tp=sim.tp,
                            end_states=sim.end_states(metrics, cluster))


def _run(plan, sim, tap, requests, horizon, sessions, workload_seed, progress, batch,
         interruptible) -> Outcome:
    s = plan.scenario
    with _ctrl_c_stops(sim, interruptible) as hit:
        try:
            result = sim.run(progress=progress)
        except _Stop:
            result = _partial_result(sim)
        except ConfigError as exc:     # a plugin misbehaved: locate its scenario key or flag
            raise plan.attribute(exc) from None
    interrupted = bool(hit)
    tap.finish(result.instances)
    c = result.counters
    report = Report(result.instances, cluster=result.cluster, pd=result.pd,
                    num_instances=s.cluster.num_instances,
                    rejected_by_admission=c.rejected_by_admission,
                    rejected_at_routing=c.rejected_at_routing, shed_by_tier=dict(c.shed_by_tier),
                    priority_policy=s.engine.priority_policy, is_replay=plan.command == REPLAY)
    if result.end_states is not None:      # where every offered request ended (the balance)
        report.request_accounting = result.end_states.to_dict()
    add_optional_sections(plan, result, report)
    slo_cost.attach(plan.scenario, sim, result, report)   # SLOs, GPUs and cost (docs/metrics.md)
    if plan.command == REPLAY and s.horizon_us is None and not interrupted:
        warn_unfinished(len(requests), report, horizon, streaming.last_arrival_us(requests))
    blocks = [inst.kv.total_blocks for inst in sim.instances]
    report.total_kv_blocks = blocks[0] if len(set(blocks)) == 1 else blocks
    offload = [kv.offload_stats() for kv in (inst.kv for inst in sim.instances)
               if hasattr(kv, "offload_stats")]
    report.kv_offload = offload or None
    cap = sim.plan.global_deployment.kv_capacity
    report.kv_capacity = cap.to_dict() if cap is not None else None
    report.sessions = result.sessions    # how the closed-loop sessions ended (tables, JSON)
    from blis_simpy.cli.capacity_cmd import run_header_line
    if not interrupted:
        tap.commit(report, batch)
    return Outcome(plan, result, report, requests, horizon, sessions, workload_seed,
                   kv_line=run_header_line(sim.plan), interrupted=interrupted)


def add_optional_sections(plan: Plan, result: SimulationResult, report: Report) -> None:
    """Trace summary (``trace.summarize``) and fitness (``fitness_weights``; BLIS's replay
    ignores ``--fitness-weights`` with a warning, as BLIS's does)."""
    s = plan.scenario
    if result.trace is not None and s.trace.summarize:
        report.trace_summary = result.trace.summary()
    weights = s.fitness_weights
    if weights and plan.command == REPLAY and plan.origin.get("fitness_weights") == "--fitness-weights":
        log.warning("--fitness-weights is ignored by replay")
        weights = {}
    if weights:
        report.fitness = compute_fitness(report.cluster, weights)


# ---------------------------------------------------------------------------- files
def write_results_file(out: Outcome, path: str, batch: Batch | None = None) -> None:
    """``--results-path``: run → MetricsOutput + rows; replay → SimResult array (docs/metrics.md).
    With ``batch``, staged to commit with the batch's other outputs."""
    if out.plan.command == REPLAY:
        obj = replay_results(out.report.cluster)
    else:
        obj = metrics_output(out.report.cluster, include_requests=True) | planning_part(out.report)
    write_results(path, obj, field="--results-path", batch=batch)


def export_trace(out: Outcome, prefix: str, batch: Batch | None = None) -> None:
    """``--trace-output PREFIX``: the run's workload as TraceV2 (docs/workloads.md, "TraceV2");
    with ``batch``, staged to commit with the batch's other outputs."""
    from blis_simpy.workload import TraceHeader, TraceRecord, write_trace
    s = out.plan.scenario
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
