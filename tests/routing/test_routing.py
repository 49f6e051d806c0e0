"""Routing policies and scorers on hand-built snapshots (docs/control-plane.md)."""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.routing import (
    AlwaysBusiest,
    KVUtilization,
    LeastLoaded,
    LoadBalance,
    PrefixAffinity,
    QueueDepth,
    RoundRobin,
    Router,
    Scorer,
    Weighted,
    break_tie,
    parse_scorers,
)
from blis_simpy.routing.prefix_index import PrefixIndex
from tests.cluster.helpers import request, snap, state


def weighted(scorers, tie_break="first", rng=None, block_size=16) -> Weighted:
    return Weighted(Weighted.parse_params({"scorers": scorers, "tie_break": tie_break}),
                    rng=rng, block_size=block_size)


# ------------------------------------------------------------------------ scorers
def test_queue_depth_is_min_max_normalised_effective_load():
    snaps = (snap(0, q=2, b=1), snap(1, b=1), snap(2, q=1, b=2, inflight=2))  # loads 3, 1, 5
    assert QueueDepth().score(None, snaps) == [0.5, 1.0, 0.0]


def test_queue_depth_all_equal_scores_one():
    snaps = (snap(0, q=2), snap(1, b=2), snap(2, inflight=2))
    assert QueueDepth().score(None, snaps) == [1.0, 1.0, 1.0]


def test_kv_utilization_and_load_balance():
    snaps = (snap(0, kv=0.25, q=1), snap(1, kv=1.0, b=3), snap(2, kv=0.0))
    assert KVUtilization().score(None, snaps) == [0.75, 0.0, 1.0]
    assert LoadBalance().score(None, snaps) == [0.5, 0.25, 1.0]


def test_prefix_affinity_matches_leading_blocks_and_observes_choices():
    prefix = np.arange(64)                      # 4 full blocks of 16
    r1 = request(1, n_in=100, prefix=prefix)    # 6 full blocks
    r2 = request(2, n_in=100, prefix=prefix)    # shares the first 4 blocks with r1
    sc = PrefixAffinity(block_size=16)
    snaps = (snap(0), snap(1))
    assert sc.score(r1, snaps) == [0.0, 0.0]
    sc.observe(r1, snaps[1])
    assert sc.score(r1, snaps) == [0.0, 1.0]
    assert sc.score(r2, snaps) == [0.0, 4 / 6]
    short = request(3, n_in=15)                 # no full block
    assert sc.score(short, snaps) == [0.0, 0.0]


def test_prefix_affinity_uses_the_engines_block_hashes():
    r = request(1, n_in=40)
    sc = PrefixAffinity(block_size=16)
    sc.observe(r, snap(0))
    hashes = r.prompt_block_hashes(16)
    assert len(hashes) == 2
    assert all(sc.index.contains(h, "instance_0") for h in hashes)


# ------------------------------------------------------------------------ prefix index
def test_prefix_index_lru_eviction_and_recency():
    idx = PrefixIndex(capacity=3)
    idx.record([b"a", b"b", b"c"], "i")
    assert idx.match([b"a", b"b", b"c"], "i") == 3
    idx.record([b"a"], "i")                       # refresh: LRU order is now b, c, a
    idx.record([b"d"], "i")                       # evicts b
    assert idx.size("i") == 3
    assert not idx.contains(b"b", "i")
    assert idx.match([b"a", b"b", b"c"], "i") == 1   # stops at the first miss
    assert idx.match([b"c", b"a", b"d"], "i") == 3
    idx.match([b"c"], "i")                        # match does not refresh recency ...
    idx.record([b"e"], "i")                       # ... so c (the LRU) is evicted
    assert not idx.contains(b"c", "i") and idx.contains(b"a", "i")
    assert idx.match([b"a"], "other") == 0


def test_prefix_index_default_capacity_is_ten_thousand_blocks():
    idx = PrefixIndex()
    idx.record(list(range(10_005)), "i")
    assert idx.size("i") == 10_000
    assert not idx.contains(4, "i") and idx.contains(5, "i")


# ------------------------------------------------------------------------ weighted
def test_weighted_composite_is_normalised_weighted_sum():
    # weights 1 and 3 normalise to 0.25 / 0.75 exactly
    r = weighted([{"name": "queue-depth", "weight": 1}, {"name": "kv-utilization", "weight": 3}])
    st = state(snap(0, q=3, kv=0.5), snap(1, q=1, kv=0.75), snap(2, q=5, kv=0.0))
    d = r.route(request(0), st)
    # queue-depth: [0.5, 1, 0]; kv: [0.5, 0.25, 1]
    assert d.scores == {"instance_0": 0.25 * 0.5 + 0.75 * 0.5,
                        "instance_1": 0.25 * 1.0 + 0.75 * 0.25,
                        "instance_2": 0.75}
    assert d.target == 2


def test_weighted_default_scorers():
    r = Weighted()
    assert [(s.name, s.weight) for s in r.specs] == [
        ("prefix-affinity", 3.0), ("queue-depth", 2.0), ("kv-utilization", 2.0)]
    assert r.weights == [3 / 7, 2 / 7, 2 / 7]


class Wild(Scorer, name="test-wild"):
    """Out-of-range scores, to check the router clamps them."""

    def score(self, req, snapshots):
        return [1.5, -0.5][: len(snapshots)]


