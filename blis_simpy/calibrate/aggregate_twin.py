"""The simulated twin of an aggregate run (an inference-perf folder): its rebuilt workload
replayed stage by stage, as the client ran it.

inference-perf starts a stage's timer only once the previous stage has drained — every
request finished or given up — and a pause after that (docs/workloads.md, "inference-perf
results"). The twin does the same with its own drain: it simulates stages 0..k, takes the
time the last request of stage k left (its completion, its client deadline when it timed
out, its arrival when the engine refused it), starts stage k+1 ``run.pause_us`` later, and
simulates again with that stage added. The engine is idle between stages, so the run with
stages 0..k+1 repeats the run with stages 0..k exactly up to that point (the prefix cache
is carried over, as vLLM's is): K stages cost K simulations, and each stage's per-token
inter-token latencies are the difference of the engines' ITL histograms between two of them.

Each request is sent at its client send time (the scenario's ``metrics.measured_at`` says the
latencies are the client's: :func:`client_measured`)
with the client's deadline (``deadline_us``): the engine drops a request still queued or
running then (docs/engine.md, "Timeouts"), and one the engine completes after it — its last
step began before the deadline and ended after — is a failure too, since the client had
given up before its last token. Units: ``*_us`` integer µs, ``*_ms`` ms.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.resolve import Deployment, resolve
from blis_simpy.measured.inference_perf.rebuild import place
from blis_simpy.measured.run import AggregateRun, StageWindow
from blis_simpy.run.execute import simulate as run_requests
from blis_simpy.units import MAX_INT64
from blis_simpy.workload.replay import trace_requests


def client_measured(scenario: Scenario, measured_at: str) -> Scenario:
    """The one place an aggregate run's ``measured_at`` ("client": latencies from the client's
    send to its last chunk) reaches the scenario (``metrics.measured_at``, docs/frontend.md)."""
    metrics = scenario.metrics
    return scenario.model_copy(update={"metrics": metrics.model_copy(update={"measured_at": measured_at})})


@dataclass(frozen=True)
class SimRequest:
    """One rebuilt request in the twin: ``ok`` (completed), TTFT/E2E (ms; None when it
    failed), TPOT = (E2E − TTFT)/(output − 1) (ms; None for one output token), its output
    tokens and when it left (µs)."""

    ok: bool
    ttft_ms: float | None
    e2e_ms: float | None
    tpot_ms: float | None
    output_tokens: int
    left_us: int


@dataclass
class AggregateSim:
    """What the twin did: per record (same order as the placed records) a
    :class:`SimRequest`; the stages where the twin placed them; per stage the histogram of
    its per-token ITLs (µs: count) and when it drained (µs); totals of the last simulation."""

    requests: list[SimRequest] = field(default_factory=list)
    stages: list[StageWindow] = field(default_factory=list)
    itl_hist_us: list[Counter] = field(default_factory=list)
    drained_us: list[int] = field(default_factory=list)
    simulations: int = 0
    cache_hit_rate: float = 0.0
    preemptions: int = 0
    total_kv_blocks: int = 0


def _outcomes(records, result) -> tuple[list[SimRequest], Counter]:
    cluster = result.cluster
    metrics = [cluster] if cluster is not None else result.instances
    e2e, ttft, itl, done, registry = {}, {}, {}, {}, {}
    hist: Counter = Counter()
    for m in metrics:
        e2e.update(m.e2e)
        ttft.update(m.ttft)
        itl.update(m.itl)
        done.update(m.completion_time)
        registry.update(m.registry)
        hist.update(m.all_itls)
    out = []
    for r in records:
        k = f"request_{r.request_id}"
        if k in e2e and not 0 < r.deadline_us < done[k]:
            n = r.output_tokens
            out.append(SimRequest(True, ttft[k] / 1000.0, e2e[k] / 1000.0, itl[k] / 1000.0 if n > 1 else None,
                                  n, done[k]))
        else:       # the client gave up at its deadline, or the engine refused it on arrival
            left = r.deadline_us if (k in registry or k in e2e) and r.deadline_us else r.arrival_time_us
            out.append(SimRequest(False, None, None, None, r.output_tokens, left))
    return out, hist


def simulate_aggregate(scenario: Scenario, run: AggregateRun, *, deployment: Deployment | None = None,
                       progress: Callable[[int, int], None] | None = None) -> AggregateSim:
    """Replay ``run`` stage by stage through ``scenario`` (module docstring); ``deployment``: a
    resolved deployment to use instead of resolving the scenario (fit's candidates)."""
    scenario = client_measured(scenario, run.measured_at)
    dep = deployment if deployment is not None else resolve(scenario, quiet=True)
    out = AggregateSim()
    starts = [run.stages[0].start_us]
    cum: list[Counter] = []
    for k in range(len(run.stages)):
        records, windows = place(run.records[: run.stages[k].first + run.stages[k].count], run.stages[: k + 1],
                                 starts, run.timeout_us)
        sim, result = run_requests(scenario, trace_requests(records, scenario.seed),
                                   horizon_us=MAX_INT64, deployment=dep, progress=progress)
        reqs, hist = _outcomes(records, result)
        out.simulations += 1
        cum.append(hist)
        st = windows[k]
        drained = max((q.left_us for q in reqs[st.first: st.first + st.count]), default=st.end_us)
        out.drained_us.append(drained)
        starts.append(max(drained, st.end_us) + run.pause_us)
        if k == len(run.stages) - 1:
            out.requests, out.stages = reqs, windows
            hits = [m.cache_hit_rate for m in result.instances]
            out.cache_hit_rate = sum(hits) / len(hits) if hits else 0.0
            out.preemptions = sum(m.preemption_count for m in result.instances)
            out.total_kv_blocks = sum(i.kv.total_blocks for i in sim.instances)
    out.itl_hist_us = [cum[0]] + [cum[k] - cum[k - 1] for k in range(1, len(cum))]
    return out
