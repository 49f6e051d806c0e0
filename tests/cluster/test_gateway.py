"""The gateway queue (docs/control-plane.md, "Gateway queue"): hand-checked dispatch orders and
times, shedding, fair share, Jain's index, and its conservation on random workloads.

The hand-checked cases use one instance, no queueing delay (alpha 0) and step = 5000 + 10 µs per
prefill token + 100 µs per decode token. A request of 100 prompt tokens and 3 outputs alone on
the instance: step 1 (prefill) 0 → 6000, steps 2 and 3 (decode) 6000 → 11100 → 16200. The engine
does a step's bookkeeping when it begins, so the request leaves (and its in-flight count
falls) at 11100, when its last step begins: that is when the gateway sends the next request on.
"""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.metrics.gateway import jain_index
from blis_simpy.run.execute import simulate
from tests.cluster.helpers import request

LAST_STEP_US = 11_100        # the last step of a lone request arriving at 0 begins here


def _scenario(gateway: dict, *, n: int = 1, slo: dict | None = None, **cluster) -> Scenario:
    return Scenario.model_validate({
        "model": "m", "seed": 1,
        "latency": {"model": "blackbox", "alpha_coeffs": [0.0, 0.0, 0.0],
                    "beta_coeffs": [5000.0, 10.0, 100.0]},
        "engine": {"total_kv_blocks": 2000, "max_num_running_reqs": 64},
        "cluster": {"num_instances": n, "gateway": gateway, **cluster},
        "slo": slo or {},
    })


def _req(rid: str, at: int, *, slo: str = "", tenant: str = ""):
    r = request(rid, arrival=at, n_in=100, n_out=3, slo=slo, seed=0)
    r.tenant_id = tenant
    return r


def _run(gateway: dict, reqs, **kw):
    sim, res = simulate(_scenario(gateway, **kw), reqs, horizon_us=10_000_000)
    return sim.cluster.gateway.counters, res


ONE_AT_A_TIME = {"detector": "concurrency", "max_concurrency": 1}


def test_lone_request_timing_the_cases_build_on():
    _, res = _run(ONE_AT_A_TIME, [_req("r0", 0)])
    m = res.instances[0]
    assert (m.ttft["r0"], m.e2e["r0"]) == (6000, 16_200)


def test_depth_one_queue_sheds_the_arriving_request():
    """r0 (0) is sent on at once; r1 (10) waits, the queue is then full; r2 (20) is shed.
    r1 leaves when r0's last step begins: 11100, after 11090 µs in the queue."""
    c, res = _run({**ONE_AT_A_TIME, "max_depth": 1},
                  [_req("r0", 0), _req("r1", 10), _req("r2", 20)])
    assert c.order == ["r0", "r1"]
    assert c.waits_us == [0, LAST_STEP_US - 10]
    assert (c.shed, c.shed_by_reason, c.peak_depth) == (1, {"queue_full": 1}, 1)
    end = res.end_states
    assert (end.completed, end.shed_gateway, end.still_in_gateway) == (2, 1, 0)
    assert res.instances[0].e2e.keys() == {"r0", "r1"}


ORDERED = [("b1", 10, "batch"), ("c1", 20, "critical"), ("s1", 30, "standard")]


@pytest.mark.parametrize("order,expected", [
    ("fifo", ["b1", "c1", "s1"]),
    # bands: critical 4, standard 3, batch -1
    ("priority", ["c1", "s1", "b1"]),
    # deadlines: c1 20 + 100 ms, b1 10 + 5 s, s1 none (after every request with one)
    ("slo-deadline", ["c1", "b1", "s1"]),
])
def test_dispatch_order(order, expected):
    reqs = [_req("r0", 0)] + [_req(r, t, slo=cls) for r, t, cls in ORDERED]
    slo = {"classes": {"critical": {"ttft_ms": 100.0}, "batch": {"ttft_ms": 5000.0}}}
    c, _ = _run({**ONE_AT_A_TIME, "order": order}, reqs, slo=slo)
    assert c.order == ["r0", *expected]
    arrival = dict((r, t) for r, t, _ in ORDERED)
    # the first of them leaves at 11100, when r0's last step begins
    assert c.waits_us[1] == LAST_STEP_US - arrival[expected[0]]