def test_weighted_clamps_scores_to_unit_interval():
    r = weighted([{"name": "test-wild", "weight": 1}])
    d = r.route(request(0), state(snap(0), snap(1)))
    assert d.scores == {"instance_0": 1.0, "instance_1": 0.0}


def test_weighted_observer_runs_only_for_the_chosen_instance():
    prefix = np.arange(32)
    r = weighted([{"name": "prefix-affinity", "weight": 1}, {"name": "load-balance", "weight": 1}])
    st = state(snap(0, q=1), snap(1))
    d1 = r.route(request(1, n_in=48, prefix=prefix), st)
    assert d1.target == 1                        # prefix tie at 0, lower load wins
    d2 = r.route(request(2, n_in=48, prefix=prefix), state(snap(0), snap(1, q=1)))
    # instance_1 has the 2 shared prefix blocks of 3: 0.5*(2/3) + 0.5*(1/2) > 0.5*1
    assert d2.target == 1


def test_weighted_ties_first_vs_random():
    st = state(snap(0), snap(1), snap(2))
    first = weighted([{"name": "queue-depth", "weight": 1}], tie_break="first")
    assert {first.route(request(i), st).target for i in range(20)} == {0}
    rng = np.random.default_rng(7)
    rnd = weighted([{"name": "queue-depth", "weight": 1}], tie_break="random", rng=rng)
    picks = [rnd.route(request(i), st).target for i in range(60)]
    assert set(picks) == {0, 1, 2}
    rnd2 = weighted([{"name": "queue-depth", "weight": 1}], tie_break="random",
                    rng=np.random.default_rng(7))
    assert [rnd2.route(request(i), st).target for i in range(60)] == picks


def test_weighted_params_validation():
    with pytest.raises(ConfigError, match="unknown scorer 'nope'"):
        Weighted.parse_params({"scorers": [{"name": "nope", "weight": 1}]})
    with pytest.raises(ConfigError, match="duplicate scorer"):
        Weighted.parse_params({"scorers": "queue-depth:1, queue-depth:2"})
    with pytest.raises(ConfigError):
        Weighted.parse_params({"scorers": [{"name": "queue-depth", "weight": 0}]})
    with pytest.raises(ConfigError):
        Weighted.parse_params({"tie_break": "last"})
    p = Weighted.parse_params({"scorers": " queue-depth : 2 ,kv-utilization:1"})
    assert [(s.name, s.weight) for s in p.scorers] == [("queue-depth", 2.0), ("kv-utilization", 1.0)]


@pytest.mark.parametrize("text, words", [
    ("queue-depth", "expected name:weight"),
    ("queue-depth:x", "invalid weight"),
    ("queue-depth:-1", "finite and > 0"),
    ("queue-depth:inf", "finite and > 0"),
    ("mystery:1", "unknown scorer"),
    ("queue-depth:1,queue-depth:1", "duplicate"),
])
def test_parse_scorers_errors(text, words):
    with pytest.raises(ValueError, match=words):
        parse_scorers(text)


# ------------------------------------------------------------------------ other policies
def test_least_loaded_picks_minimum_effective_load_by_instance_index():
    r = LeastLoaded(LeastLoaded.parse_params({"tie_break": "first"}))
    st = state(snap(1, q=2), snap(3, b=1), snap(5, inflight=1))  # a filtered subset
    assert r.route(request(0), st).target == 3
    st = state(snap(1, q=2), snap(3, b=3), snap(5, inflight=1, q=1))
    assert r.route(request(0), st).target == 1


def test_least_loaded_random_ties_are_seeded():
    st = state(snap(0, q=1), snap(1), snap(2), snap(3))
    r = LeastLoaded(rng=np.random.default_rng(3))
    seq = [r.route(request(i), st).target for i in range(50)]
    assert set(seq) == {1, 2, 3}
    r2 = LeastLoaded(rng=np.random.default_rng(3))
    assert [r2.route(request(i), st).target for i in range(50)] == seq
    assert LeastLoaded(rng=None).route(request(0), st).target == 1  # no RNG: first


def test_always_busiest_and_round_robin():
    st = state(snap(0, q=1), snap(1, q=4), snap(2, b=4))
    assert AlwaysBusiest().route(request(0), st).target == 1
    rr = RoundRobin()
    assert [rr.route(request(i), st).target for i in range(5)] == [0, 1, 2, 0, 1]


def test_break_tie():
    rng = np.random.default_rng(1)
    assert break_tie([4], "random", rng) == 4
    assert break_tie([2, 5], "first", rng) == 2
    assert break_tie([2, 5], "random", None) == 2


def test_registry_lists_built_ins():
    assert {"round-robin", "least-loaded", "weighted", "always-busiest"} <= set(Router.names())
    assert {"prefix-affinity", "queue-depth", "kv-utilization", "load-balance"} <= set(Scorer.names())
    assert Router.lookup("") is RoundRobin


def test_prefix_index_records_in_one_go_as_an_lru():
    idx = PrefixIndex(capacity=3)
    idx.record([b"a", b"b"], "i0")
    idx.record([b"c", b"d"], "i0")               # all new: appended, the oldest trimmed
    assert list(idx._sets["i0"]) == [b"b", b"c", b"d"]
    idx.record([b"c", b"e"], "i0")               # c refreshed, e evicts b
    assert list(idx._sets["i0"]) == [b"d", b"c", b"e"]
    idx.record([b"f", b"g", b"h", b"i"], "i0")   # more than the capacity: the last three
    assert list(idx._sets["i0"]) == [b"g", b"h", b"i"]
