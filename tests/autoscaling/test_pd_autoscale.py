"""The autoscaler with prefill/decode pools (docs/control-plane.md, "Autoscaling
prefill/decode pools"): per-pool scale-up, drain and GPU-hours on a hand-checked run, the
per-pool results, the policies on both pools, and the located errors of its keys.

Timing (blackbox, tests/cluster/helpers.py): a request of 64 prompt tokens waits alpha0 =
1000 us, its prefill step takes 5000 + 10 x 64 = 5640 us, its KV (4 blocks x 16 tokens x
512 B = 32,768 B at 25 GB/s, 1.3 us, + 50 us) arrives 52 us later: a parent arriving at t is
on its decode instance at t + 6692.
"""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import ConfigError
from blis_simpy.metrics.autoscale import US_PER_HOUR
from blis_simpy.run import simulate
from tests.cluster.helpers import ALPHA, BETA, request

S = 1_000_000
ARRIVE_TO_DECODE_US = 1000 + 5640 + 52


def pd_scaled(schedule, pools, *, policy="scheduled", params=None, prefill_tp=None,
              horizon_us=None, **auto) -> Scenario:
    return Scenario.model_validate({
        "model": "m", "horizon_us": horizon_us,
        "latency": {"model": "blackbox", "alpha_coeffs": ALPHA, "beta_coeffs": BETA},
        "engine": {"total_kv_blocks": 2000, "max_num_running_reqs": 64},
        "cluster": {"num_instances": 2,
                    "routing": {"policy": "least-loaded", "params": {"tie_break": "first"}},
                    "autoscaler": {"policy": policy, "interval_s": 1.0,
                                   "load_bandwidth_gbps": None, "startup_s": 0.5, "pools": pools,
                                   "params": params if params is not None else {"schedule": schedule},
                                   **auto}},
        "disaggregation": {"prefill_instances": 1, "decode_instances": 1,
                           "decider": {"policy": "always"}, "transfer": {"kv_bytes_per_token": 512},
                           "prefill_pool": {"tp": prefill_tp} if prefill_tp else {}},
    })


DECODE_UP_DOWN = [{"at_s": 0, "instances": {"decode": 1}}, {"at_s": 1, "instances": {"decode": 2}},
                  {"at_s": 2, "instances": {"decode": 1}}]


def _run():
    sc = pd_scaled(DECODE_UP_DOWN, {"decode": {"min_instances": 1, "max_instances": 2}}, prefill_tp=2)
    reqs = [request(k, arrival=250_000 * k, n_in=64, n_out=300, seed=k) for k in range(12)]
    return simulate(sc, reqs)


def test_the_decode_pool_scales_up_serves_then_drains():
    """instance_0 prefill (fixed), instance_1 and instance_2 decode. The decode pool goes to 2
    at 1 s; instance_2 serves from 1.5 s: the parent arriving then is the first on it, at
    1.5 s + 6692 us. At 2 s it drains: later parents go to instance_1; it turns off when its
    last request (request_7) ends."""
    sim, res = _run()
    rec = res.autoscale
    parents = sim.cluster.parents
    on_2 = sorted(p.arrival_us for p in parents.values() if p.decode_instance == "instance_2")
    assert on_2 == [1_500_000, 1_750_000]
    assert parents["request_6"].decode_enqueue_us == 1_500_000 + ARRIVE_TO_DECODE_US
    assert {p.prefill_instance for p in parents.values()} == {"instance_0"}
    last = parents["request_7"].completion_us
    assert rec.pool_changes == [(0, "prefill", 1, 0, 0), (0, "decode", 1, 0, 0),
                                (S, "decode", 1, 1, 0), (1_500_000, "decode", 2, 0, 0),
                                (2 * S, "decode", 1, 0, 1), (last, "decode", 1, 0, 0)]
    assert rec.changes == [(0, 2, 0, 0), (S, 2, 1, 0), (1_500_000, 3, 0, 0), (2 * S, 2, 0, 1),
                           (last, 2, 0, 0)]
    assert (2, S, 1_500_000, last) in rec.spans
    assert sim.autoscaler.state_of(2) == "off"