def test_shed_lowest_displaces_a_queued_sheddable_request():
    """Full at depth 1: critical c1 (20) pushes out the queued batch b1 (10, band -1);
    standard s1 (30) cannot push out the critical c1 (not sheddable): it is shed itself."""
    reqs = [_req("r0", 0)] + [_req(r, t, slo=cls) for r, t, cls in ORDERED]
    c, res = _run({**ONE_AT_A_TIME, "max_depth": 1, "shed": "lowest"}, reqs)
    assert c.order == ["r0", "c1"]
    assert c.shed_by_reason == {"displaced": 1, "queue_full": 1}
    assert c.shed_by_flow == {"default": 2}
    assert res.end_states.shed_gateway == 2


def test_band_queue_limit_sheds_in_the_full_band_only():
    reqs = [_req("r0", 0), _req("b1", 10, slo="batch"), _req("b2", 20, slo="batch"),
            _req("c1", 30, slo="critical")]
    c, _ = _run({**ONE_AT_A_TIME, "band_queue_limit": 1}, reqs)
    assert c.shed_by_reason == {"band_full": 1}
    assert c.order == ["r0", "b1", "c1"]


def test_band_inflight_limit_holds_a_band_while_others_go():
    """Two instances, no detector, one critical request in flight at most: c1 and b1 leave at
    0 (round robin: instance 0, instance 1); c2 waits for c1's last step, 11100."""
    reqs = [_req("c1", 0, slo="critical"), _req("c2", 0, slo="critical"), _req("b1", 0, slo="batch")]
    c, _ = _run({"band_inflight_limit": 1}, reqs, n=2)
    assert c.order == ["c1", "b1", "c2"]
    assert c.waits_us == [0, 0, LAST_STEP_US]


def _tenants():
    return [_req(f"a{i}", 0, tenant="a") for i in range(1, 7)] + \
           [_req(f"b{i}", 0, tenant="b") for i in range(1, 4)]


def test_fair_share_two_to_one_under_backlog():
    """Nine requests at 0, one at a time: virtual finish times a = 1/2, 1, 3/2, ...; b = 1, 2, 3;
    ties go to the earlier arrival. So a1 a2 b1 a3 a4 b2 a5 a6 b3: 2:1 at every point."""
    c, res = _run({**ONE_AT_A_TIME, "fair_share": {"weights": {"a": 2.0, "b": 1.0}}}, _tenants())
    assert c.order == ["a1", "a2", "b1", "a3", "a4", "b2", "a5", "a6", "b3"]
    assert c.completed_by_flow == {"a": 6, "b": 3}


def test_without_fair_share_the_queue_is_fifo_and_equal_weights_alternate():
    c, _ = _run(ONE_AT_A_TIME, _tenants())
    assert c.order == [f"a{i}" for i in range(1, 7)] + ["b1", "b2", "b3"]
    c, _ = _run({**ONE_AT_A_TIME, "fair_share": {}}, _tenants())
    assert c.order == ["a1", "b1", "a2", "b2", "a3", "b3", "a4", "a5", "a6"]


def test_jain_index_in_the_report(tmp_path):
    from blis_simpy.metrics.gateway import gateway_report
    c, res = _run({**ONE_AT_A_TIME, "fair_share": {"weights": {"a": 2.0, "b": 1.0}}}, _tenants())
    rep = gateway_report(c, flow_key="tenant", weight={"a": 2.0, "b": 1.0}.get, duration_s=1.0,
                         met_by_flow=None)
    # completions per weight: 6 / 2 = 3 / 1
    assert rep.jain_index == 1.0
    assert [rep.flows[f].normalised_throughput for f in "ab"] == [3.0, 3.0]
    flat = gateway_report(c, flow_key="tenant", weight=lambda _f: 1.0, duration_s=1.0,
                          met_by_flow={"a": 6, "b": 0})
    assert flat.jain_index == pytest.approx(0.9)          # (6 + 3)^2 / (2 (36 + 9))
    assert flat.flows["a"].slo_attainment_pct == 100.0 and flat.flows["b"].slo_attainment_pct == 0.0


def test_jain_index_bounds():
    assert jain_index([1, 1, 1]) == 1.0
    assert jain_index([1, 0, 0, 0]) == 0.25
    assert jain_index([0, 0]) is None and jain_index([]) is None


