"""The autoscaler process on tiny hand-checked runs: exact µs times of scale-up, drain and
stop, GPU-hours by hand, invariants (docs/control-plane.md, "Autoscaling")."""

from __future__ import annotations

import pytest

from blis_simpy.cluster.autoscaler import DRAINING, LOADING, OFF, SERVING
from blis_simpy.config.scenario import Scenario
from blis_simpy.metrics.autoscale import US_PER_HOUR
from blis_simpy.run import execute, prepare, simulate
from tests.cluster.helpers import ALPHA, BETA, request

S = 1_000_000


def scaled(schedule, *, initial: int, hi: int = 2, startup_s: float = 0.5, routing="least-loaded",
           tp: int = 0, horizon_us: int | None = None) -> Scenario:
    """Blackbox timing, a scheduled autoscaler deciding every second, no weight loading: the
    loading delay is ``startup_s`` alone."""
    return Scenario.model_validate({
        "model": "m", "tp": tp, "horizon_us": horizon_us,
        "latency": {"model": "blackbox", "alpha_coeffs": ALPHA, "beta_coeffs": BETA},
        "engine": {"total_kv_blocks": 2000, "max_num_running_reqs": 64},
        "cluster": {"num_instances": initial,
                    "routing": {"policy": routing, "params": {"tie_break": "first"}
                                if routing == "least-loaded" else {}},
                    "autoscaler": {"policy": "scheduled", "interval_s": 1.0, "min_instances": 1,
                                   "max_instances": hi, "load_bandwidth_gbps": None,
                                   "startup_s": startup_s,
                                   "params": {"schedule": schedule}}},
    })


def where(result) -> dict[str, tuple[str, int, int]]:
    """request ID -> (instance, arrival µs, enqueue µs)."""
    out = {}
    for k, m in enumerate(result.instances):
        for rid, req in m.registry.items():
            out[rid] = (f"instance_{k}", req.arrival_us, req.enqueue_us)
    return out


def test_new_instance_takes_its_first_request_at_decision_plus_loading_delay():
    # 1 instance until 1 s, then 2: decided at 1 000 000 us, ready 500 000 us later
    sc = scaled([{"at_s": 0, "instances": 1}, {"at_s": 1, "instances": 2}], initial=1)
    reqs = [request(k, arrival=250_000 * k, n_in=64, n_out=300, seed=k) for k in range(10)]
    sim, result = simulate(sc, reqs)
    rec = result.autoscale
    assert rec.loading_delay_us == 500_000
    assert rec.changes[:3] == [(0, 1, 0, 0), (1_000_000, 1, 1, 0), (1_500_000, 2, 0, 0)]
    placed = where(result)
    on_new = sorted((arr, enq) for inst, arr, enq in placed.values() if inst == "instance_1")
    # the first request on the new instance arrives exactly when it is ready, and is enqueued
    # after the blackbox queueing delay alpha0 = 1000 us
    assert on_new[0] == (1_500_000, 1_501_000)
    # the one arriving while it loads (1.25 s) went to instance_0
    assert placed["request_5"][0] == "instance_0"
    assert sim.autoscaler.state_of(1) == SERVING


def test_scale_down_drains_then_stops():
    # 2 instances until 1 s, then 1: instance_1 (the highest) drains what it holds, then stops
    sc = scaled([{"at_s": 0, "instances": 2}, {"at_s": 1, "instances": 1}], initial=2,
                routing="round-robin")
    reqs = [request(0, arrival=0, n_in=64, n_out=300, seed=0),
            request(1, arrival=100_000, n_in=64, n_out=300, seed=1),
            request(2, arrival=1_200_000, n_in=64, n_out=10, seed=2)]
    sim, result = simulate(sc, reqs)
    rec = result.autoscale
    placed = where(result)
    assert placed["request_1"][0] == "instance_1"
    assert placed["request_2"][0] == "instance_0"        # the draining one takes no request
    done_us = result.instances[1].completion_time["request_1"]
    assert done_us > 1_000_000                           # it was still running at the decision
    assert rec.changes[1:3] == [(1_000_000, 1, 0, 1), (done_us, 1, 0, 0)]
    # instance_1 counted GPU time from 0 to the completion of its last request
    assert (1, 0, 0, done_us) in rec.spans
    assert sim.autoscaler.state_of(1) == OFF


def test_gpu_hours_by_hand():
    # TP 2: 2 GPUs per instance. instance_0 serves over [0, 3 s], instance_1 loads from 1 s
    # and serves to the horizon at 3 s (requests keep arriving after it)
    sc = scaled([{"at_s": 0, "instances": 1}, {"at_s": 1, "instances": 2}], initial=1, tp=2,
                horizon_us=3 * S)
    reqs = [request(k, arrival=250_000 * k, n_in=64, n_out=20, seed=k) for k in range(20)]
    _, result = simulate(sc, reqs)
    rec = result.autoscale
    assert rec.end_us == 3 * S
    assert rec.spans == [(0, 0, 0, 3 * S), (1, 1 * S, 1_500_000, 3 * S)]
    # (3 s + 2 s) x 2 GPUs = 10 GPU-s = 10 / 3600 GPU-hours
    assert rec.gpu_us == 10 * S
    assert rec.gpu_us / US_PER_HOUR == pytest.approx(10 / 3600, rel=0, abs=0)


