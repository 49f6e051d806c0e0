"""Admission and routing inside the arrival process, and the PD hand-offs and transfers with
fewer events (docs/architecture.md, "Keyed callbacks that remain"): the same order and
results as the keyed events, with exactly the events saved.

Each case runs twice: as shipped, and with ``SimEnv.quiet_through`` answering False, which
sends every decision and hand-off through its keyed event (the way before). Per-request
results and the decision trace must be equal; the event counts differ by what was done inline.
"""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy.des import SimEnv
from blis_simpy.request import Request
from blis_simpy.run.simulation import Simulation
from tests.cluster.helpers import request, scenario
from tests.disagg.test_pd_paths import pd_scenario


def _run(sc, reqs, monkeypatch, *, keyed: bool):
    with monkeypatch.context() as m:
        if keyed:
            m.setattr(SimEnv, "quiet_through", lambda self, key: False)
        sim = Simulation(sc, reqs)
        res = sim.run()
    rows = [(r.id, r.assigned_instance, r.state, r.enqueue_us, r.ttft_us, r.last_emit_us)
            for r in reqs]
    trace = [repr(x) for x in res.trace.admissions] + [repr(x) for x in res.trace.routings] \
        if res.trace is not None else []
    return sim, res, rows, trace


def test_standard_cluster_admits_and_routes_in_the_arrival_process(monkeypatch):
    """Six requests 10 ms apart are admitted and routed in their ClusterArrival (2 events
    fewer each); two arriving in the same µs (100 ms) keep their keyed AdmissionDecision and
    RoutingDecision events, because the second arrival comes in between (BLIS's order)."""
    def reqs():
        times = [0, 10_000, 20_000, 30_000, 40_000, 50_000, 100_000, 100_000]
        return [request(i, arrival=t, n_in=64, n_out=5, seed=i) for i, t in enumerate(times)]

    sc = scenario(n=2, routing="weighted", trace="decisions")
    _, fast, rows, trace = _run(sc, reqs(), monkeypatch, keyed=False)
    _, keyed, rows_k, trace_k = _run(sc, reqs(), monkeypatch, keyed=True)
    assert rows == rows_k and trace == trace_k and len(trace) == 16
    assert keyed.events_processed - fast.events_processed == 2 * 6
    assert fast.counters.routed == 8


def _pd_reqs(n: int):
    return [Request(f"r{i}", 20_000 * i, np.arange(1000 * i, 1000 * i + 100), np.arange(5) + 7)
            for i in range(n)]


@pytest.mark.parametrize("contention, saved", [
    # admission in the arrival process, the parent handed to the prefill pool at once, the
    # fabric's timed delivery serving the fabric process in its own event: 3 per request;
    # fair-share also resumes the transfer process from the link's timer (4)
    ("fair-share", 4), ("snapshot", 3), ("none", 3),
])
def test_pd_hand_offs_and_transfers_take_fewer_events_in_the_same_order(monkeypatch, contention,
                                                                         saved):
    """Four requests 20 ms apart on 1P1D (each alone in the pools): per request ``saved``
    fewer events; parents' phase times and every sub-request's timestamps equal."""
    sc = pd_scenario(transfer={"contention": contention})
    sim, fast, rows, _ = _run(sc, _pd_reqs(4), monkeypatch, keyed=False)
    sim_k, keyed, rows_k, _ = _run(sc, _pd_reqs(4), monkeypatch, keyed=True)
    phases = [p.phase_times() for p in sim.cluster.parents.values()]
    assert phases == [p.phase_times() for p in sim_k.cluster.parents.values()]
    assert rows == rows_k and len(phases) == 4
    assert [t.complete_us for t in sim.cluster.fabric.transfers] == \
        [t.complete_us for t in sim_k.cluster.fabric.transfers]
    assert keyed.events_processed - fast.events_processed == saved * 4


def test_pd_local_routing_runs_in_the_decision_process(monkeypatch):
    """Requests the decider keeps local (``never``) are routed to the decode pool by the
    decision process itself: admission and local routing, 2 events fewer per request."""
    sc = pd_scenario(decider="never")
    sim, fast, rows, _ = _run(sc, _pd_reqs(4), monkeypatch, keyed=False)
    _, keyed, rows_k, _ = _run(sc, _pd_reqs(4), monkeypatch, keyed=True)
    assert rows == rows_k and not sim.cluster.parents
    assert [r[1] for r in rows] == ["instance_1"] * 4          # the decode pool
    assert keyed.events_processed - fast.events_processed == 2 * 4