@pytest.mark.parametrize("pools", [False, True], ids=["one-pool", "pd"])
@pytest.mark.parametrize("seed", range(6))
def test_conservation_on_random_workloads(seed, pools):
    """Random arrivals, classes, tenants and settings, with and without prefill/decode pools:
    every request is sent on, shed or still queued; the depth never passes its cap; the run's
    own invariants hold (it raises if not); with pools, nothing is left counted as pending
    once every request has ended."""
    rng = np.random.default_rng(seed)
    n_req = 60
    times = np.sort(rng.integers(0, 200_000, size=n_req))
    classes = ["critical", "standard", "batch", "sheddable", ""]
    reqs = [_req(f"q{i}", int(t), slo=classes[rng.integers(5)], tenant="ab"[rng.integers(2)])
            for i, t in enumerate(times)]
    depth = int(rng.integers(0, 6))
    gw = {"max_depth": depth, "detector": ["never", "concurrency", "utilization"][seed % 3],
          "max_concurrency": int(rng.integers(1, 4)), "order": ["fifo", "priority", "slo-deadline"][seed % 3],
          "shed": ["arriving", "lowest"][seed % 2], "band_inflight_limit": int(rng.integers(0, 3)),
          "fair_share": {"weights": {"a": 3.0}} if seed % 2 else None}
    horizon = int(rng.integers(50_000, 400_000))
    sc = _pd(gw, slo={"ttft_ms": 50.0}) if pools else _scenario(gw, n=2, slo={"ttft_ms": 50.0})
    sim, res = simulate(sc, reqs, horizon_us=horizon)
    c = sim.cluster.gateway.counters
    assert c.offered == c.dispatched + c.shed + c.queued
    assert sum(c.shed_by_reason.values()) == c.shed == sum(c.shed_by_flow.values())
    assert c.dispatched == len(c.order) == len(c.waits_us) == sum(c.dispatched_by_flow.values())
    assert min(c.waits_us, default=0) >= 0
    if depth:
        assert c.peak_depth <= depth
    end = res.end_states.to_dict()
    assert sum(v for k, v in end.items() if k != "offered") == end["offered"] == n_req
    assert end["still_in_gateway"] == c.queued and end["shed_gateway"] == c.shed
    if sum(v for k, v in end.items() if k.startswith("still")) == 0 and pools:
        assert sim.cluster.gateway._pending == 0 and not sim.cluster.fabric.active


def test_concurrency_detector_never_exceeds_its_limit():
    """A policy that records the in-flight total each time it lets a request go."""
    from blis_simpy.admission.gateway import StandardGateway

    seen = []

    class Recording(StandardGateway):
        def has_room(self, state, pending):
            ok = super().has_room(state, pending)
            if ok:
                seen.append(sum(s.in_flight_requests for s in state.snapshots) + pending)
            return ok

    reqs = [_req(f"q{i}", 1000 * i) for i in range(40)]
    sc = _scenario({"detector": "concurrency", "max_concurrency": 3}, n=2)
    from blis_simpy.run.simulation import Simulation
    sim = Simulation(sc, reqs, horizon_us=10_000_000)
    g = sim.cluster.gateway
    g.policy = Recording(g.policy.settings)
    sim.run()
    assert seen and max(seen) < 2 * 3
    assert max(seen) == 5          # the cap is reached: the load needs it


PD = {"prefill_instances": 1, "decode_instances": 1, "decider": {"policy": "always"},
      "transfer": {"kv_bytes_per_token": 512}}


def _pd(gateway: dict, **kw) -> Scenario:
    return Scenario.model_validate({**_scenario(gateway, n=2, **kw).model_dump(),
                                    "disaggregation": PD})


def test_with_pd_pools_a_request_in_its_kv_transfer_still_counts_in_flight():
    """One prefill and one decode instance, at most 1 in flight per instance (2 in all).
    r0 (0) and r1 (10) go on at once; r2 (20) waits. r0: prefill 0 -> 6000; its KV (7 blocks x
    16 tokens x 512 B = 57,344 B at 25 GB/s, 2.3 us, + 50 us) arrives at 6053; decode steps
    6053 -> 11153 -> 16253; it leaves at 11153, when its last step begins, and r2 goes on then.
    Had the transfer counted nowhere, r2 would have gone at 6000, r0's prefill end."""
    sim, res = simulate(_pd(ONE_AT_A_TIME), [_req("r0", 0), _req("r1", 10), _req("r2", 20)],
                        horizon_us=10_000_000)
    c = sim.cluster.gateway.counters
    r0 = sim.cluster.parents["r0"]
    assert (r0.prefill_complete_us, r0.transfer_complete_us, r0.completion_us) == (6000, 6053, 16_253)
    assert c.order == ["r0", "r1", "r2"]
    assert c.waits_us == [0, 0, 11_153 - 20]
    assert sim.cluster.parents["r2"].phase_times()[1] == 11_153   # its prefill is routed then
    assert res.end_states.completed == 3 and sim.cluster.gateway._pending == 0