def test_loading_cancelled_by_a_scale_down_never_serves():
    # up at 1 s (ready at 2.5 s), down again at 2 s: the loading instance is cancelled
    sc = scaled([{"at_s": 0, "instances": 1}, {"at_s": 1, "instances": 2},
                 {"at_s": 2, "instances": 1}], initial=1, startup_s=1.5)
    reqs = [request(k, arrival=250_000 * k, n_in=64, n_out=50, seed=k) for k in range(16)]
    sim, result = simulate(sc, reqs)
    rec = result.autoscale
    assert rec.changes[:3] == [(0, 1, 0, 0), (1 * S, 1, 1, 0), (2 * S, 1, 0, 0)]
    assert (1, 1 * S, -1, 2 * S) in rec.spans
    assert all(inst == "instance_0" for inst, _, _ in where(result).values())
    assert LOADING not in [sim.autoscaler.state_of(k) for k in range(2)]
    assert DRAINING not in [sim.autoscaler.state_of(k) for k in range(2)]


def test_a_fixed_count_gives_the_fixed_deployment():
    """An autoscaler that never changes the count leaves every request where the fixed
    deployment puts it, at the same times."""
    reqs = lambda: [request(k, arrival=100_000 * k, n_in=64, n_out=30, seed=k) for k in range(30)]  # noqa: E731
    sc = scaled([{"at_s": 0, "instances": 2}], initial=2, hi=3)
    fixed = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"autoscaler": None,
                                                                            "num_instances": 2})})
    _, a = simulate(sc, reqs())
    _, b = simulate(fixed, reqs())
    assert [dict(m.e2e) for m in a.instances[:2]] == [dict(m.e2e) for m in b.instances]
    assert a.instances[2].e2e == {}


def test_same_seed_same_record():
    sc = scaled([{"at_s": 0, "instances": 1}, {"at_s": 1, "instances": 2}], initial=1)
    runs = [simulate(sc, [request(k, arrival=250_000 * k, n_in=64, n_out=100, seed=k)
                          for k in range(12)])[1].autoscale for _ in range(2)]
    assert runs[0] == runs[1]


def test_data_parallel_instances_scale_as_one():
    """dp 2: an instance is an engine of 2 ranks; both ranks change state together and it
    counts TP x DP = 2 GPUs."""
    sc = scaled([{"at_s": 0, "instances": 1}, {"at_s": 1, "instances": 2}], initial=1)
    sc = sc.model_copy(update={"dp": 2})
    reqs = [request(k, arrival=250_000 * k, n_in=64, n_out=200, seed=k) for k in range(12)]
    sim, result = simulate(sc, reqs)
    rec = result.autoscale
    assert rec.gpus_per_instance == 2 and len(sim.instances) == 4
    assert [sim.autoscaler.state_of(k) for k in range(4)] == [SERVING] * 4
    assert rec.changes[:3] == [(0, 1, 0, 0), (1 * S, 1, 1, 0), (1_500_000, 2, 0, 0)]
    ranks_used = {inst for inst, arr, _ in where(result).values() if arr >= 1_500_000}
    assert ranks_used & {"instance_2", "instance_3"}
    assert not {inst for inst, arr, _ in where(result).values() if arr < 1_500_000} & {
        "instance_2", "instance_3"}


def test_time_varying_load_scales_up_in_the_burst_and_back_down():
    """A workload-spec with a burst client active in [4 s, 8 s) (lifecycle window) on top of a
    steady one: queue-depth scales up during the burst and back to 1 after it, using fewer
    GPU-seconds than keeping the peak count the whole run."""
    spec = {"version": "2", "seed": 3, "aggregate_rate": 60, "horizon": 14_000_000, "clients": [
        {"id": "base", "rate_fraction": 0.1, "arrival": {"process": "poisson"},
         "input_distribution": {"type": "constant", "params": {"value": 64}},
         "output_distribution": {"type": "constant", "params": {"value": 40}}},
        {"id": "burst", "rate_fraction": 0.9, "arrival": {"process": "poisson"},
         "lifecycle": {"windows": [{"start_us": 4_000_000, "end_us": 8_000_000}]},
         "input_distribution": {"type": "constant", "params": {"value": 64}},
         "output_distribution": {"type": "constant", "params": {"value": 40}}}]}
    d = prepare({
        "model": "m", "latency": {"model": "blackbox", "alpha_coeffs": ALPHA, "beta_coeffs": BETA},
        "engine": {"total_kv_blocks": 2000, "max_num_running_reqs": 4},
        "cluster": {"routing": {"policy": "least-loaded"},
                    "autoscaler": {"policy": "queue-depth", "interval_s": 0.5, "max_instances": 6,
                                   "load_bandwidth_gbps": None, "startup_s": 0.25,
                                   "params": {"target_per_instance": 2,
                                              "scale_down_stabilization_s": 1}}},
        "workload": {"kind": "spec", "spec": spec}})
    rec = execute(d).result.autoscale
    peak_t, peak = max(((t, s + lo) for t, s, lo, _ in rec.changes), key=lambda x: x[1])
    assert peak >= 3 and 4 * S <= peak_t < 8 * S + S
    assert all(s + lo == 1 for t, s, lo, _ in rec.changes if t < 4 * S)
    assert rec.changes[-1][1:] == (1, 0, 0)
    assert rec.gpu_us < peak * rec.end_us


