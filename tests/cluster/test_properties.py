"""Property tests on random small clusters, policies and workloads (docs/determinism.md).

For every generated run (2–4 instances, random admission/routing/scheduling policies,
snapshot staleness, small KV caches that force preemption and drops, optional horizon and
deadlines) we check, independently of the simulator's own end-of-run checks:

* conservation — per instance and over the whole pipeline (INV-1);
* causality — arrival ≤ enqueue ≤ scheduling < first token ≤ completion (INV-5);
* KV capacity — no instance ever uses more blocks than it has, checked after every
  instance event (INV-4);
* accounting — every admitted request is completed, dropped, timed out, or (only with a
  horizon) still queued/running/in flight; the in-flight counts match what is left;
* determinism — the same inputs give the same outcome (INV-6).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_simpy.request import COMPLETED, DROPPED, QUEUED, RUNNING, TIMED_OUT, Request
from blis_simpy.run.simulation import Simulation
from tests.cluster.helpers import scenario

SLO = ["", "critical", "standard", "sheddable", "batch", "background"]


@st.composite
def admissions(draw):
    kind = draw(st.sampled_from(["always-admit", "always-admit", "token-bucket", "tier-shed", "reject-all"]))
    if kind == "token-bucket":
        return kind, {"capacity": draw(st.floats(200, 5000)), "refill_rate": draw(st.floats(1, 50_000))}
    if kind == "tier-shed":
        return kind, {"threshold": draw(st.integers(0, 6)), "min_priority": draw(st.integers(0, 4))}
    return kind, {}


@st.composite
def routings(draw):
    kind = draw(st.sampled_from(["round-robin", "least-loaded", "weighted", "always-busiest"]))
    tie = draw(st.sampled_from(["random", "first"]))
    if kind == "least-loaded":
        return kind, {"tie_break": tie}
    if kind == "weighted":
        names = draw(st.lists(st.sampled_from(["prefix-affinity", "queue-depth", "kv-utilization",
                                               "load-balance"]), min_size=1, max_size=4, unique=True))
        weights = [draw(st.floats(0.1, 5)) for _ in names]
        return kind, {"tie_break": tie, "scorers": [{"name": n, "weight": w} for n, w in zip(names, weights, strict=True)]}
    return kind, {}


@st.composite
def runs(draw):
    n = draw(st.integers(2, 4))
    adm, adm_p = draw(admissions())
    rt, rt_p = draw(routings())
    kv_blocks = draw(st.integers(12, 60))
    sc = scenario(
        n=n, admission=adm, admission_params=adm_p, routing=rt, routing_params=rt_p,
        kv_blocks=kv_blocks, max_running=draw(st.integers(1, 6)), block_size=draw(st.sampled_from([4, 8, 16])),
        refresh_us=draw(st.sampled_from([0, 0, 5_000, 200_000])),
        scheduler=draw(st.sampled_from(["fcfs", "priority-fcfs", "sjf", "reverse-priority"])),
        priority=draw(st.sampled_from(["constant", "slo-based", "inverted-slo"])),
        trace=draw(st.sampled_from(["none", "decisions"])), k=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**31)))
    sc.engine.implementation = draw(st.sampled_from(["fast", "reference"]))
    n_req = draw(st.integers(1, 30))
    prefixes = [np.arange(p * 1000, p * 1000 + 48) for p in range(3)]
    reqs_spec = []
    t = 0
    for i in range(n_req):
        t += draw(st.integers(0, 60_000))
        n_in = draw(st.integers(1, 200))
        n_out = draw(st.integers(0, 80))
        pfx = draw(st.sampled_from([None, 0, 1, 2]))
        deadline = draw(st.sampled_from([0, 0, 0, t + draw(st.integers(1, 2_000_000))]))
        reqs_spec.append((i, t, n_in, n_out, pfx, draw(st.sampled_from(SLO)), deadline))
    # a horizon, when there is one, cuts the run somewhere inside the arrivals or just after
    cut = 1 + int(draw(st.floats(0.05, 1.0)) * (t + 300_000))
    horizon = draw(st.sampled_from([None, None, cut]))
    return sc, reqs_spec, prefixes, horizon


def build(reqs_spec, prefixes):
    out = []
    for i, t, n_in, n_out, pfx, slo, deadline in reqs_spec:
        rng = np.random.default_rng(i)
        toks = rng.integers(0, 30000, size=n_in)
        if pfx is not None:
            k = min(n_in, len(prefixes[pfx]))
            toks[:k] = prefixes[pfx][:k]
        out.append(Request(f"request_{i}", t, toks, rng.integers(0, 30000, size=n_out),
                           slo_class=slo, deadline_us=deadline))
    return out


def simulate(sc, reqs, horizon):
    sim = Simulation(sc, reqs, horizon_us=horizon)
    overflow = []

    def check_kv(inst):
        kv = inst.kv
        if not 0 <= kv.used <= kv.total_blocks:
            overflow.append((inst.id, sim.env.now, kv.used, kv.total_blocks))

    sim.cluster.on_event_end = check_kv       # the instances' listener is the cluster
    return sim, sim.run(), overflow


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_cluster_invariants(run):
    sc, reqs_spec, prefixes, horizon = run
    reqs = build(reqs_spec, prefixes)
    sim, res, overflow = simulate(sc, reqs, horizon)
    assert not overflow, overflow
    c = res.counters
    bounded = horizon is not None

    # --- conservation over the pipeline, counted from the requests themselves
    routed = [r for r in reqs if r.assigned_instance]
    arrived = [r for r in reqs if not bounded or r.arrival_us <= horizon]
    assert c.offered == len(reqs)
    assert c.routed == len(routed)
    assert c.arrived == len(arrived)
    in_control_plane = c.arrived - c.routed - c.rejected_by_admission - c.rejected_at_routing
    assert in_control_plane >= 0
    if not bounded:
        assert in_control_plane == 0
    awaiting_routing = c.admitted - c.routed - c.rejected_at_routing
    assert 0 <= awaiting_routing <= in_control_plane
    assert c.rejected_at_routing == 0            # every request names no model
    if sc.cluster.admission.policy == "reject-all":
        assert c.routed == 0 and c.rejected_by_admission == c.arrived
    if not sim.admission.sheds_by_tier:
        assert c.shed_by_tier == {}
    else:
        assert sum(c.shed_by_tier.values()) == c.rejected_by_admission

    # --- per instance: injected = completed + queued + running + dropped + timed out (+ in delay)
    by_inst = {inst.id: [r for r in routed if r.assigned_instance == inst.id] for inst in sim.instances}
    for inst, m in zip(sim.instances, res.instances, strict=True):
        mine = by_inst[inst.id]
        assert m.injected_requests + inst.in_queueing_delay == len(mine) == inst.injected
        states = [r.state for r in mine]
        assert m.completed_requests == states.count(COMPLETED)
        assert m.timed_out_requests == states.count(TIMED_OUT)
        assert m.dropped_unservable == states.count(DROPPED)
        assert m.still_running == states.count(RUNNING)
        assert m.still_queued + inst.in_queueing_delay == states.count(QUEUED)
        # in-flight = what the instance still holds
        assert sim.cluster.inflight[inst.index] == m.still_queued + m.still_running + inst.in_queueing_delay
        assert m.peak_kv_blocks <= inst.kv.total_blocks
        inst.kv.check_invariants()

    # --- every admitted request is accounted for; without a horizon every one is finished
    for r in routed:
        if not bounded:
            assert r.state in (COMPLETED, DROPPED, TIMED_OUT), (r.id, r.state_name())

    # --- causality for completed requests
    for m in res.instances:
        for rid, e2e in m.e2e.items():
            req = m.registry[rid]
            assert req.arrival_us <= req.enqueue_us
            sd = m.scheduling_delay[rid]
            assert req.enqueue_us <= req.arrival_us + sd
            assert 0 <= sd < m.ttft[rid] <= e2e

    # --- decision trace: one admission record per admission call, one routing record per route
    if res.trace is not None:
        assert len(res.trace.admissions) == c.admitted + c.rejected_by_admission
        assert len(res.trace.routings) == c.routed
        assert [r.chosen_instance for r in res.trace.routings] == [r.assigned_instance for r in
                                                                  sorted(routed, key=_route_order(res))]
        assert all(r.regret >= 0 and len(r.candidates) <= sc.trace.counterfactual_k
                   for r in res.trace.routings)

    # --- determinism
    reqs2 = build(reqs_spec, prefixes)
    _, res2, _ = simulate(sc, reqs2, horizon)
    assert [(r.assigned_instance, r.state) for r in reqs2] == [(r.assigned_instance, r.state) for r in reqs]
    for m1, m2 in zip(res.instances, res2.instances, strict=True):
        assert (m1.e2e, m1.ttft) == (m2.e2e, m2.ttft)


def _route_order(res):
    order = {rec.request_id: k for k, rec in enumerate(res.trace.routings)}
    return lambda r: order[r.id]
