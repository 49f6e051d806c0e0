"""The column fast path of routing (blis_simpy/routing/view.py): built-in policies decide from
a Candidates view exactly as from snapshots; plugins written against snapshots keep them."""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy.cluster.simulation import Simulation
from blis_simpy.routing import LeastLoaded, PrefixIndex, QueueDepth, RoundRobin, Router, Weighted
from blis_simpy.routing.base import RoutingDecision
from blis_simpy.routing.scorers import KVUtilization, PrefixAffinity
from blis_simpy.routing.view import defined_together
from tests.cluster.helpers import request, scenario

SHARED = np.arange(64)          # a 4-block shared prefix (block size 16)


def _workload(n: int = 60) -> list:
    """Bursts of simultaneous arrivals (ties), half of them sharing a prefix."""
    return [request(i, arrival=(i // 4) * 3000, n_in=96, n_out=20, seed=i,
                    prefix=SHARED if i % 2 else None) for i in range(n)]


def _placements(routing: str, params: dict | None, *, trace: str) -> tuple[list, Simulation]:
    sim = Simulation(scenario(n=4, routing=routing, routing_params=params, trace=trace),
                     _workload())
    seen = []
    router = sim.cluster.router
    observe = router.observe

    def record(req, target):
        seen.append((req.id, target))
        observe(req, target)

    router.observe = record
    sim.run()
    return seen, sim


@pytest.mark.parametrize("routing,params", [
    ("round-robin", None),
    ("least-loaded", None),                         # random ties: the RNG draws must match too
    ("always-busiest", None),
    ("weighted", None),                             # prefix-affinity:3, queue-depth:2, kv-utilization:2
    ("weighted", {"scorers": "prefix-affinity:1,load-balance:1,queue-depth:1,kv-utilization:1"}),
    ("weighted", {"scorers": [{"name": "prefix-affinity", "weight": 1,
                               "params": {"lru_capacity": 5}}]}),
    ("weighted", {"scorers": "queue-depth:1", "tie_break": "first"}),
])
def test_column_path_places_every_request_where_the_snapshot_path_does(routing, params):
    # a decision trace records snapshots, so with one the cluster takes the snapshot path
    fast, sim = _placements(routing, params, trace="none")
    slow, _ = _placements(routing, params, trace="decisions")
    assert sim.cluster.router.columns_ok() and sim.cluster.trace is None
    assert len(fast) == 60 and fast == slow
    assert len({t for _, t in fast}) == (1 if routing == "always-busiest" else 4)


def test_plugins_written_against_snapshots_keep_the_snapshot_path():
    class Picky(QueueDepth):            # overrides score only: its score_columns is not trusted
        def score(self, req, snapshots):
            return [0.5] * len(snapshots)

    class Sticky(RoundRobin):           # overrides route only
        def route(self, req, state):
            return RoutingDecision(state.snapshots[0].index)

    class Own(Router):
        def route(self, req, state):
            return RoutingDecision(state.snapshots[-1].index)

    assert QueueDepth().columns_ok() and PrefixAffinity().columns_ok() and KVUtilization().columns_ok()
    assert not Picky().columns_ok()
    assert RoundRobin().columns_ok() and LeastLoaded().columns_ok() and Weighted().columns_ok()
    assert not Sticky().columns_ok() and not Own().columns_ok()
    w = Weighted()
    w.scorers[1] = Picky()
    assert not w.columns_ok()
    assert defined_together(Picky, "observe", "observe_columns")
    assert not defined_together(Picky, "score", "score_columns")


def test_a_plugin_router_still_sees_snapshots_in_a_run():
    class LastOne(Router):              # unregistered, used directly
        def route(self, req, state):
            seen.append(len(state.snapshots))
            return RoutingDecision(state.snapshots[-1].index)

    seen = []
    sim = Simulation(scenario(n=3), [request(i, arrival=i * 1000) for i in range(5)])
    sim.cluster.router = LastOne()
    res = sim.run()
    assert seen == [3] * 5
    assert [m.completed_requests for m in res.instances] == [0, 0, 5]


def test_prefix_index_records_in_one_go_as_an_lru():
    idx = PrefixIndex(capacity=3)
    idx.record([b"a", b"b"], "i0")
    idx.record([b"c", b"d"], "i0")               # all new: appended, the oldest trimmed
    assert list(idx._sets["i0"]) == [b"b", b"c", b"d"]
    idx.record([b"c", b"e"], "i0")               # c refreshed, e evicts b
    assert list(idx._sets["i0"]) == [b"d", b"c", b"e"]
    idx.record([b"f", b"g", b"h", b"i"], "i0")   # more than the capacity: the last three
    assert list(idx._sets["i0"]) == [b"g", b"h", b"i"]
    idx.record([b"x", b"y"], "i1")
    assert idx.match_many([b"g", b"h", b"z"], ["i0", "i1", "i2"]) == [2, 0, 0]
    assert idx.match_many([b"x", b"y"], ["i1", "i0"]) == [2, 0]
    assert idx.match_many([], ["i0"]) == [0]