def test_a_decision_leaves_the_routers_stale_snapshots_as_they_were():
    """With a periodic snapshot refresh (300 ms), the autoscaler's reads do not refresh the
    routers' cache. request_0 (0.2 s) runs on instance_0 until ~1.13 s; the decision at 1 s
    must not refresh the cache, so routing request_1 at 1.2 s refreshes it and sees instance_0
    idle (least-loaded, ties to the first): the placements of the fixed deployment."""
    reqs = lambda: [request(0, arrival=200_000, n_in=64, n_out=180, seed=0),  # noqa: E731
                    request(1, arrival=1_200_000, n_in=64, n_out=10, seed=1)]
    sc = scaled([{"at_s": 0, "instances": 2}], initial=2, hi=2)
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(
        update={"snapshot_refresh_interval_us": 300_000})})
    fixed = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"autoscaler": None})})
    _, a = simulate(sc, reqs())
    _, b = simulate(fixed, reqs())
    done_0 = b.instances[0].completion_time["request_0"]
    assert 1_000_000 < done_0 < 1_200_000
    assert where(a) == where(b) and where(b)["request_1"][0] == "instance_0"
    assert a.autoscale.decisions[0][0] == 1_000_000


def test_a_gateway_queue_sends_on_when_a_new_instance_is_ready():
    """A gateway queue letting one request in flight per serving instance: request_1 (at
    0.25 s) waits while request_0 runs on the only instance; the second instance, decided at
    1 s, is ready at 1.5 s and request_1 is sent to it then (enqueued after alpha0)."""
    sc = scaled([{"at_s": 0, "instances": 1}, {"at_s": 1, "instances": 2}], initial=1)
    sc = Scenario.model_validate(sc.model_dump() | {"cluster": sc.cluster.model_dump() | {
        "gateway": {"detector": "concurrency", "max_concurrency": 1}}})
    reqs = [request(0, arrival=0, n_in=64, n_out=300, seed=0),
            request(1, arrival=250_000, n_in=64, n_out=10, seed=1)]
    _, result = simulate(sc, reqs)
    placed = where(result)
    assert result.instances[0].completion_time["request_0"] > 1_500_000
    assert placed["request_1"] == ("instance_1", 250_000, 1_501_000)


def test_a_drain_decided_inside_the_last_step_ends_with_that_step():
    """instance_1 takes request_1 (990 001 us, 2000 prompt tokens, 1 output token): enqueued
    after alpha0 = 1000 us, its one step runs 991 001 -> 1 016 001 (5000 + 10 x 2000 us). The
    engine books the request done when that step begins, so at the scale-down decision (1 s)
    nothing is in flight; the instance still computes until 1 016 001 and turns off then."""
    sc = scaled([{"at_s": 0, "instances": 2}, {"at_s": 1, "instances": 1}], initial=2,
                routing="round-robin")
    reqs = [request(k, arrival=990_000 + k, n_in=2000, n_out=1, seed=k) for k in range(2)]
    _, result = simulate(sc, reqs)
    assert where(result)["request_1"][0] == "instance_1"
    assert (1, 0, 0, 1_016_001) in result.autoscale.spans


def test_requests_held_in_a_gateway_queue_count_for_queue_depth():
    """The gateway lets one request in flight per serving instance, so the instances' wait
    queues stay empty and the backlog waits in the gateway. 12 requests at 0.1 s intervals,
    each running ~1.5 s: at the first decision (1 s) 9 wait in the gateway, queue-depth
    (target 4 per instance) asks ceil(9 / 4) = 3 instances, clamped to the maximum, 2."""
    sc = scaled([], initial=1)
    data = sc.model_dump()
    data["cluster"]["autoscaler"] |= {"policy": "queue-depth",
                                      "params": {"target_per_instance": 4.0}}
    data["cluster"]["gateway"] = {"detector": "concurrency", "max_concurrency": 1}
    sc = Scenario.model_validate(data)
    reqs = [request(k, arrival=100_000 * k, n_in=64, n_out=300, seed=k) for k in range(12)]
    sim, result = simulate(sc, reqs, horizon_us=3 * S)
    rec = result.autoscale
    assert rec.decisions[0][:2] == (S, 2)
    assert rec.changes[:3] == [(0, 1, 0, 0), (S, 1, 1, 0), (1_500_000, 2, 0, 0)]
