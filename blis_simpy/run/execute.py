"""Run a :class:`~blis_simpy.run.describe.RunDescription` and assemble its report::

    RunDescription ─► requests (trace replay | generated) ─► Simulation.run
                   ─► SimulationResult ─► Report (+ SLO, cost, fitness, KV sections) ─► Outcome

:func:`execute` is what the CLI, the sweep and plan points (:mod:`blis_simpy.run.point`) run;
:func:`simulate` is the bare step (requests in, result out) for callers that bring their
own requests and deployment (the calibration twin, bench scripts). Errors are located on
the scenario key (:meth:`RunDescription.attribute`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from blis_simpy.atomic import Batch
from blis_simpy.errors import ConfigError
from blis_simpy.metrics.fitness import compute_fitness
from blis_simpy.metrics.report import Report
from blis_simpy.plugins import load_plugins, running_plugin
from blis_simpy.run import outputs as O
from blis_simpy.run import slo_cost
from blis_simpy.run.describe import PluginsRefused, RunDescription
from blis_simpy.run.load_shape import arrival_rate_changes
from blis_simpy.run.simulation import Simulation, SimulationResult
from blis_simpy.run.workload import build_workload, last_arrival_us

__all__ = ["Outcome", "execute", "simulate"]

log = logging.getLogger("blis_simpy.run")


@dataclass
class Outcome:
    """A finished run: its description, the simulation's result, the report and the
    requests it offered. ``pools``: the run's :class:`~blis_simpy.deploy.pools.PoolLayout`
    (its deployments: KV capacity, GPUs)."""

    description: RunDescription
    result: SimulationResult
    report: Report
    requests: list
    horizon_us: int
    sessions: object | None = None        # SessionManager of closed-loop sessions (docs/workloads.md)
    workload_seed: int | None = None      # seed the workload was generated with (None: scenario seed)
    pools: object | None = None           # the PoolLayout the run was built from
    interrupted: bool = False             # Ctrl-C ended the run: the report covers it so far
    #: ``outputs.stop_when_saturated``: the run was saturated at its last arrival and ended
    #: there (µs; None: it ran to its end)
    stopped_saturated_us: int | None = None


def simulate(scenario, requests, *, horizon_us: int | None = None, deployment=None, sessions=None,
             attach: Callable[[Simulation], object] | None = None,
             progress: Callable[[int, int], None] | None = None):
    """Run ``requests`` through ``scenario`` (``deployment``: a resolved
    :class:`~blis_simpy.deploy.resolve.Deployment` to use instead of resolving the scenario)
    to ``horizon_us`` (None: the scenario's); ``attach(sim)`` is called before the run (a monitor). Returns
    ``(sim, result)``: the finished :class:`Simulation` and its :class:`SimulationResult`."""
    sim = Simulation(scenario, requests, horizon_us=horizon_us, sessions=sessions,
                     deployment=deployment)
    if attach is not None:
        attach(sim)
    return sim, sim.run(progress=progress)


def execute(d: RunDescription, progress: Callable[[int, int], None] | None = None, *,
            outputs: Batch | None = None, interruptible: bool = False) -> Outcome:
    """Build the requests, run the simulation, and assemble the report.

    ``outputs``: stage the run's files (rows, timeline) in this batch, for the caller to
    commit with its own (all-or-nothing); None commits them here. ``interruptible``: the
    first Ctrl-C (SIGINT) during the simulation ends it between two events and returns the
    partial outcome (``interrupted`` True, no file written)."""
    s = d.scenario
    if d.pending_plugins:
        raise PluginsRefused(list(d.pending_plugins), file=d.src.path)
    load_plugins(s.plugins, source=d.src.path, folders=d.plugin_dirs)
    requests, horizon, sessions, workload_seed = build_workload(d, lazy=True)
    try:
        sim = Simulation(s, requests, horizon_us=horizon, sessions=sessions)
    except ConfigError as exc:
        raise d.attribute(exc) from None
    tap = O.start_rows(d, sim)
    batch = Batch() if outputs is None else outputs
    try:
        timeline = O.start_timeline(d, sim)
        out = _run(d, sim, tap, requests, horizon, sessions, workload_seed, progress,
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


class _Saturated(Exception):
    """Raised by the saturation check: the run is saturated at its last arrival."""


#: the run is tested for saturation at these fractions of its last arrival time
#: (``outputs.stop_when_saturated``)
SATURATION_CHECKS = (0.25, 0.5, 0.75, 1.0)


def _stop_if_saturated(sim: Simulation, last_us: int, rate_changes=None) -> None:
    """At a quarter, half, three quarters of ``last_us`` (the last pre-generated arrival) and
    at it, after every model event then, test the run so far (its arrivals up to then) for
    saturation (docs/metrics.md; per piece too, given where a time-varying load's rate
    changes, ``rate_changes`` in µs) and end it if saturated. With PD pools a parent's arrival
    and scheduling are its prefill sub-request's, its completion its decode sub-request's.
    Not with streamed metrics (they leave the records as requests complete)."""
    from blis_simpy.des import OBSERVER_AFTER
    if sim.scenario.metrics.streaming or last_us <= 0:
        return

    def check(_arg) -> None:
        probe = O.sim_probe(sim, [inst.metrics for inst in sim.instances])
        if probe.verdict(rate_changes).saturated:
            raise _Saturated
    for f in SATURATION_CHECKS:
        sim.env.call_at(int(last_us * f), OBSERVER_AFTER, check)


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
    if sim.pools.enabled:
        cluster, pd = finish_pd(sim.cluster, metrics, sim.pools)
    return SimulationResult(sim.scenario, metrics, sim.cluster.counters, now, 0, 0.0, sim.trace,
                            sessions, cluster=cluster, pd=pd, gpus=sim.gpus, tp=sim.tp,
                            end_states=sim.end_states(metrics, cluster),
                            autoscale=sim.finish_autoscaler())


def _run(d, sim, tap, requests, horizon, sessions, workload_seed, progress, batch,
         interruptible) -> Outcome:
    s = d.scenario
    stopped_us = None
    rate_changes = arrival_rate_changes(d, requests)   # None: not a time-varying open load
    if d.outputs.stop_when_saturated:
        _stop_if_saturated(sim, last_arrival_us(requests), rate_changes)
    with _ctrl_c_stops(sim, interruptible) as hit:
        try:
            result = sim.run(progress=progress)
        except _Stop:
            result = _partial_result(sim)
        except _Saturated:
            result = _partial_result(sim)
            stopped_us = result.horizon_us
        except ConfigError as exc:     # a plugin misbehaved: locate its scenario key
            raise d.attribute(exc) from None
    interrupted = bool(hit)
    tap.finish(result.instances)
    c = result.counters
    report = Report(result.instances, cluster=result.cluster, pd=result.pd,
                    num_instances=sim.scenario.cluster.num_instances,
                    rejected_by_admission=c.rejected_by_admission,
                    rejected_at_routing=c.rejected_at_routing, shed_by_tier=dict(c.shed_by_tier),
                    priority_policy=s.engine.priority_policy, is_replay=d.mode == "replay")
    if result.end_states is not None:      # where every offered request ended (the balance)
        report.request_accounting = result.end_states.to_dict()
    add_optional_sections(d, result, report)
    slo_cost.attach(s, sim, result, report)   # SLOs, GPUs and cost (docs/metrics.md)
    slo_cost.attach_gateway(s, sim, report)   # the gateway queue's results, if any
    blocks = [inst.kv.total_blocks for inst in sim.instances]
    report.total_kv_blocks = blocks[0] if len(set(blocks)) == 1 else blocks
    offload = [kv.offload_stats() for kv in (inst.kv for inst in sim.instances)
               if hasattr(kv, "offload_stats")]
    report.kv_offload = offload or None
    cap = sim.pools.global_deployment.kv_capacity
    report.kv_capacity = cap.to_dict() if cap is not None else None
    report.sessions = result.sessions    # how the closed-loop sessions ended (tables, JSON)
    report.saturation = tap.saturation(sim, result, rate_changes)   # docs/metrics.md, "Saturation"
    if report.saturation.saturated and not interrupted:
        log.warning("%s", report.saturation.warning())
    if not interrupted:
        tap.commit(report, batch)
    return Outcome(d, result, report, requests, horizon, sessions, workload_seed,
                   pools=sim.pools, interrupted=interrupted, stopped_saturated_us=stopped_us)


def add_optional_sections(d: RunDescription, result: SimulationResult, report: Report) -> None:
    """Trace summary (``trace.summarize``) and fitness (``fitness_weights``, unless the
    description's outputs turn it off)."""
    s = d.scenario
    if result.trace is not None and s.trace.summarize:
        report.trace_summary = result.trace.summary()
    if s.fitness_weights and d.outputs.fitness:
        report.fitness = compute_fitness(report.cluster, s.fitness_weights)