def test_with_pd_pools_a_shed_or_rejected_request_frees_its_place():
    """Depth 1: r2 is shed. The gateway's in-flight per band falls when a parent ends, so the
    band limit of 1 lets r1 go only when r0 has finished on its decode instance (its last
    step begins at 11153)."""
    sim, res = simulate(_pd({"band_inflight_limit": 1, "max_depth": 1}),
                        [_req("r0", 0), _req("r1", 10), _req("r2", 20)], horizon_us=10_000_000)
    c = sim.cluster.gateway.counters
    assert c.order == ["r0", "r1"] and c.shed_by_reason == {"queue_full": 1}
    assert c.waits_us == [0, 11_153 - 10]
    end = res.end_states
    assert (end.completed, end.shed_gateway, end.still_in_gateway) == (2, 1, 0)


def test_utilization_detector_rechecks_on_its_tick():
    """Room while the instance's wait queue is empty (queue-depth threshold 1, KV ignored), one
    running request at most. r0 (0) runs; r1 (10) goes on at once and waits on the instance;
    r2 (20) is held. r1 leaves the wait queue when its first step begins, at 16200 (r0's last
    step, begun at 11100, ends then); r2 goes at the next tick of the 1000 µs grid that began
    when it was held: 17020."""
    sc = _scenario({"detector": "utilization", "queue_depth_threshold": 1.0,
                    "kv_util_threshold": 1000.0})
    sc = Scenario.model_validate({**sc.model_dump(), "engine": {**sc.engine.model_dump(),
                                                                "max_num_running_reqs": 1}})
    sim, res = simulate(sc, [_req("r0", 0), _req("r1", 10), _req("r2", 20)], horizon_us=10_000_000)
    c = sim.cluster.gateway.counters
    assert res.instances[0].scheduling_delay["r1"] == 16_200 - 10
    assert c.order == ["r0", "r1", "r2"] and c.waits_us == [0, 0, 17_020 - 20]


def test_a_plugin_pick_outside_the_heads_is_its_error():
    from blis_simpy.admission.gateway import StandardGateway
    from blis_simpy.run.simulation import Simulation

    class Bad(StandardGateway):
        def pick(self, heads):
            return None

    sim = Simulation(_scenario(ONE_AT_A_TIME), [_req("r0", 0)], horizon_us=1_000_000)
    sim.cluster.gateway.policy = Bad(sim.cluster.gateway.policy.settings)
    with pytest.raises(ConfigError) as exc:
        sim.run()
    assert exc.value.field == "cluster.gateway.policy" and "pick() returned None" in str(exc.value)


def test_every_gateway_decision_is_in_the_decision_trace(tmp_path):
    """The depth-one case traced: r0 queued and sent at 0, r1 queued at 10 and sent at 11100,
    r2 shed at 20 (the queue held r1); the JSON Lines file carries them as ``gateway``
    records right after the admissions."""
    from blis_simpy.trace.jsonl import record_lines
    sc = Scenario.model_validate({**_scenario({**ONE_AT_A_TIME, "max_depth": 1}).model_dump(),
                                  "trace": {"level": "decisions"}})
    sim, _ = simulate(sc, [_req("r0", 0), _req("r1", 10), _req("r2", 20)], horizon_us=10_000_000)
    got = [(r.request_id, r.clock_us, r.action, r.queue_depth, r.reason, r.wait_us)
           for r in sim.trace.gateway]
    assert got == [("r0", 0, "queued", 1, "", 0), ("r0", 0, "dispatched", 0, "", 0),
                   ("r1", 10, "queued", 1, "", 0), ("r2", 20, "shed", 1, "queue_full", 0),
                   ("r1", LAST_STEP_US, "dispatched", 0, "", LAST_STEP_US - 10)]
    kinds = [line.split('"kind":"')[1].split('"')[0] for line in record_lines(sim.trace)]
    assert kinds == ["admission"] * 3 + ["gateway"] * 5 + ["routing"] * 2
