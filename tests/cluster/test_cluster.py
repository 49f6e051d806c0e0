"""The cluster control plane: snapshots and staleness (INV-7), in-flight counting, the model
filter, routing injection (docs/control-plane.md)."""

from __future__ import annotations

from collections import deque

import pytest

from blis_simpy.run.simulation import Simulation
from blis_simpy.snapshot import SnapshotProvider
from tests.cluster.helpers import request, scenario


class FakeKV:
    def __init__(self, total: int):
        self.total_blocks = total
        self.used = 0
        self.hit = 0.0

    def cache_hit_rate(self) -> float:
        return self.hit


class FakeInstance:
    def __init__(self, index: int, total: int = 100):
        self.index = index
        self.id = f"instance_{index}"
        self.model = "m"
        self.waitq = deque()
        self.running = []
        self.kv = FakeKV(total)


def load(inst, q, b, used, hit=0.0):
    inst.waitq = deque(range(q))
    inst.running = list(range(b))
    inst.kv.used = used
    inst.kv.hit = hit


def test_immediate_snapshots_read_everything_now():
    inst = FakeInstance(0)
    p = SnapshotProvider([inst], 0)
    load(inst, 2, 3, 25, 0.5)
    s = p.snapshot(inst, 4, 7)
    assert (s.queue_depth, s.batch_size, s.kv_utilization, s.free_kv_blocks, s.cache_hit_rate) == (2, 3, 0.25, 75, 0.5)
    assert (s.in_flight_requests, s.effective_load, s.model, s.id) == (4, 9, "m", "instance_0")
    load(inst, 0, 1, 50)
    assert p.snapshot(inst, 0, 7).kv_utilization == 0.5


def test_periodic_snapshots_are_stale_between_refreshes():
    a, b = FakeInstance(0), FakeInstance(1)
    p = SnapshotProvider([a, b], 100)
    load(a, 2, 3, 25)
    s = p.snapshot(a, 5, 99)                        # before the first interval: zeros ...
    assert (s.queue_depth, s.batch_size, s.kv_utilization, s.free_kv_blocks) == (0, 0, 0.0, 0)
    assert s.in_flight_requests == 5                # ... except the synchronous in-flight count
    s = p.snapshot(a, 5, 100)                       # clock - last >= interval: refresh
    assert (s.queue_depth, s.batch_size, s.kv_utilization, s.free_kv_blocks) == (2, 3, 0.25, 75)
    load(a, 9, 9, 90)
    assert p.snapshot(a, 1, 199).queue_depth == 2   # stale until 200
    assert p.snapshot(a, 1, 199).in_flight_requests == 1
    assert p.snapshot(a, 1, 200).queue_depth == 9
    load(b, 1, 1, 1)
    assert p.snapshot(b, 0, 150).queue_depth == 1   # each instance has its own refresh clock
    load(b, 4, 1, 1)
    assert p.snapshot(b, 0, 249).queue_depth == 1
    assert p.snapshot(b, 0, 250).queue_depth == 4


def test_zero_total_blocks_gives_zero_utilization():
    inst = FakeInstance(0, total=0)
    assert SnapshotProvider([inst]).snapshot(inst, 0, 0).kv_utilization == 0.0
    with pytest.raises(ValueError):
        SnapshotProvider([inst], -1)


def test_least_loaded_spreads_by_in_flight_count():
    # arrivals 10 µs apart: within the 1 ms queueing delay only the in-flight count differs
    sc = scenario(n=3, routing="least-loaded", routing_params={"tie_break": "first"})
    reqs = [request(i, arrival=10 * i, n_in=32, n_out=40) for i in range(6)]
    Simulation(sc, reqs).run()
    assert [r.assigned_instance for r in reqs] == ["instance_0", "instance_1", "instance_2"] * 2


def test_periodic_refresh_changes_what_the_router_sees():
    # Weighted routing on KV utilisation only: r0 (4 blocks) lands on instance_0, r1 (20
    # blocks) then r2 arrive while both still run.
    def run(refresh):
        sc = scenario(n=2, routing="weighted", refresh_us=refresh,
                      routing_params={"scorers": "kv-utilization:1", "tie_break": "first"})
        reqs = [request(0, arrival=0, n_in=64, n_out=400),
                request(1, arrival=100_000, n_in=320, n_out=400),
                request(2, arrival=120_000, n_in=32, n_out=4)]
        Simulation(sc, reqs).run()
        return [int(r.assigned_instance[-1]) for r in reqs]

    assert run(0) == [0, 1, 0]               # fresh: r2 goes to the emptier cache
    assert run(50_000) == [0, 1, 1]          # refreshed at 100 ms, before r1 allocated: stale
    assert run(10_000_000) == [0, 0, 0]      # never refreshed: all zeros, first wins


def test_in_flight_counts_until_the_instance_reports_done():
    sc = scenario(n=2, routing="round-robin")
    reqs = [request(i, arrival=0, n_in=32, n_out=30) for i in range(5)]
    sim = Simulation(sc, reqs)
    seen = []
    orig = sim.cluster._on_routing

    def spy(req):
        seen.append(list(sim.cluster.inflight))
        orig(req)

    sim.cluster._on_routing = spy
    res = sim.run()
    assert seen == [[0, 0], [1, 0], [1, 1], [2, 1], [2, 2]]
    assert sim.cluster.inflight == [0, 0]
    assert [m.completed_requests for m in res.instances] == [3, 2]


def test_requests_for_another_model_are_rejected_at_routing():
    sc = scenario(n=2, model="m")
    reqs = [request(0, model="m"), request(1, model="other"), request(2, model="")]
    res = Simulation(sc, reqs).run()
    c = res.counters
    assert (c.admitted, c.routed, c.rejected_at_routing) == (3, 2, 1)
    assert reqs[1].assigned_instance == ""


def test_reject_all_rejects_at_admission():
    res = Simulation(scenario(n=2, admission="reject-all"), [request(i) for i in range(4)]).run()
    assert (res.counters.rejected_by_admission, res.counters.routed) == (4, 0)
    assert all(m.injected_requests == 0 for m in res.instances)


def test_admission_and_routing_latency_delay_injection():
    sc = scenario(n=1).model_copy(deep=True)
    sc.cluster.admission_latency_us = 300
    sc.cluster.routing_latency_us = 200
    sc.trace.level = "decisions"
    reqs = [request(0, arrival=1_000, n_in=32, n_out=2)]
    res = Simulation(sc, reqs).run()
    assert res.trace.admissions[0].clock_us == 1_300
    assert res.trace.routings[0].clock_us == 1_500
    # TTFT counts from the client's arrival: control-plane latency + 1 ms queueing delay
    ttft = res.instances[0].ttft["request_0"]
    assert ttft >= 500 + 1_000


def test_invalid_router_target_is_the_routers_error():
    from blis_simpy.errors import ConfigError
    from blis_simpy.routing import Router, RoutingDecision

    class Broken(Router):       # not registered: used directly
        def route(self, req, state):
            return RoutingDecision(7)

    sim = Simulation(scenario(n=2), [request(0)])
    sim.cluster.router = Broken()
    with pytest.raises(ConfigError) as err:
        sim.run()
    assert str(err.value) == (
        "cluster.routing.policy: routing policy (tests.cluster.test_cluster."
        "test_invalid_router_target_is_the_routers_error.<locals>.Broken) returned instance "
        "index 7 from route(), not one of the candidate instances [0, 1]")
