"""Closed-loop clients (docs/workloads.md, "Closed-loop clients"): exact send times on tiny
hand-checked runs, Little's law exactly, rejections and timeouts freeing their client,
concurrency stages, PD, every workload source, determinism and the run invariants."""

from __future__ import annotations

import copy
from fractions import Fraction

import numpy as np
import pytest

from blis_simpy import run
from blis_simpy.cluster.clients import ThinkTimeSampler
from blis_simpy.request import COMPLETED, TIMED_OUT
from blis_simpy.rng import numpy_rng

#: every engine step takes exactly 1 ms (beta0), whatever the batch: a request of 3 output
#: tokens takes 3 steps, its prefill step emitting the first token
BASE = {
    "model": "meta-llama/llama-3.1-8b-instruct",
    "latency": {"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1000, 0, 0]},
    "engine": {"total_kv_blocks": 1000},
    "workload": {"kind": "distribution", "num_requests": 6,
                 "prompt_tokens": {"mean": 10, "stdev": 10, "min": 10, "max": 10},
                 "output_tokens": {"mean": 3, "stdev": 3, "min": 3, "max": 3}},
}


def _run(workload=None, **top):
    sc = copy.deepcopy(BASE)
    sc["workload"].update(workload or {})
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(sc.get(k), dict):
            sc[k].update(v)
        else:
            sc[k] = v
    return run.execute(run.prepare(sc, {}))


def _sent(out):
    """(ID, send µs, end µs) of every request the clients sent, in send order; the end is the
    completion (send + E2E) or, for a request that did not complete, None."""
    e2e = out.report.cluster.e2e
    return [(r.id, r.arrival_us, r.arrival_us + e2e[r.id] if r.id in e2e else None)
            for r in out.sessions.followups]


def test_two_clients_hand_checked():
    """2 clients, 0.5 ms think: both send at 0; the pair is served together (3 steps of 1 ms,
    done at 3000 µs), both send again at 3000 + 500, and so on: 6 requests, 3 rounds."""
    out = _run({"concurrency": 2, "think_time": {"dist": "constant", "mean_ms": 0.5}})
    assert _sent(out) == [("request_0", 0, 3000), ("request_1", 0, 3000),
                          ("request_2", 3500, 6500), ("request_3", 3500, 6500),
                          ("request_4", 7000, 10000), ("request_5", 7000, 10000)]
    assert out.requests == []                           # nothing offered up front
    c = out.result.counters
    assert (c.offered, c.arrived, c.routed) == (6, 6, 6)
    assert out.report.cluster.completed_requests == 6
    assert out.result.sessions is None                  # no session counters


def test_one_client_without_think_time_sends_on_completion():
    out = _run({"concurrency": 1, "num_requests": 3})
    assert _sent(out) == [("request_0", 0, 3000), ("request_1", 3000, 6000),
                          ("request_2", 6000, 9000)]


@pytest.mark.parametrize("n, think_ms, beta", [(4, 2.0, [1000, 0, 0]), (3, 0.25, [700, 3, 40]),
                                               (8, 0.0, [1200, 1, 25])])
def test_littles_law_holds_exactly(n, think_ms, beta):
    """Deterministic service, identical requests, N clients sending together: every client
    runs K = R/N identical cycles (E2E + think). Over the window [0, W], W = the last
    completion + the think time (the moment every client would send again; every client's
    cycles end there), throughput R/W equals N / (mean E2E + mean think time) exactly."""
    k = 5
    out = _run({"concurrency": n, "num_requests": n * k,
                "think_time": {"dist": "constant", "mean_ms": think_ms}},
               latency={"beta_coeffs": beta})
    sent = _sent(out)
    assert len(sent) == n * k and all(end is not None for _, _, end in sent)
    think_us = round(think_ms * 1000)
    w = max(end for _, _, end in sent) + think_us
    mean_e2e = Fraction(sum(end - start for _, start, end in sent), len(sent))
    throughput = Fraction(len(sent), w)
    assert throughput == n / (mean_e2e + think_us)
    assert out.report.cluster.completed_requests == n * k


def test_a_rejected_request_frees_its_client():
    """reject-all admission: each send is rejected at once and its client sends again a think
    time (1 ms) later."""
    out = _run({"concurrency": 2, "think_time": {"dist": "constant", "mean_ms": 1.0}},
               cluster={"admission": {"policy": "reject-all"}})
    assert [(rid, t) for rid, t, _ in _sent(out)] == [
        ("request_0", 0), ("request_1", 0), ("request_2", 1000), ("request_3", 1000),
        ("request_4", 2000), ("request_5", 2000)]
    assert out.result.counters.rejected_by_admission == 6


def test_a_request_the_gateway_sheds_frees_its_client():
    """A depth-1 gateway queue that lets one request in flight per instance (1 instance), 3
    clients, 1 ms think, 3 ms of service: at 0, request_0 takes the queue and goes on,
    request_1 and _2 find it full and are shed; their clients send again at 1000 µs:
    request_3 waits in the queue, request_4 is shed; at 2000 request_5 is shed (the cap of
    6 is reached); request_0 ends at 3000 and request_3 goes on then, ending at 6000."""
    out = _run({"concurrency": 3, "think_time": {"dist": "constant", "mean_ms": 1.0}},
               cluster={"gateway": {"max_depth": 1, "detector": "concurrency",
                                    "max_concurrency": 1}})
    assert _sent(out) == [("request_0", 0, 3000), ("request_1", 0, None), ("request_2", 0, None),
                          ("request_3", 1000, 6000), ("request_4", 1000, None),
                          ("request_5", 2000, None)]
    assert out.report.cluster.completed_requests == 2


def test_a_timed_out_request_frees_its_client():
    """A spec client with a 1.5 ms timeout: every request (3 ms of service) times out 1.5 ms
    after its send (the deadline moves with the send time), and its client sends again a
    think time (1 ms) later: sends at 0, 2.5, 5 ms."""
    spec = {"version": "2", "seed": 7, "aggregate_rate": 10.0, "num_requests": 3,
            "clients": [{"id": "c", "rate_fraction": 1.0, "timeout": 1500,
                         "arrival": {"process": "constant"},
                         "input_distribution": {"type": "constant", "params": {"value": 10}},
                         "output_distribution": {"type": "constant", "params": {"value": 3}}}]}
    sc = copy.deepcopy(BASE)
    sc["workload"] = {"kind": "spec", "spec": spec, "concurrency": 1,
                      "think_time": {"dist": "constant", "mean_ms": 1}}
    out = run.execute(run.prepare(sc, {}))
    reqs = out.sessions.followups
    assert [(r.arrival_us, r.deadline_us, r.state) for r in reqs] == [
        (0, 1500, TIMED_OUT), (2500, 4000, TIMED_OUT), (5000, 6500, TIMED_OUT)]
    assert out.report.cluster.timed_out_requests == 3


def _in_flight_at(sent, t):
    return sum(1 for _, start, end in sent if start <= t < end)


def test_stages_switch_concurrency_at_the_boundary():
    """1 client for 10.5 ms, then 3 for 10.5 ms, then none. Client 0 alone sends at 0, 3, 6, 9 ms;
    at the boundary (10.5 ms) clients 1 and 2 send; nothing is sent at or after 21 ms."""
    out = _run({"num_requests": 100, "concurrency_stages": [
        {"concurrency": 1, "duration_s": 0.0105}, {"concurrency": 3, "duration_s": 0.0105}]})
    sent = _sent(out)
    times = [t for _, t, _ in sent]
    assert [t for t in times if t < 10_500] == [0, 3000, 6000, 9000]
    assert times.count(10_500) == 2
    assert all(t < 21_000 for t in times)
    assert max(_in_flight_at(sent, t) for t in range(10_500, 21_000, 100)) == 3
    assert all(end is not None for _, _, end in sent)       # every request ended (drained)


def test_a_lower_stage_retires_clients_as_their_requests_end():
    """3 clients, then 1: from the boundary on, requests end and only client 0 sends again, so
    after the first sends past the boundary at most one request is ever in flight."""
    out = _run({"num_requests": 100, "concurrency_stages": [
        {"concurrency": 3, "duration_s": 0.0105}, {"concurrency": 1, "duration_s": 0.0105}]})
    sent = _sent(out)
    late = [(s, e) for _, s, e in sent if s >= 10_500]
    assert late and all(a[1] <= b[0] for a, b in zip(late, late[1:], strict=False))
    assert _in_flight_at(sent, late[0][0]) == 1
    assert max(_in_flight_at(sent, t) for t in range(0, 10_500, 100)) == 3


def test_request_count_stages_wait_for_the_drain():
    """inference-perf's concurrent stages: 2 clients for 4 requests, then 1 client for 2. The
    first stage's last two requests end at 6 ms; the second stage starts then."""
    out = _run({"num_requests": 100, "concurrency_stages": [
        {"concurrency": 2, "num_requests": 4}, {"concurrency": 1, "num_requests": 2}]})
    assert [(rid, t, end) for rid, t, end in _sent(out)] == [
        ("request_0", 0, 3000), ("request_1", 0, 3000), ("request_2", 3000, 6000),
        ("request_3", 3000, 6000), ("request_4", 6000, 9000), ("request_5", 9000, 12000)]
    assert out.sessions.stage_starts_us == [0, 6000]


def test_prefill_decode_pools():
    """PD: the parent's completion frees its client; 2 clients never have more than 2 requests
    in flight, and every request completes."""
    out = _run({"concurrency": 2, "num_requests": 8, "think_time": {"dist": "constant", "mean_ms": 1}},
               cluster={"num_instances": 2},
               disaggregation={"prefill_instances": 1, "decode_instances": 1,
                               "decider": {"policy": "always"}})
    sent = _sent(out)
    assert len(sent) == 8 and all(end is not None for _, _, end in sent)
    assert max(_in_flight_at(sent, t) for _, t, _ in sent) <= 2
    assert sent[0][1] == sent[1][1] == 0
    ends = sorted(end for _, _, end in sent)
    assert sorted(t for _, t, _ in sent[2:]) == [e + 1000 for e in ends[:6]]
    assert out.result.counters.offered == 8


def test_the_pool_is_the_source_in_order(tmp_path):
    """A trace source: the j-th request sent is the j-th row (ID and lengths), its arrival
    replaced by its send time; the trace's replay horizon does not cut the pool."""
    header = tmp_path / "t.yaml"
    data = tmp_path / "t.csv"
    header.write_text("trace_version: 2\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n")
    cols = ("request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,prefix_length,"
            "streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,"
            "reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,send_time_us,"
            "first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,finish_reason")
    rows = [f"{i},c,,,,0,,0,false,{10 + i},{2 + i % 3},0,0,0,0,0,,0,0,{1000 * i},{1000 * i},0,0,0,ok,,"
            for i in range(6)]
    data.write_text(cols + "\n" + "".join(r + "\n" for r in rows))
    sc = copy.deepcopy(BASE)
    sc["workload"] = {"kind": "trace", "header": str(header), "data": str(data), "concurrency": 1}
    out = run.execute(run.prepare(sc, {}, mode="replay"))
    reqs = out.sessions.followups
    assert [(r.input_len, r.output_len) for r in reqs] == [(10 + i, 2 + i % 3) for i in range(6)]
    assert reqs[0].arrival_us == 0
    assert all(b.arrival_us == a.arrival_us + out.report.cluster.e2e[a.id]
               for a, b in zip(reqs, reqs[1:], strict=False))


def test_distribution_pool_matches_the_open_loop_requests():
    """The clients send exactly the distribution's requests, in order (same IDs and lengths)."""
    sc = copy.deepcopy(BASE)
    sc["workload"].update({"num_requests": 5, "prompt_tokens": {"mean": 50, "stdev": 20, "min": 5, "max": 90}})
    open_loop = run.execute(run.prepare(copy.deepcopy(sc), {}))
    sc["workload"]["concurrency"] = 2
    closed = run.execute(run.prepare(sc, {}))
    a = [(r.id, r.input_len, r.output_len) for r in _requests(open_loop)]
    b = [(r.id, r.input_len, r.output_len) for r in closed.sessions.followups]
    assert len({n for _, n, _ in a}) > 1
    assert a == b


def _requests(out):
    return list(run.workload.build_workload(out.description)[0])


def test_exponential_think_times_are_seeded():
    wl = {"concurrency": 3, "num_requests": 12, "think_time": {"dist": "exponential", "mean_ms": 2}}
    a = [t for _, t, _ in _sent(_run(wl))]
    b = [t for _, t, _ in _sent(_run(wl))]
    c = [t for _, t, _ in _sent(_run(wl, seed=7))]
    assert a == b and a != c


def test_think_time_samplers():
    rng = numpy_rng(3)
    assert ThinkTimeSampler("constant", 1.2345).draw_us(rng) == 1235
    draws = [ThinkTimeSampler("exponential", 2.0).draw_us(numpy_rng(5)) for _ in range(2)]
    assert draws[0] == draws[1] == int(numpy_rng(5).standard_exponential() * 2000.0)
    g = numpy_rng(11)
    x = np.array([ThinkTimeSampler("lognormal", 10.0, 0.5).draw_us(g) for _ in range(20_000)])
    # mean 10 ms: exp(mu + sigma^2/2) = mean; the sample mean's sd is 10 ms·sqrt(e^0.25 - 1)/sqrt(n)
    sd = 10_000 * np.sqrt(np.exp(0.25) - 1) / np.sqrt(len(x))
    assert abs(x.mean() - 10_000) < 4 * sd


def test_horizon_stops_the_clients():
    out = _run({"concurrency": 2, "num_requests": 100, "think_time": {"dist": "constant", "mean_ms": 0.5}},
               horizon_us=7000)
    sent = _sent(out)
    assert [t for _, t, _ in sent] == [0, 0, 3500, 3500, 7000, 7000]
    c = out.result.counters
    assert c.offered == c.arrived == 6
    assert out.report.cluster.completed_requests == 4


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_client_sends_when_its_previous_request_ended_plus_think(seed):
    """Varied lengths and a batch-dependent step time: per client, every send is exactly the
    previous request's completion tick + the think time, and never more than N requests are
    in flight (the closed-loop causality, INV-10's counterpart for clients)."""
    n, think_us = 4, 700
    out = _run({"concurrency": n, "num_requests": 30, "think_time": {"dist": "constant", "mean_ms": 0.7},
                "prompt_tokens": {"mean": 60, "stdev": 40, "min": 5, "max": 200},
                "output_tokens": {"mean": 12, "stdev": 8, "min": 1, "max": 40}},
               latency={"beta_coeffs": [800, 2, 30]}, seed=seed)
    m = out.sessions
    done = out.report.cluster.completion_time
    assert len(m.followups) == 30 and set(m.sent_by) == set(range(n))
    for k in range(n):
        mine = [r for r, c in zip(m.followups, m.sent_by, strict=True) if c == k]
        assert mine[0].arrival_us == 0
        assert [b.arrival_us for b in mine[1:]] == [done[a.id] + think_us for a in mine[:-1]]
    sent = _sent(out)
    assert max(_in_flight_at(sent, t) for _, t, _ in sent) <= n


def test_inline_admission_gives_the_keyed_order(monkeypatch):
    """A send is admitted and routed in its own event only when nothing comes first
    (``SimEnv.quiet_through``): forcing the keyed events gives the same sends and ends."""
    from blis_simpy.des import SimEnv
    wl = {"concurrency": 3, "num_requests": 15, "think_time": {"dist": "exponential", "mean_ms": 1},
          "output_tokens": {"mean": 6, "stdev": 4, "min": 1, "max": 12}}
    fast = _run(wl, cluster={"num_instances": 2})
    monkeypatch.setattr(SimEnv, "quiet_through", lambda self, key: False)
    keyed = _run(wl, cluster={"num_instances": 2})
    assert _sent(fast) == _sent(keyed)
    assert [r.assigned_instance for r in fast.sessions.followups] == \
        [r.assigned_instance for r in keyed.sessions.followups]
    assert keyed.result.events_processed > fast.result.events_processed


def test_request_accounting_balances():
    out = _run({"concurrency": 3, "num_requests": 9})
    acc = out.report.request_accounting
    assert acc["offered"] == acc["completed"] == 9
    assert all(r.state == COMPLETED for r in out.sessions.followups)
