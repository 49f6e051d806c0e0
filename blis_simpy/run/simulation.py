"""Build a cluster from a :class:`~blis_simpy.config.scenario.Scenario` and run it.

This is the library entry point the CLI uses::

    sim = Simulation(scenario, requests, horizon_us=...)
    result = sim.run()

The classes it builds are registered by name and chosen by scenario keys:
``engine.implementation`` (instances: ``fast``, ``reference``), ``cluster.implementation``
(``standard``, ``pd``) and ``disaggregation.transfer.fabric`` (``default``). A user subclass
that declares ``name="..."`` is selectable by that name; ``Simulation(...,
instance_class=, cluster_class=, fabric_class=)`` passes classes directly (docs/extending.md).

At the end of every run the invariants (docs/determinism.md) are checked (conservation per
instance and over the pipeline, causality per request, KV conservation); a violation raises
:class:`~blis_simpy.errors.InvariantError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import blis_simpy.admission  # noqa: F401  (registers the built-in admission policies)
import blis_simpy.routing  # noqa: F401  (registers the built-in routers and scorers)
from blis_simpy.cluster.autoscaler import Autoscaler, AutoscaleRecord, ScaledPool, Unit
from blis_simpy.cluster.clients import ClosedLoopClients
from blis_simpy.cluster.cluster import Cluster, ControlPlaneCounters
from blis_simpy.cluster.invariants import (
    RequestEndStates,
    check_autoscale,
    check_causality,
    check_end_states,
    check_gateway_conservation,
    check_instance_conservation,
    check_pipeline_conservation,
)
from blis_simpy.cluster.pd import PDCluster, build_pd_cluster, finish_pd
from blis_simpy.cluster.plugin_checks import (
    PLUGIN_FIELDS,
    check_instance,
    guarded,
    plugin_failure,
    with_plugin_hint,
)
from blis_simpy.cluster.policies import (
    build_admission,
    build_autoscale_policy,
    build_gateway_policy,
    build_router,
)
from blis_simpy.config.scenario import FRONTEND_CHECKOUT, Scenario
from blis_simpy.deploy.loading import loading_delay_us
from blis_simpy.deploy.pools import resolve_pools
from blis_simpy.deploy.resolve import Deployment, resolve
from blis_simpy.des import SimEnv
from blis_simpy.disagg.fabric import KVTransferFabric
from blis_simpy.engine import tally
from blis_simpy.engine.batching import BatchingPolicy
from blis_simpy.engine.dp import DPEngine
from blis_simpy.engine.fast import FastInstance  # noqa: F401  (registers engine implementation "fast")
from blis_simpy.engine.frontend import FrontEnd
from blis_simpy.engine.instance import Instance
from blis_simpy.engine.limits import EngineLimits
from blis_simpy.engine.scheduling import PriorityPolicy, Scheduler
from blis_simpy.engine.stall import watch_for_stall
from blis_simpy.errors import BlisError, ConfigError, InvariantError, SimulationError
from blis_simpy.latency.frontend import FrontendParams
from blis_simpy.latency.interference import InterferenceModel
from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.rng import RngStreams
from blis_simpy.units import seconds_to_us

if TYPE_CHECKING:
    from blis_simpy.trace import DecisionTrace

log = logging.getLogger("blis_simpy")


@dataclass
class SimulationResult:
    """Everything a report needs. Times in µs."""

    scenario: Scenario
    instances: list[InstanceMetrics]
    counters: ControlPlaneCounters
    horizon_us: int
    events_processed: int
    wall_s: float = 0.0      # wall-clock seconds of the run (diagnostics only, never printed)
    trace: DecisionTrace | None = None   # with trace level "decisions"
    sessions: object | None = None       # SessionCounters of closed-loop sessions (docs/workloads.md)
    #: PD runs: the cluster record corrected and projected to parents (docs/disaggregation.md), and the
    #: PD metrics; None otherwise (the report then aggregates the instances itself)
    cluster: InstanceMetrics | None = None
    pd: object | None = None
    gpus: int = 0        # GPUs the deployment uses: instances x TP x DP (pools summed)
    tp: int = 0          # TP of every instance (0 when prefill/decode pools differ)
    #: where every offered request is at the end (a balance checked at the end of every run)
    end_states: RequestEndStates | None = None
    #: what the autoscaler did (:class:`~blis_simpy.cluster.autoscaler.AutoscaleRecord`); None without one
    autoscale: AutoscaleRecord | None = None


def component_classes(scenario: Scenario, pools: bool, *, instance_class: type[Instance] | None = None,
                      cluster_class: type[Cluster] | None = None,
                      fabric_class: type[KVTransferFabric] | None = None,
                      ) -> tuple[type[Instance], type[Cluster], type[KVTransferFabric]]:
    """The instance, cluster and fabric classes of a run: the ones given, else the registered
    names of ``engine.implementation``, ``cluster.implementation`` (unset: ``pd`` with
    prefill/decode pools — ``pools`` — else ``standard``) and
    ``disaggregation.transfer.fabric``. A bad name, or a cluster class that does not fit the
    topology, is a :class:`ConfigError` on that key; a given class of the wrong kind a
    TypeError."""
    for given, base in ((instance_class, Instance), (cluster_class, Cluster),
                        (fabric_class, KVTransferFabric)):
        if given is not None and not (isinstance(given, type) and issubclass(given, base)):
            raise TypeError(f"expected a subclass of {base.__name__}, got {given!r}")
    inst = instance_class or Instance.lookup(scenario.engine.implementation,
                                             field="engine.implementation")
    fabric = fabric_class or KVTransferFabric.lookup(scenario.disaggregation.transfer.fabric,
                                                     field="disaggregation.transfer.fabric")
    name = scenario.cluster.implementation
    cluster = cluster_class
    if cluster is None:
        cluster = Cluster.lookup(name, field="cluster.implementation") if name is not None else (
            PDCluster if pools else Cluster)
    if pools and not issubclass(cluster, PDCluster):
        raise ConfigError(f"cluster {cluster.name!r} cannot run prefill/decode pools: use pd or a "
                          "subclass of PDCluster", field="cluster.implementation")
    if not pools and issubclass(cluster, PDCluster):
        raise ConfigError(f"cluster {cluster.name!r} needs prefill/decode pools "
                          "(disaggregation.prefill_instances and decode_instances > 0)",
                          field="cluster.implementation")
    return inst, cluster, fabric


def with_built_instances(scenario: Scenario) -> Scenario:
    """``scenario`` as the simulation builds it: with an autoscaler, ``max_instances``
    instances (``cluster.num_instances``) of which ``initial_instances`` (resolved) serve at
    time 0 — with prefill/decode pools, each pool's ``max_instances``
    (``disaggregation.<pool>_instances``) and every pool's bounds resolved in
    ``cluster.autoscaler.pools``; without one, unchanged."""
    cl = scenario.cluster
    a = cl.autoscaler
    if a is None:
        return scenario
    d = scenario.disaggregation
    if d.enabled:
        bounds = a.pool_bounds({"prefill": d.prefill_instances, "decode": d.decode_instances})
        p, q = bounds["prefill"].max_instances, bounds["decode"].max_instances
        if (a.pools == bounds and (d.prefill_instances, d.decode_instances) == (p, q)
                and cl.num_instances == p + q):
            return scenario
        auto = a.model_copy(update={"pools": bounds})
        return scenario.model_copy(update={
            "cluster": cl.model_copy(update={"num_instances": p + q, "autoscaler": auto}),
            "disaggregation": d.model_copy(update={"prefill_instances": p, "decode_instances": q})})
    if cl.num_instances == a.max_instances and a.initial_instances is not None:
        return scenario
    auto = a.model_copy(update={"initial_instances": cl.initial_instances})
    return scenario.model_copy(update={"cluster": cl.model_copy(update={
        "num_instances": a.max_instances, "autoscaler": auto})})


def build_autoscaler(sim: Simulation, scenario: Scenario, layout) -> Autoscaler:
    """The autoscaler of ``sim`` (built, not yet run; ``scenario`` as
    :func:`with_built_instances` gives it): one pool, or with prefill/decode pools one per
    pool, each with its bounds, GPUs per instance and loading delay."""
    a = scenario.cluster.autoscaler
    policy = build_autoscale_policy(scenario)
    dp = scenario.dp
    units = [Unit(e, sim.instances[e * dp:(e + 1) * dp])
             for e in range(len(sim.instances) // dp)]
    if layout.enabled:
        pools = []
        initial = {}
        for name, b in a.pools.items():
            d = layout.deployments[name]
            members = [units[k] for k in layout.members(name)]
            pools.append(ScaledPool(name, members, b.min_instances, b.max_instances,
                                    max(d.tp, 1) * dp, loading_delay_us(scenario, d)))
            initial[name] = b.initial_instances
        pools.sort(key=lambda p: p.units[0].index)
    else:
        d = layout.global_deployment
        pools = [ScaledPool("", units, a.min_instances, a.max_instances, max(d.tp, 1) * dp,
                            loading_delay_us(scenario, d))]
        initial = {"": a.initial_instances}
    return Autoscaler(sim.env, sim.cluster, pools, policy, interval_us=seconds_to_us(a.interval_s),
                      initial=initial, dp=dp,
                      max_num_running_reqs=scenario.engine.max_num_running_reqs,
                      horizon_us=sim.horizon_us)


class Simulation:
    """One cluster of instances on a shared SimPy clock, fed with ``requests``.

    With ``scenario.dp > 1`` every configured instance is an engine of ``dp`` ranks, each
    an instance of its own (``instances[e * dp + r]``), tied together by a
    :class:`~blis_simpy.engine.dp.DPEngine` in ``engines`` (front door; lockstep for MoE
    models). Prefill/decode pools with ``dp > 1`` are refused (ConfigError on ``dp``).

    ``sessions``: an optional :class:`~blis_simpy.workload.sessions.SessionManager` of
    closed-loop sessions; it sees every terminal event and its follow-ups enter the cluster
    as ClusterArrivals (docs/workloads.md). Its accounting is checked at the end (INV-11).

    ``instance_class`` (an :class:`~blis_simpy.engine.instance.Instance` subclass),
    ``cluster_class`` (a :class:`~blis_simpy.cluster.cluster.Cluster` subclass; a
    :class:`~blis_simpy.cluster.pd.PDCluster` one with prefill/decode pools) and
    ``fabric_class`` (a :class:`~blis_simpy.disagg.fabric.KVTransferFabric` subclass) replace
    the classes the scenario names (see :func:`component_classes`).
    """

    def __init__(self, scenario: Scenario, requests: list, *, horizon_us: int | None = None,
                 deployment: Deployment | None = None, sessions=None,
                 instance_class: type[Instance] | None = None,
                 cluster_class: type[Cluster] | None = None,
                 fabric_class: type[KVTransferFabric] | None = None):
        try:
            self._build(scenario, requests, horizon_us, deployment, sessions, instance_class,
                        cluster_class, fabric_class)
        except (BlisError, KeyboardInterrupt):
            raise
        except BaseException as exc:   # a plugin's constructor: an exception or sys.exit()
            failure = plugin_failure(exc)
            if failure is None:
                raise
            raise failure from None

    def _build(self, scenario, requests, horizon_us, deployment, sessions, instance_class,
               cluster_class, fabric_class) -> None:
        scenario = with_built_instances(scenario)
        self.scenario = scenario
        self.deployment = dep = deployment if deployment is not None else resolve(scenario)
        self.requests = requests
        self.horizon_us = horizon_us if horizon_us is not None else scenario.horizon
        self.env = SimEnv(self.horizon_us)
        eng = scenario.engine
        self.pools = layout = resolve_pools(scenario, deployment=dep)
        sched_cls = Scheduler.lookup(eng.scheduler, field="engine.scheduler")
        prio_cls = PriorityPolicy.lookup(eng.priority_policy, field="engine.priority_policy")
        batching_cls = BatchingPolicy.lookup(eng.batching, field="engine.batching")
        batching_params = batching_cls.parse_params(eng.batching_params, field="engine.batching_params")
        new_batching = guarded(batching_cls, "engine.batching")
        inst_cls, cluster_cls, fabric_cls = component_classes(
            scenario, layout.enabled, instance_class=instance_class, cluster_class=cluster_class,
            fabric_class=fabric_class)
        self.instance_class, self.cluster_class, self.fabric_class = inst_cls, cluster_cls, fabric_cls
        new_instance = guarded(inst_cls, "engine.implementation")
        dp = scenario.dp
        if dp > 1 and layout.enabled:
            raise ConfigError("data parallelism (dp > 1) is not supported with prefill/decode "
                              "pools; use dp 1 or more instances", field="dp")
        self.instances: list[Instance] = []
        #: data-parallel engines (dp > 1): instance ``e * dp + r`` is rank r of engine e
        self.engines: list[DPEngine] = []
        self.gpus = 0                      # instances x TP x DP
        tps = set()
        for e in range(scenario.cluster.num_instances):
            d = layout.deployment_for(e)
            tps.add(max(d.tp, 1))
            self.gpus += max(d.tp, 1) * dp
            ranks = []
            for k in range(e * dp, (e + 1) * dp):
                limits = EngineLimits(     # per rank, as vLLM's per-core scheduler limits
                    max_num_running_reqs=eng.max_num_running_reqs,
                    max_num_scheduled_tokens=eng.max_num_scheduled_tokens,
                    long_prefill_token_threshold=eng.long_prefill_token_threshold,
                    max_model_len=d.max_model_len, preemption_model=eng.preemption_model,
                    async_scheduling=eng.async_scheduling, step_model=eng.step_model)
                latency = d.new_latency_model()
                if layout.interference:          # every instance, pools or not (disaggregation.md)
                    latency = InterferenceModel(latency, layout.interference_prefill,
                                                layout.interference_decode)
                kv = d.new_kv_cache()          # per rank: each DP rank has its own KV pool
                try:
                    inst = new_instance(self.env, k, limits, latency, kv, sched_cls(), prio_cls(),
                                        batching=new_batching(batching_params))
                except ValueError as exc:
                    raise ConfigError(str(exc), field="engine.max_model_len") from None
                inst.model = scenario.model
                if not inst._blis_builtin:    # what a plugin engine class returns is checked
                    check_instance(inst)
                self._attach_frontend(inst, scenario)
                watched = next((p for p in (inst.batching, inst.kv, inst) if not p._blis_builtin),
                               None)
                if watched is not None:    # a plugin may schedule nothing forever
                    watch_for_stall(inst, watched, field=PLUGIN_FIELDS[type(watched).family])
                ranks.append(inst)
            self.instances.extend(ranks)
            if dp > 1:                     # MoE ranks step in lockstep; dense ones do not
                moe = d.model_config is not None and d.model_config.is_moe
                self.engines.append(DPEngine(self.env, e, ranks, lockstep=moe))
        self.tp = tps.pop() if len(tps) == 1 else 0
        cl = scenario.cluster
        self.rng = RngStreams(scenario.seed)
        self.admission = build_admission(scenario)
        self.router = build_router(scenario, self.rng, dep.block_size)
        tr = scenario.trace
        # the summary implies the trace (docs/metrics.md, "Decision trace")
        self.trace = None
        if tr.level == "decisions" or tr.summarize:
            from blis_simpy.trace import DecisionTrace  # only a traced run loads the trace
            self.trace = DecisionTrace(tr.counterfactual_k)
        if self.trace is None and tr.counterfactual_k > 0:
            log.warning("counterfactual k = %d has no effect without trace level decisions",
                        tr.counterfactual_k)
        common = dict(admission_latency_us=cl.admission_latency_us,
                      routing_latency_us=cl.routing_latency_us,
                      snapshot_refresh_interval_us=cl.snapshot_refresh_interval_us,
                      trace=self.trace)
        new_cluster = guarded(cluster_cls, "cluster.implementation")
        if layout.enabled:
            self.cluster = build_pd_cluster(
                self.env, self.instances, self.admission, self.router, layout, scenario, self.rng,
                dep.block_size, cluster_class=new_cluster,
                fabric_class=guarded(fabric_cls, "disaggregation.transfer.fabric"), **common)
        else:
            self.cluster = new_cluster(self.env, self.instances, self.admission, self.router,
                                       **common)
        self.sessions = sessions
        self.cluster.sessions = sessions
        if cl.gateway is not None:
            self.cluster.attach_gateway(build_gateway_policy(scenario), cl.gateway)
        if isinstance(sessions, ClosedLoopClients):   # closed-loop clients start on the clock
            sessions.attach(self.cluster)
        #: the autoscaler (docs/control-plane.md, "Autoscaling"), or None
        self.autoscaler = None
        if cl.autoscaler is not None:
            self.autoscaler = build_autoscaler(self, scenario, layout)

    def _attach_frontend(self, inst: Instance, scenario: Scenario) -> None:
        """Put an API server in front of ``inst`` (docs/frontend.md): the scenario's
        ``frontend`` costs, else its latency model's; none when every cost is 0."""
        params = scenario.frontend
        if params is None:
            params = inst.latency.frontend_params()
            if params is not None and not isinstance(params, FrontendParams):
                raise ConfigError(f"frontend_params() returned {type(params).__name__}; expected "
                                  "a FrontendParams or None", field="latency.model")
        if params is None or not params.active:
            return
        if scenario.disaggregation.enabled and scenario.disaggregation.compat == "checkout":
            raise ConfigError(f"the latency model's API server {FRONTEND_CHECKOUT}",
                              field="latency.model")
        FrontEnd(self.env, inst, params, client=scenario.metrics.measured_at == "client")

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimulationResult:
        """Run to the horizon (or until no event is left), then finalize and check.

        An exception raised by a plugin's own code (an instance hook, a cluster, fabric,
        latency model, KV cache, batching policy or decider method) is that plugin's one-line
        :class:`ConfigError` on the key that chose it (docs/extending.md, "When a plugin
        misbehaves"); the one place it is caught keeps built-in classes' hot paths as they are."""
        try:
            return self._run(progress)
        except SimulationError as exc:
            raise with_plugin_hint(exc, self.cluster, self.instances) from None
        except (BlisError, KeyboardInterrupt):
            raise
        except BaseException as exc:   # an exception, or sys.exit() / GeneratorExit, ...
            failure = plugin_failure(exc)
            if failure is not None:
                raise failure from None
            if not isinstance(exc, Exception):
                raise
            # our code failed, maybe on what a plugin did (no plugin frame raised it)
            hinted = with_plugin_hint(exc, self.cluster, self.instances)
            if hinted is exc:
                raise
            log.debug("internal error in a run that calls plugin code", exc_info=True)
            raise hinted from exc

    def _run(self, progress: Callable[[int, int], None] | None) -> SimulationResult:
        env = self.env
        t0 = time.perf_counter()
        tally.reset()       # per-request warnings: one line per cause when the run ends
        self.cluster.start(self.requests)
        limit = self.horizon_us
        peek = env.peek
        step = env.step
        n = 0
        try:
            if progress is None:
                while peek() <= limit:
                    step()
                    n += 1
            else:
                while peek() <= limit:
                    step()
                    n += 1
                    if not n & 0x3FFF:
                        progress(self._done_requests(), self.cluster.counters.offered)
                progress(self._done_requests(), self.cluster.counters.offered)
        except BlisError as exc:
            # SimPy re-raises a process's failure as a copy, type(exc)(*exc.args), which loses
            # a located error's file and field: raise the original (kept as the copy's cause)
            cause = exc.__cause__
            if type(cause) is type(exc):
                raise cause from None
            raise
        tally.flush()
        metrics = [inst.finalize() for inst in self.instances]
        sessions = None
        if self.sessions is not None:   # INV-11; in-flight rounds cut by the horizon end here
            sessions = self.sessions.finalize(stopped_at_horizon=peek() != float("inf"),
                                              end_us=min(env.now, limit))
        self._check_invariants()
        self._check_inflight(metrics)
        cluster_metrics = pd = None
        if self.pools.enabled:
            client = frozenset(inst.id for inst in self.instances
                               if inst.frontend is not None and inst.frontend.client)
            cluster_metrics, pd = finish_pd(self.cluster, metrics, self.pools, client_instances=client)
        end = self.end_states(metrics, cluster_metrics)
        check_end_states(end)
        autoscale = self.finish_autoscaler()
        if autoscale is not None:
            check_autoscale(autoscale, self.instances, self.scenario.dp)
        return SimulationResult(self.scenario, metrics, self.cluster.counters, limit, n,
                                time.perf_counter() - t0, self.trace, sessions,
                                cluster=cluster_metrics, pd=pd, gpus=self.gpus, tp=self.tp,
                                end_states=end, autoscale=autoscale)

    def finish_autoscaler(self):
        """The autoscaler's record, its spans closed at the run's end (None without one): the
        horizon when an event after it was left, else the last event's time."""
        if self.autoscaler is None:
            return None
        env, limit = self.env, self.horizon_us
        end = limit if env.peek() != float("inf") else min(env.now, limit)
        return self.autoscaler.finish(int(end))

    def end_states(self, metrics: list[InstanceMetrics],
                   cluster: InstanceMetrics | None = None) -> RequestEndStates:
        """Where every offered request is now, from the finalized instance ``metrics`` (or,
        with PD pools, the corrected parent-level ``cluster`` record of
        :func:`~blis_simpy.cluster.pd.finish_pd`); see :class:`RequestEndStates`."""
        c = self.cluster.counters
        recs = [cluster] if cluster is not None else metrics
        pipeline = self.cluster.prefill_routed + c.routed + c.rejected_by_admission + c.rejected_at_routing
        gw = self.cluster.gateway
        extra = {}
        if gw is not None:      # the gateway queue's two end states (absent without one)
            extra = dict(still_in_gateway=gw.counters.queued, shed_gateway=gw.counters.shed)
            pipeline += gw.counters.queued + gw.counters.shed
        return RequestEndStates(
            offered=c.offered,
            completed=sum(m.completed_requests for m in recs),
            still_queued=sum(m.still_queued for m in recs),
            still_running=sum(m.still_running for m in recs),
            still_in_control_plane=c.arrived - pipeline,
            still_in_queueing_delay=sum(inst.in_queueing_delay for inst in self.instances),
            not_arrived=c.offered - c.arrived,
            dropped_unservable=sum(m.dropped_unservable for m in recs),
            timed_out=sum(m.timed_out_requests for m in recs),
            rejected_admission=c.rejected_by_admission,
            rejected_routing=c.rejected_at_routing, **extra)

    def _check_inflight(self, metrics) -> None:
        """In flight (routed, not yet done) ≠ still queued + running + in the queueing delay
        is only a warning (docs/control-plane.md)."""
        for inst, m in zip(self.instances, metrics, strict=True):
            left = self.cluster.inflight[inst.index]
            delayed = inst.in_queueing_delay
            # completed by the engine, last token not yet delivered by the front end
            undelivered = inst.frontend.undelivered if inst.frontend is not None else 0
            if left != m.still_queued + m.still_running + delayed + undelivered:
                log.warning("%s: %d requests in flight at the end, but %d queued + %d running + "
                            "%d in the queueing delay or front end + %d undelivered", inst.id,
                            left, m.still_queued, m.still_running, delayed, undelivered)

    def _done_requests(self) -> int:
        """Offered requests that have ended (the progress bar's count). With PD pools a
        disaggregated request ends on its decode instance: the prefill sub-requests that
        completed and were handed on are not counted again."""
        c = self.cluster.counters
        done = c.rejected_by_admission + c.rejected_at_routing
        if self.cluster.gateway is not None:
            done += self.cluster.gateway.counters.shed
        for inst in self.instances:
            m = inst.metrics
            done += m.completed_requests + m.dropped_unservable + m.timed_out_requests
        return done - getattr(self.cluster, "prefill_completed", 0)

    def _check_invariants(self) -> None:
        c = self.cluster.counters
        for inst in self.instances:
            check_instance_conservation(inst)
            check_causality(inst)
            try:
                inst.kv.check_invariants()
            except AssertionError as exc:
                raise InvariantError(str(exc), instance=inst.id) from None
        count_late = getattr(self.requests, "count_arriving_after", None)  # a lazy stream
        late = (count_late(self.horizon_us) if count_late is not None
                else sum(1 for r in self.requests if r.arrival_us > self.horizon_us))
        if self.sessions is not None:
            late += sum(1 for r in self.sessions.followups if r.arrival_us > self.horizon_us)
        not_arrived = c.offered - c.arrived
        if not_arrived != late:
            raise InvariantError(f"{not_arrived} requests never arrived, but {late} arrive after the horizon")
        pool_routed = self.cluster.prefill_routed
        decode_injected = self.cluster.decode_injected
        gw = self.cluster.gateway
        shed = 0
        if gw is not None:
            check_gateway_conservation(gw, c.admitted)
            shed = gw.counters.shed
        in_control_plane = (c.arrived - c.routed - pool_routed - c.rejected_by_admission
                            - c.rejected_at_routing - shed)
        if in_control_plane < 0:
            raise InvariantError(f"control-plane counters inconsistent: {c}")
        check_pipeline_conservation(c, self.instances, not_arrived + in_control_plane,
                                    pool_routed=pool_routed, decode_injected=decode_injected,
                                    shed_gateway=shed)