def test_gpu_hours_count_each_pool_s_gpus():
    """Prefill TP 2 over the whole run, decode instance_1 TP 1 over the whole run, instance_2
    TP 1 from its decision (1 s) to its last request's end."""
    sim, res = _run()
    rec = res.autoscale
    end = rec.end_us
    last = sim.cluster.parents["request_7"].completion_us
    assert rec.gpu_us == 2 * end + end + (last - S)
    from blis_simpy.metrics.autoscale import autoscale_report
    rep = autoscale_report(rec, 12, None, judged=False, gpu_hour_usd=None)
    assert rep.gpus_per_instance == 0 and rep.gpu_hours == rec.gpu_us / US_PER_HOUR
    pools = {p["name"]: p for p in rep.pools}
    assert pools["prefill"]["gpu_hours"] == 2 * end / US_PER_HOUR
    assert pools["decode"]["gpu_hours"] == (end + last - S) / US_PER_HOUR
    assert (pools["prefill"]["peak_instances"], pools["decode"]["peak_instances"]) == (1, 2)
    assert [r["instances_by_pool"] for r in rep.intervals[:4]] == [
        {"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 1},
        {"prefill": 1, "decode": 1}]
    assert [r["instances"] for r in rep.intervals[:3]] == [2, 3, 2]
    assert {c["pool"] for c in rep.instance_count} == {"prefill", "decode"}
    assert rep.mean_instances == pytest.approx((2 * end + last - S) / end)
    assert "pools" in rep.to_dict()


def test_the_prefill_pool_scales_on_its_own_queue():
    """queue-depth with a target of 1 waiting request per instance: 300 prompts of 2000 tokens,
    one every 10 ms (a prefill takes 25 ms), queue on the prefill instance; the prefill pool
    grows at the first decision, each pool stays within its own bounds; every run invariant
    holds (the run raises if not)."""
    pools = {"prefill": {"min_instances": 1, "max_instances": 3},
             "decode": {"min_instances": 1, "max_instances": 2}}
    sc = pd_scaled(None, pools, policy="queue-depth",
                   params={"target_per_instance": 1.0, "scale_down_stabilization_s": 0})
    reqs = [request(k, arrival=10_000 * k, n_in=2000, n_out=5, seed=k) for k in range(300)]
    sim, res = simulate(sc, reqs)
    rec = res.autoscale
    grew = [(t, n) for t, name, s, lo, _ in rec.pool_changes if name == "prefill"
            for n in [s + lo] if n > 1]
    assert grew and grew[0][0] == S           # the first decision sees the queue
    for _t, name, s, lo, dr in rec.pool_changes:
        hi = pools[name]["max_instances"]
        assert 0 <= s + lo <= hi and s + lo + dr <= hi
    prefill_on = {p.prefill_instance for p in sim.cluster.parents.values()}
    assert len(prefill_on) > 1 and prefill_on <= {"instance_0", "instance_1", "instance_2"}
    assert res.end_states.completed == 300


@pytest.mark.parametrize("seed", range(4))
def test_random_pd_autoscaling_keeps_every_invariant(seed):
    """Random schedules of both pools and random arrivals: conservation, causality, the
    autoscaler's spans (INV-AS: checked by the run itself) and the pools' bounds."""
    rng = np.random.default_rng(seed)
    sched = [{"at_s": float(k), "instances": {"prefill": int(rng.integers(1, 4)),
                                              "decode": int(rng.integers(1, 4))}} for k in range(6)]
    pools = {"prefill": {"min_instances": 1, "max_instances": 3},
             "decode": {"min_instances": 1, "max_instances": 3, "initial_instances": 2}}
    sc = pd_scaled(sched, pools, horizon_us=int(rng.integers(3, 8)) * S)
    times = np.sort(rng.integers(0, 5 * S, size=50))
    reqs = [request(k, arrival=int(t), n_in=int(rng.integers(16, 300)),
                    n_out=int(rng.integers(1, 200)), seed=k) for k, t in enumerate(times)]
    sim, res = simulate(sc, reqs)
    assert len(sim.instances) == 6
    roles = sim.cluster.roles
    assert roles == ["prefill"] * 3 + ["decode"] * 3
    for p in sim.cluster.parents.values():
        if p.decode_instance:
            assert roles[int(p.decode_instance.split("_")[1])] == "decode"
    end = res.end_states.to_dict()
    assert sum(v for k, v in end.items() if k != "offered") == end["offered"] == 50


def _error(data_update: dict, where: str) -> str:
    data = pd_scaled(DECODE_UP_DOWN, {"decode": {"max_instances": 2}}).model_dump(exclude_unset=True)
    for path, v in data_update.items():
        node = data
        *parents, leaf = path.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        if v is None:
            node.pop(leaf, None)
        else:
            node[leaf] = v
    with pytest.raises(Exception) as e:
        Scenario.model_validate(data)
    text = str(e.value)
    assert where in text.replace(" -> ", ".").replace("\n  ", " ")
    return text


def test_pool_bounds_need_pools_and_pools_need_pool_bounds():
    assert "needs prefill/decode pools" in _error(
        {"disaggregation.prefill_instances": 0, "disaggregation.decode_instances": 0},
        "cluster.autoscaler.pools")
    assert "cluster.autoscaler.pools" in _error({"cluster.autoscaler.pools": None},
                                                "cluster.autoscaler")
    assert "pools.prefill.max_instances" in _error({"cluster.autoscaler.max_instances": 3},
                                                   "cluster.autoscaler.max_instances")
    assert "outside them is not supported" in _error({"cluster.num_instances": 3},
                                                     "cluster.num_instances")
    assert "is above max_instances" in _error(
        {"cluster.autoscaler.pools": {"decode": {"min_instances": 3, "max_instances": 2}}},
        "min_instances")


def test_a_plugin_policy_naming_an_unknown_pool_is_its_error():
    from blis_simpy.autoscaling import AutoscalePolicy
    from blis_simpy.run.simulation import Simulation

    class Odd(AutoscalePolicy):
        def desired(self, state):
            return {"middle": 2}

    sc = pd_scaled(DECODE_UP_DOWN, {"decode": {"max_instances": 2}})
    sim = Simulation(sc, [request(0, arrival=1_500_000, n_in=64, n_out=5, seed=0)])
    sim.autoscaler.policy = Odd()
    with pytest.raises(ConfigError) as e:
        sim.run()
    assert e.value.field == "cluster.autoscaler.policy"
    assert "['prefill', 'decode']" in str(e.value)


def test_a_draining_prefill_instance_stays_on_until_its_kv_is_sent():
    """Two prefill instances, one decode; the prefill pool goes to 1 at 1 s while instance_1's
    prefill (990 001 us arrival, 2000 tokens: 991 001 -> 1 016 001) runs. Its prompt KV
    (125 blocks x 16 x 512 B = 1.024 MB) then crosses a 0.001 GB/s fabric it shares with
    instance_0's: instance_1 holds the KV until the transfer completes and turns off then."""
    sc = Scenario.model_validate({
        "model": "m",
        "latency": {"model": "blackbox", "alpha_coeffs": ALPHA, "beta_coeffs": BETA},
        "engine": {"total_kv_blocks": 2000, "max_num_running_reqs": 64},
        "cluster": {"num_instances": 3, "routing": {"policy": "round-robin"},
                    "autoscaler": {"policy": "scheduled", "interval_s": 1.0,
                                   "load_bandwidth_gbps": None,
                                   "pools": {"prefill": {"min_instances": 1, "max_instances": 2}},
                                   "params": {"schedule": [
                                       {"at_s": 0, "instances": {"prefill": 2}},
                                       {"at_s": 1, "instances": {"prefill": 1}}]}}},
        "disaggregation": {"prefill_instances": 2, "decode_instances": 1,
                           "decider": {"policy": "always"},
                           "transfer": {"kv_bytes_per_token": 512, "bandwidth_gbps": 0.001}}})
    reqs = [request(k, arrival=990_000 + k, n_in=2000, n_out=3, seed=k) for k in range(2)]
    sim, res = simulate(sc, reqs)
    p1 = sim.cluster.parents["request_1"]
    assert (p1.prefill_instance, p1.prefill_complete_us) == ("instance_1", 1_016_001)
    assert p1.transfer_complete_us > 3 * S          # two 1.024 MB transfers share 1 MB/s
    assert (1, 0, 0, p1.transfer_complete_us) in res.autoscale.spans
    assert sim.cluster.kv_sending == [0, 0, 0]
