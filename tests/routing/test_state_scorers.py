"""The scorers that read the instances through their read-only views (docs/control-plane.md,
"Weighted scoring"): ``load-aware`` and ``precise-prefix-cache``; tiny hand-checked cases."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.routing import KVUtilization, LoadAware, PrecisePrefixCache, Weighted
from blis_simpy.routing.scorers import DEFAULT_SCORERS, parse_scorers
from blis_simpy.run.simulation import Simulation
from blis_simpy.snapshot import InstanceView, RouterState
from tests.cluster.helpers import request, scenario, snap


def inst(index, *, waiting=(), running=(), held=()):
    """A stand-in instance: requests of the given prompt lengths, KV blocks of these hashes."""
    return SimpleNamespace(
        id=f"instance_{index}", index=index,
        waitq=[SimpleNamespace(input_len=n) for n in waiting],
        running=[SimpleNamespace(input_len=n) for n in running],
        kv=SimpleNamespace(hash_to_block={h: k for k, h in enumerate(held)}))


def state_of(*insts, clock=0):
    return RouterState(tuple(snap(i.index) for i in insts), clock,
                       tuple(InstanceView(i) for i in insts))


def scored(scorer, req, st):
    scorer.see(st)
    return scorer.score(req, st.snapshots)


# ------------------------------------------------------------------------ load-aware
def test_load_aware_relative_form_is_one_minus_tokens_over_the_busiest():
    st = state_of(inst(0, waiting=[100], running=[300]),    # 400 tokens
                  inst(1, running=[200]),                    # 200
                  inst(2))                                   # 0
    assert scored(LoadAware(), None, st) == [0.0, 0.5, 1.0]


def test_load_aware_all_idle_scores_one():
    st = state_of(inst(0), inst(1))
    assert scored(LoadAware(), None, st) == [1.0, 1.0]


def test_load_aware_threshold_form_is_llm_ds_half_scale():
    sc = LoadAware(LoadAware.parse_params({"threshold_tokens": 1000}))
    st = state_of(inst(0), inst(1, waiting=[250]), inst(2, running=[600, 900]))
    # 0 -> 0.5; 250 -> 0.5 * 0.75; 1500 capped at 1000 -> 0
    assert scored(sc, None, st) == [0.5, 0.375, 0.0]


def test_load_aware_without_views_is_an_error():
    sc = LoadAware()
    sc.see(RouterState((snap(0),), 0))
    with pytest.raises(ValueError, match="needs the instances' views"):
        sc.score(None, (snap(0),))


# ------------------------------------------------------------------------ precise prefix cache
def _prompt_hashes(n_blocks=4):
    r = request(1, n_in=16 * n_blocks + 5)      # 4 full blocks and a partial one
    return r, r.prompt_block_hashes(16)


def test_precise_prefix_counts_leading_held_blocks_normalised_over_hits():
    r, h = _prompt_hashes()
    st = state_of(inst(0, held=h[:1]),                  # 1 block
                  inst(1, held=h[:3]),                  # 3
                  inst(2, held=h[1:]),                  # not the first block: 0
                  inst(3, held=h))                      # 4
    # hits 1, 3, 4: (m - 1) / 3
    assert scored(PrecisePrefixCache(), r, st) == [0.0, 2 / 3, 0.0, 1.0]


def test_precise_prefix_equal_hits_score_one_and_no_hit_zero():
    r, h = _prompt_hashes()
    st = state_of(inst(0, held=h[:2]), inst(1), inst(2, held=h[:2]))
    assert scored(PrecisePrefixCache(), r, st) == [1.0, 0.0, 1.0]
    assert scored(PrecisePrefixCache(), r, state_of(inst(0), inst(1))) == [0.0, 0.0]


def test_precise_prefix_with_delay_sees_the_cache_at_its_last_refresh():
    r, h = _prompt_hashes()
    i0 = inst(0, held=h[:2])
    i1 = inst(1)
    sc = PrecisePrefixCache(PrecisePrefixCache.parse_params({"delay_us": 1000}))
    assert scored(sc, r, state_of(i0, i1, clock=999)) == [0.0, 0.0]     # first copy due at 1000
    assert scored(sc, r, state_of(i0, i1, clock=1000)) == [1.0, 0.0]    # copied now
    i1.kv.hash_to_block.update({x: 0 for x in h})                        # instance 1 gets them all
    i0.kv.hash_to_block.clear()
    assert scored(sc, r, state_of(i0, i1, clock=1999)) == [1.0, 0.0]    # still the copy of 1000
    assert scored(sc, r, state_of(i0, i1, clock=2000)) == [0.0, 1.0]    # refreshed
    live = PrecisePrefixCache()
    assert scored(live, r, state_of(i0, i1, clock=1500)) == [0.0, 1.0]


def test_view_reads_the_real_kv_cache_of_a_run():
    """After a run, instance 1's GPU cache holds the prompt it served (its blocks are free
    but keep their hashes): the view finds all of its full blocks."""
    prefix = np.arange(64)
    reqs = [request(0, n_in=40), request(1, arrival=1, n_in=70, prefix=prefix)]
    h1 = reqs[1].prompt_block_hashes(16)
    sim = Simulation(scenario(n=2, routing="round-robin"), reqs)
    sim.run()
    views = [InstanceView(i) for i in sim.instances]
    assert [v.cached_prefix_blocks(h1) for v in views] == [0, 4]
    assert [v.waiting_tokens() + v.running_tokens() for v in views] == [0, 0]


# ------------------------------------------------------------------------ in a weighted router
def _picks(scorers, reqs, n=2):
    sc = scenario(n=n, routing="weighted",
                  routing_params={"scorers": scorers, "tie_break": "first"})
    Simulation(sc, reqs).run()
    return [int(r.assigned_instance.rsplit("_", 1)[1]) for r in reqs]


def _three_requests():
    prefix = np.arange(64)
    return [request(0, n_in=40),                              # t=0: all idle -> instance 0
            # (r0 enters instance 0's queue after the 1 ms queueing delay, alpha0)
            request(1, arrival=2000, n_in=70, prefix=prefix),  # 2 ms: instance 0 runs r0 -> 1
            request(2, arrival=10_000_000, n_in=70, prefix=prefix)]   # t=10 s: both idle


def test_weighted_picks_with_live_precise_prefix_cache():
    # r2 finds its 4 prefix blocks only in instance 1's cache (r1 left them there)
    assert _picks("precise-prefix-cache:1,load-aware:1", _three_requests()) == [0, 1, 1]


def test_weighted_picks_with_a_delayed_precise_prefix_cache():
    # a 20 s delay: no refresh before r2, so every cache looks empty and the tie goes first
    scorers = [{"name": "precise-prefix-cache", "weight": 1, "params": {"delay_us": 20_000_000}},
               {"name": "load-aware", "weight": 1}]
    assert _picks(scorers, _three_requests()) == [0, 1, 0]


def test_new_scorers_are_registered_and_defaults_unchanged():
    assert [s["name"] for s in parse_scorers("load-aware:1,precise-prefix-cache:2")] == [
        "load-aware", "precise-prefix-cache"]
    assert DEFAULT_SCORERS == (("prefix-affinity", 3.0), ("queue-depth", 2.0), ("kv-utilization", 2.0))
    w = Weighted(Weighted.parse_params({}))
    assert [type(s).name for s in w.scorers] == ["prefix-affinity", "queue-depth", "kv-utilization"]
    assert KVUtilization().score(None, (snap(0, kv=0.25),)) == [0.75]


def test_new_scorer_params_are_checked():
    with pytest.raises(ConfigError, match="delay_us"):
        Weighted.parse_params({"scorers": [{"name": "precise-prefix-cache", "weight": 1,
                                            "params": {"delay_us": -1}}]})
    with pytest.raises(ConfigError, match="params.threshold: unknown key"):
        Weighted.parse_params({"scorers": [{"name": "load-aware", "weight": 1,
                                            "params": {"threshold": 5}}]})
