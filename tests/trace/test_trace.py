"""Decision traces: counterfactual candidates, regret, summary (docs/metrics.md, "Decision trace")."""

from __future__ import annotations

from blis_simpy.routing import RoutingDecision
from blis_simpy.run.simulation import Simulation
from blis_simpy.trace import (
    AdmissionRecord,
    Candidate,
    DecisionTrace,
    KVTransferRecord,
    RoutingRecord,
    counterfactual,
    summarize,
)
from blis_simpy.trace.records import DisaggregationRecord
from tests.cluster.helpers import request, scenario, snap


def test_regret_with_policy_scores_hand_built():
    snaps = (snap(0, q=1, b=2, kv=0.5, free=10, inflight=3), snap(1), snap(2, q=7))
    scores = {"instance_0": 0.25, "instance_1": 0.875, "instance_2": 0.5}
    cands, regret = counterfactual(snaps, scores, "instance_2", 2)
    assert regret == 0.375
    assert cands == (Candidate("instance_1", 0.875, 0, 0, 0, 0.0, 100),
                     Candidate("instance_2", 0.5, 7, 0, 0, 0.0, 100))
    cands, regret = counterfactual(snaps, scores, "instance_1", 5)
    assert regret == 0.0 and [c.instance_id for c in cands] == ["instance_1", "instance_2", "instance_0"]
    assert cands[2] == Candidate("instance_0", 0.25, 1, 2, 3, 0.5, 10)


def test_regret_without_scores_uses_negative_effective_load_and_id_order():
    snaps = (snap(2, q=1), snap(10, b=1), snap(0, q=4), snap(1, inflight=1))
    cands, regret = counterfactual(snaps, None, "instance_0", 3)
    # loads 1, 1, 4, 1 -> three tied at -1, ordered by ID as strings
    assert [(c.instance_id, c.score) for c in cands] == [
        ("instance_1", -1.0), ("instance_10", -1.0), ("instance_2", -1.0)]
    assert regret == 3.0


def test_counterfactual_edge_cases():
    snaps = (snap(0), snap(1, q=2))
    assert counterfactual(snaps, None, "instance_1", 0) == ((), 0.0)        # K = 0
    assert counterfactual(snaps, None, "instance_9", 2) == ((), 0.0)        # chosen unknown
    cands, regret = counterfactual(snaps, {"instance_1": 0.5}, "instance_0", 1)
    assert regret == 0.5 and cands[0].instance_id == "instance_1"           # missing score = 0


def test_summarize_counts_targets_and_regret():
    t = DecisionTrace(k=2)
    t.admissions += [AdmissionRecord("r0", 0, True), AdmissionRecord("r1", 5, False, "x"),
                     AdmissionRecord("r2", 9, True)]
    t.routings += [RoutingRecord("r0", 0, "instance_1", regret=0.5),
                   RoutingRecord("r2", 9, "instance_0", regret=0.25),
                   RoutingRecord("r3", 9, "instance_1", regret=0.0)]
    s = summarize(t)
    assert (s.total_decisions, s.admitted_count, s.rejected_count) == (3, 2, 1)
    assert s.target_distribution == {"instance_0": 1, "instance_1": 2}
    assert s.unique_targets == 2
    assert s.mean_regret == 0.25 and s.max_regret == 0.5
    assert s.disaggregation_count == 0
    t.disaggregations += [DisaggregationRecord("r0", 0, True), DisaggregationRecord("r2", 9, False)]
    t.kv_transfers += [KVTransferRecord("r0", 10, 8, 3, "instance_0", "instance_1"),
                       KVTransferRecord("r2", 20, 3, 1, "instance_0", "instance_1")]
    s = t.summary()
    assert (s.disaggregation_count, s.disaggregated_count, s.kv_transfer_count) == (2, 1, 2)
    assert s.mean_transfer_duration == 5.5


def test_empty_trace_summary():
    s = DecisionTrace().summary()
    assert (s.total_decisions, s.unique_targets, s.mean_regret, s.max_regret) == (0, 0, 0.0, 0.0)


def test_record_routing_copies_scores():
    t = DecisionTrace(k=1)
    scores = {"instance_0": 0.5, "instance_1": 0.75}
    from blis_simpy.snapshot import RouterState
    t.record_routing(request(0), RouterState((snap(0), snap(1)), 42),
                     RoutingDecision(0, "why", scores), "instance_0")
    scores["instance_0"] = 9.0
    rec = t.routings[0]
    assert rec.scores == {"instance_0": 0.5, "instance_1": 0.75}
    assert (rec.clock_us, rec.chosen_instance, rec.reason, rec.regret) == (42, "instance_0", "why", 0.25)
    assert [c.instance_id for c in rec.candidates] == ["instance_1"]


def test_simulation_records_every_decision_in_event_order():
    sc = scenario(n=3, routing="least-loaded", routing_params={"tie_break": "first"},
                  admission="token-bucket", admission_params={"capacity": 100, "refill_rate": 1},
                  trace="decisions", k=3)
    reqs = [request(i, arrival=i * 100, n_in=40, n_out=3) for i in range(5)]
    res = Simulation(sc, reqs).run()
    tr = res.trace
    assert [a.request_id for a in tr.admissions] == [f"request_{i}" for i in range(5)]
    assert [a.admitted for a in tr.admissions] == [True, True, False, False, False]
    assert [a.clock_us for a in tr.admissions] == [0, 100, 200, 300, 400]
    assert [r.chosen_instance for r in tr.routings] == ["instance_0", "instance_1"]
    # least-loaded chooses the best -load, so regret is 0 and candidates are all three
    assert all(r.regret == 0.0 and len(r.candidates) == 3 and r.scores is None for r in tr.routings)
    assert tr.routings[1].candidates[0].instance_id == "instance_1"
    assert tr.routings[1].candidates[-1] == Candidate("instance_0", -1.0, 0, 0, 1, 0.0, 2000)


def test_always_busiest_has_regret():
    sc = scenario(n=2, routing="always-busiest", trace="decisions", k=2)
    reqs = [request(i, arrival=i * 10, n_in=40, n_out=20) for i in range(3)]
    tr = Simulation(sc, reqs).run().trace
    # everything piles onto instance_0; regret = its load minus the idle instance's (0)
    assert [r.chosen_instance for r in tr.routings] == ["instance_0"] * 3
    assert [r.regret for r in tr.routings] == [0.0, 1.0, 2.0]
    assert summarize(tr).mean_regret == 1.0
