"""The simulated twin of a measured run: replay its requests through a scenario, to the end.

:func:`scenario_data` turns a run's engine settings into scenario keys (the same keys a
scenario file has, so flags can override them); :func:`simulate` replays the run's TraceV2
rows of the requests it measured (real prompt token IDs where the run has them) with no
horizon, so every request finishes, and samples the engines once a simulated second (running, waiting, KV use) by the
timeline monitor (:class:`~blis_simpy.cluster.monitor.Monitor`, a read-only observer that
stops with the run), summed over the instances. Units: ``*_us`` integer µs, ``*_ms`` ms, ``*_s`` s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from blis_simpy.cluster.monitor import Monitor, Timeline
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.resolve import Deployment, resolve
from blis_simpy.measured.run import MeasuredRun, Settings
from blis_simpy.run.execute import simulate as run_requests
from blis_simpy.units import MAX_INT64
from blis_simpy.workload.replay import trace_requests

SAMPLE_PERIOD_US = 1_000_000


def scenario_data(st: Settings, name: str = "") -> dict:
    """Scenario keys for a run's engine settings (model, GPU, parallelism, vLLM limits, KV,
    the model's config.json folder when the run has one)."""
    eng = {"block_size": st.block_size, "max_num_running_reqs": st.max_num_seqs,
           "max_num_scheduled_tokens": st.max_num_batched_tokens,
           "max_model_len": st.max_model_len,
           "gpu_memory_utilization": st.gpu_memory_utilization}
    if st.kv_blocks is not None:
        eng["total_kv_blocks"] = st.kv_blocks
    data = {"name": name or "calibration", "seed": st.seed, "model": st.model,
            "hardware": st.hardware, "tp": st.tp, "dp": st.dp,
            "enable_expert_parallel": st.expert_parallel, "engine": eng}
    if st.model_config_folder:
        data["model_config_folder"] = st.model_config_folder
    return data


def latency_used(dep: Deployment) -> str:
    """Which coefficients time the steps of ``dep``: a backend's coefficient set by name, or
    the alpha/beta lists (µs) of a blackbox-style backend; "" when the backend has neither."""
    lat = dep.new_latency_model()
    name = getattr(getattr(lat, "coeffs", None), "name", "")
    if name:
        return f"coefficient set {name!r}"
    alpha, beta = getattr(lat, "alpha", None) or dep.alpha, getattr(lat, "beta", None) or dep.beta
    if beta:
        return f"alpha {[float(a) for a in alpha or ()]}, beta {[float(b) for b in beta]}"
    return ""


def fitted_on(dep: Deployment) -> list[str]:
    """The runs the coefficient set of ``dep`` was fitted on (its ``fit.runs``; empty for a
    set with no such record, or a backend without a set)."""
    fit = getattr(getattr(dep.new_latency_model(), "coeffs", None), "fit", None)
    runs = fit.get("runs") if isinstance(fit, dict) else None
    return [str(r) for r in runs] if isinstance(runs, list) else []


@dataclass
class Sample:
    """The engines at one instant: requests running and waiting, KV blocks in use (summed
    over instances) and the KV cache use in % of all blocks. ``t_s``: simulated seconds."""

    t_s: float
    running: int
    waiting: int
    kv_cache_pct: float


def _engine_samples(tl: Timeline) -> list[Sample]:
    """The timeline summed over the instances, one :class:`Sample` per sample time."""
    blocks = sum(tl.cols["kv_blocks_total"][:len(tl.instances)]) or 1
    used = tl.totals("kv_blocks_used")
    return [Sample(t / 1e6, r, w, 100.0 * u / blocks) for t, r, w, u in
            zip(tl.times_us, tl.totals("running"), tl.totals("waiting"), used, strict=True)]


@dataclass
class SimRun:
    """What the twin did. Per request (keyed by the run's request id): TTFT, E2E, TPOT (ms;
    TPOT only for > 1 output token) and scheduling delay (ms); the 1 s samples; totals."""

    ttft_ms: dict[str, float] = field(default_factory=dict)
    e2e_ms: dict[str, float] = field(default_factory=dict)
    tpot_ms: dict[str, float] = field(default_factory=dict)
    sched_ms: dict[str, float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    completed: int = 0
    offered: int = 0
    output_tokens: int = 0
    end_us: int = 0
    cache_hit_rate: float = 0.0
    preemptions: int = 0
    total_kv_blocks: int = 0


def measured_records(run: MeasuredRun) -> list:
    """The trace rows of the requests the run measured (``run.requests``): a failed request
    (status ``error``, e.g. a ``vllm bench`` request the server refused) or one with no
    output token has no real latency, and how long the server worked on it is unknown, so
    the twin does not replay it — completed counts then compare like with like."""
    measured = {r.trace_id for r in run.requests}
    return [r for r in run.records if r.request_id in measured]


def simulate(scenario: Scenario, run: MeasuredRun, *, deployment: Deployment | None = None,
             horizon_us: int = MAX_INT64, sample_period_us: int = SAMPLE_PERIOD_US,
             progress: Callable[[int, int], None] | None = None) -> SimRun:
    """Replay ``run.records`` through ``scenario`` (``deployment``: a resolved deployment to
    use instead of resolving the scenario, e.g. with fitted coefficients) and collect the
    twin's per-request latencies. ``sample_period_us`` 0 = no timeline. Only the requests
    the run measured are replayed (:func:`measured_records`)."""
    reqs = trace_requests(measured_records(run), scenario.seed)
    dep = deployment if deployment is not None else resolve(scenario, quiet=True)
    out = SimRun(offered=len(reqs))
    monitors: list[Monitor] = []

    def attach(sim) -> None:
        if sample_period_us > 0:
            monitors.append(Monitor(sim, sample_period_us))

    sim, result = run_requests(scenario, reqs, horizon_us=horizon_us, deployment=dep,
                               attach=attach, progress=progress)
    if monitors:
        out.samples = _engine_samples(monitors[0].timeline)
    by_trace = {f"request_{r.trace_id}": r.id for r in run.requests}
    cluster = result.cluster
    metrics = [cluster] if cluster is not None else result.instances
    for m in metrics:
        for k, e2e in m.e2e.items():
            rid = by_trace.get(k, k)
            out.e2e_ms[rid] = e2e / 1000.0
            out.ttft_ms[rid] = m.ttft[k] / 1000.0
            if m.registry[k].output_len > 1:
                out.tpot_ms[rid] = m.itl[k] / 1000.0
            if k in m.scheduling_delay:
                out.sched_ms[rid] = m.scheduling_delay[k] / 1000.0
            out.end_us = max(out.end_us, m.completion_time[k])
        out.completed += m.completed_requests
        out.output_tokens += sum(m.registry[k].output_len for k in m.e2e)
        out.preemptions += m.preemption_count
    hits = [m.cache_hit_rate for m in result.instances]
    out.cache_hit_rate = sum(hits) / len(hits) if hits else 0.0
    out.total_kv_blocks = sum(i.kv.total_blocks for i in sim.instances)
    return out
