"""The API server in front of an instance (docs/frontend.md): tiny cases worked out by hand,
exact integer-µs times, under both ``metrics.measured_at`` modes and both engines.

Latency model unless stated (blackbox, docs/latency-models.md): no queueing delay, no OTPT,
    step = 1000 + 10 * prefill tokens + 5 * decode tokens   (β0, β1, β2)
Front end (FE) unless stated: request_us 100, input_token_us 1 (a 32-token prompt costs
132 µs), step_output_us 200, output_token_us 10 (one token: 210 µs), network_us 50.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_simpy.latency.frontend import FrontendParams
from blis_simpy.metrics.summary import request_rows
from blis_simpy.run.simulation import Simulation
from tests.engine.helpers import make_requests, scenario
from tests.engine.test_fast_vs_reference import FIELDS, workloads

IMPLS = ["reference", "fast"]
FE = dict(request_us=100, input_token_us=1, step_output_us=200, output_token_us=10, network_us=50)


def fe_scenario(mode: str = "server", fe: dict | None = FE, *, alpha=(0.0, 0.0, 0.0), impl="fast",
                **engine):
    # the exact times below are worked out for BLIS's synchronous scheduling (a request handed
    # to the engine during a step joins the next one): async scheduling off unless asked for
    engine.setdefault("async_scheduling", False)
    sc = scenario(alpha=alpha, beta=(1000.0, 10.0, 5.0), implementation=impl, **engine)
    sc.frontend = None if fe is None else FrontendParams(**fe)
    sc.metrics.measured_at = mode
    return sc


def simulate(sc, reqs, horizon_us=None):
    sim = Simulation(sc, reqs, horizon_us=horizon_us)
    return sim, sim.run()


# ---------------------------------------------------------------------------- one request
# arrival 0, 32 prompt tokens, 3 output tokens, one instance:
#   the request reaches the FE at 50; tokenize 100 + 32 = 132 -> handed to the engine at 182
#   step 1 182 -> 1502 (prefill 32: 1320), step 2 1502 -> 2507, step 3 2507 -> 3512 (decodes: 1005)
#   FE: each step's token 210 µs: written at 1712, 2717, 3722; at the client 50 µs later:
#   1762, 2767, 3772


@pytest.mark.parametrize("impl", IMPLS)
def test_one_request_server(impl):
    """server: the engine's clock starts at the hand-over (182)."""
    sim, res = simulate(fe_scenario("server", impl=impl), make_requests([(0, 32, 3)]))
    m = res.instances[0]
    assert m.ttft == {"request_0": 1502 - 182}
    assert m.e2e == {"request_0": 3512 - 182}
    assert m.itl == {"request_0": 1005.0} and dict(m.all_itls) == {1005: 2}
    assert m.scheduling_delay == {"request_0": 0}
    assert m.completion_time == {"request_0": 3512}
    (row,) = request_rows(m)
    assert row["arrived_at"] == 182 / 1e6      # where the server's clock starts
    fe = sim.instances[0].frontend
    assert fe.busy_us == 132 + 3 * 210 and fe.undelivered == 0
    assert sim.cluster.inflight == [0]


@pytest.mark.parametrize("impl", IMPLS)
def test_one_request_client(impl):
    """client: from the send (0) to the tokens' receipt (1762, 2767, 3772)."""
    sim, res = simulate(fe_scenario("client", impl=impl), make_requests([(0, 32, 3)]))
    m = res.instances[0]
    assert m.ttft == {"request_0": 1762}
    assert m.itl == {"request_0": 1005.0} and dict(m.all_itls) == {1005: 2}
    assert m.e2e == {"request_0": 3772}
    assert m.completion_time == {"request_0": 3772}
    assert m.scheduling_delay == {"request_0": 182}
    assert m.ttft_sum == 1762
    (row,) = request_rows(m)
    assert row["arrived_at"] == 0.0 and row["ttft_ms"] == 1.762 and row["e2e_ms"] == 3.772
    # the engine itself is unchanged by where latencies are measured
    assert (m.step_samples, m.total_output_tokens, m.sim_ended_time) == (3, 2, 3512)


@pytest.mark.parametrize("impl", IMPLS)
def test_output_token_overhead_and_queueing_delay_count_in_both_modes(impl):
    """alpha = (100, 1, 50): the latency model's queueing delay (100 + 32) starts at the
    hand-over (182): queued at 314; steps 314 -> 1634 -> 2639 -> 3644. OTPT 50 is added to
    TTFT and to every ITL sample in both modes, as without a front end.
      server: TTFT 1634 + 50 - 182 = 1502, ITL 1005 + 50, E2E 1502 + 2 * 1055 = 3612
      client: tokens at the client 1894, 2899, 3904: TTFT 1894 + 50 = 1944,
              ITL (2899 - 1894) + 50 = 1055, E2E 1944 + 2 * 1055 = 4054"""
    alpha = (100.0, 1.0, 50.0)
    res = simulate(fe_scenario("server", alpha=alpha, impl=impl), make_requests([(0, 32, 3)]))[1]
    m = res.instances[0]
    assert (m.ttft, m.e2e, dict(m.all_itls)) == ({"request_0": 1502}, {"request_0": 3612}, {1055: 2})
    assert m.scheduling_delay == {"request_0": 132}
    res = simulate(fe_scenario("client", alpha=alpha, impl=impl), make_requests([(0, 32, 3)]))[1]
    m = res.instances[0]
    assert (m.ttft, m.e2e, dict(m.all_itls)) == ({"request_0": 1944}, {"request_0": 4054}, {1055: 2})
    assert m.scheduling_delay == {"request_0": 314}


# ---------------------------------------------------------------------------- queueing on the CPU
# Two requests at 0 (32 prompt tokens, 2 output tokens each); FE: 132 µs per request, outputs
# free, no network. The second request's tokenize waits for the first's: hand-overs at 132
# and 264. Engine: step 1 132 -> 1452 (r0 prefill); r1 queued at 264 joins step 2
# 1452 -> 2777 (r0 decode + r1 prefill: 1000 + 320 + 5 = 1325; r0 completes); step 3
# 2777 -> 3782 (r1 decode, completes). Outputs cost nothing: the client sees every token at
# its step's end.
CPU_ONLY = dict(request_us=100, input_token_us=1)


@pytest.mark.parametrize("impl", IMPLS)
def test_second_tokenize_queues_behind_the_first(impl):
    reqs = make_requests([(0, 32, 2), (0, 32, 2)])
    sim, res = simulate(fe_scenario("server", CPU_ONLY, impl=impl), reqs)
    m = res.instances[0]
    assert [r.origin_us for r in reqs] == [132, 264]
    assert m.ttft == {"request_0": 1452 - 132, "request_1": 2777 - 264}
    assert m.e2e == {"request_0": 2777 - 132, "request_1": 3782 - 264}
    assert m.scheduling_delay == {"request_0": 0, "request_1": 1452 - 264}
    assert sim.instances[0].frontend.busy_us == 2 * 132
    reqs = make_requests([(0, 32, 2), (0, 32, 2)])
    m = simulate(fe_scenario("client", CPU_ONLY, impl=impl), reqs)[1].instances[0]
    assert m.ttft == {"request_0": 1452, "request_1": 2777}
    assert m.e2e == {"request_0": 2777, "request_1": 3782}
    assert m.scheduling_delay == {"request_0": 132, "request_1": 1452}


# ---------------------------------------------------------------------------- deliveries fall behind
# One request, 16 prompt tokens, 5 output tokens; FE: only step_output_us 1500, slower than a
# decode step (1005). Engine: 0 -> 1160 (prefill), then 4 decode steps ending 2165, 3170,
# 4175, 5180. FE writes: 1160 -> 2660, then back to back: 4160, 5660, 7160, 8660.
SLOW_OUT = dict(step_output_us=1500)


@pytest.mark.parametrize("impl", IMPLS)
def test_slow_output_work_makes_deliveries_fall_behind(impl):
    sim, res = simulate(fe_scenario("server", SLOW_OUT, impl=impl), make_requests([(0, 16, 5)]))
    m = res.instances[0]
    assert (m.ttft, m.itl, m.e2e) == ({"request_0": 1160}, {"request_0": 1005.0}, {"request_0": 5180})
    if impl == "fast":      # the pure-decode short path still times every step, one event each
        assert sim.instances[0].decode_ticks == 3
    sim, res = simulate(fe_scenario("client", SLOW_OUT, impl=impl), make_requests([(0, 16, 5)]))
    m = res.instances[0]
    assert m.ttft == {"request_0": 2660}
    assert dict(m.all_itls) == {1500: 4} and m.itl == {"request_0": 1500.0}
    assert m.e2e == {"request_0": 8660}
    assert sim.instances[0].frontend.busy_us == 5 * 1500
    if impl == "fast":      # the short path counts each decoder's tokens as they go
        assert sim.instances[0].decode_ticks == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_a_request_leaves_when_its_last_token_is_delivered(impl):
    """Same run: the engine completes the request at 5180, the client has it at 8660; the
    cluster counts it in flight until then (and a closed-loop session would send its next
    round then)."""
    sim = Simulation(fe_scenario("server", SLOW_OUT, impl=impl), make_requests([(0, 16, 5)]))
    sim.cluster.start(sim.requests)
    sim.env.run(until=8000)
    inst = sim.instances[0]
    assert inst.metrics.completed_requests == 1
    assert sim.cluster.inflight == [1] and inst.frontend.undelivered == 1
    sim.env.run(until=8661)
    assert sim.cluster.inflight == [0] and inst.frontend.undelivered == 0


def test_horizon_before_delivery(caplog):
    """Cut at 6000: the engine completed the request (5180) but its last token is still in
    the FE. server: its engine figures are complete; client: it has a TTFT (2660) but no
    E2E, and it is still in flight — no warning about the in-flight count."""
    res = simulate(fe_scenario("server", SLOW_OUT), make_requests([(0, 16, 5)]), horizon_us=6000)[1]
    m = res.instances[0]
    assert m.completed_requests == 1 and m.e2e == {"request_0": 5180}
    sim, res = simulate(fe_scenario("client", SLOW_OUT), make_requests([(0, 16, 5)]), horizon_us=6000)
    m = res.instances[0]
    assert m.completed_requests == 1 and m.ttft == {"request_0": 2660} and m.e2e == {}
    assert dict(m.all_itls) == {} and m.ttft_sum == 2660
    assert sim.instances[0].frontend.undelivered == 1
    assert "in flight at the end" not in caplog.text


def test_a_first_token_not_yet_delivered_has_no_client_ttft():
    """Cut at 2000: the first token left the engine at 1160 but reaches the client at 2660."""
    res = simulate(fe_scenario("client", SLOW_OUT), make_requests([(0, 16, 5)]), horizon_us=2000)[1]
    m = res.instances[0]
    assert m.ttft == {} and m.ttft_sum == 0 and m.scheduling_delay == {"request_0": 0}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("deadline, client_ttft", [(2000, None), (3000, 2660)])
def test_timeout_keeps_a_ttft_the_client_had(impl, deadline, client_ttft):
    """Same request with a deadline: it times out decoding. The server-side TTFT (1160) is
    the engine's; the client's exists only if its first token reached the client (2660)
    before the timeout — vLLM's API server drops the outputs of an aborted request."""
    reqs = make_requests([(0, 16, 5, deadline)])
    m = simulate(fe_scenario("server", SLOW_OUT, impl=impl), reqs)[1].instances[0]
    assert m.timed_out_requests == 1 and m.ttft == {"request_0": 1160} and m.e2e == {}
    sim, res = simulate(fe_scenario("client", SLOW_OUT, impl=impl), make_requests([(0, 16, 5, deadline)]))
    m = res.instances[0]
    assert m.timed_out_requests == 1 and m.e2e == {} and dict(m.all_itls) == {}
    assert m.ttft == ({} if client_ttft is None else {"request_0": client_ttft})
    assert sim.cluster.inflight == [0]


# ---------------------------------------------------------------------------- off
@pytest.mark.parametrize("fe", [None, {}, dict.fromkeys(FE, 0.0)])
@pytest.mark.parametrize("mode", ["server", "client"])
def test_no_cost_means_no_front_end_and_the_same_numbers(fe, mode):
    reqs = make_requests([(0, 32, 3), (10, 64, 8), (20, 16, 1)])
    sim, res = simulate(fe_scenario(mode, fe, alpha=(100.0, 1.0, 50.0)), reqs)
    assert sim.instances[0].frontend is None
    base = simulate(scenario(async_scheduling=False), make_requests([(0, 32, 3), (10, 64, 8), (20, 16, 1)]))[1]
    for name in ("ttft", "e2e", "itl", "scheduling_delay", "completion_time", "all_itls"):
        assert getattr(res.instances[0], name) == getattr(base.instances[0], name), name


# ---------------------------------------------------------------------------- invariants
def _load(n=60, seed=5):
    specs = [(i * 700, 16 + (i * 37) % 200, 1 + (i * 13) % 40) for i in range(n)]
    return make_requests(specs, seed=seed)


@pytest.mark.parametrize("impl", IMPLS)
def test_client_figures_are_the_server_ones_plus_the_front_end(impl):
    """Both modes run the same simulation (only where latencies are taken differs); per
    request, the client's TTFT and E2E are at least the server's plus the request's own
    tokenize time and the network both ways; every request is delivered, and the FE's CPU
    time is exactly the per-request costs plus the per-token cost of every emitted token."""
    fe = dict(request_us=300, input_token_us=2, output_token_us=40, network_us=25)
    sc = dict(max_num_running_reqs=8, max_num_scheduled_tokens=256)
    s_sim, s = simulate(fe_scenario("server", fe, impl=impl, **sc), _load())
    c_sim, c = simulate(fe_scenario("client", fe, impl=impl, **sc), reqs := _load())
    ms, mc = s.instances[0], c.instances[0]
    assert ms.completed_requests == mc.completed_requests == len(reqs)
    for name in ("step_samples", "total_output_tokens", "kv_blocks_integral", "sim_ended_time"):
        assert getattr(ms, name) == getattr(mc, name), name
    for r in reqs:
        tokenize = 300 + 2 * r.input_len
        assert mc.ttft[r.id] >= ms.ttft[r.id] + tokenize + 2 * 25
        assert mc.e2e[r.id] >= ms.e2e[r.id] + tokenize + 2 * 25
        assert mc.e2e[r.id] >= mc.ttft[r.id]
    fe_s, fe_c = s_sim.instances[0].frontend, c_sim.instances[0].frontend
    tokens = sum(r.output_len for r in reqs)
    assert fe_s.busy_us == fe_c.busy_us == sum(300 + 2 * r.input_len for r in reqs) + 40 * tokens
    assert fe_s.undelivered == fe_c.undelivered == 0
    assert sum(mc.all_itls.values()) == sum(r.output_len - 1 for r in reqs)
    assert sum(ms.all_itls.values()) == sum(mc.all_itls.values())


def test_both_engines_agree_with_a_front_end():
    for mode in ("server", "client"):
        fe = dict(request_us=50, input_token_us=1, step_output_us=300, output_token_us=30)
        runs = [simulate(fe_scenario(mode, fe, impl=impl, max_num_running_reqs=6), _load(40))[1]
                .instances[0] for impl in IMPLS]
        for name in ("ttft", "e2e", "itl", "scheduling_delay", "completion_time", "all_itls"):
            assert getattr(runs[0], name) == getattr(runs[1], name), (mode, name)


@pytest.mark.parametrize("preemption_model", ["vllm", "blis"])
def test_under_kv_pressure_both_engines_agree_and_every_token_is_delivered(preemption_model):
    """A KV cache of 40 blocks preempts requests (recomputed, or regenerated under blis, which
    records TTFTs again); deadlines time some out. Both engines give the same client-side
    figures; every completed request's E2E covers its TTFT and its ITL samples, and the
    client sees each token once (the histogram has one sample per token after the first of
    every completed request, as the engine's own)."""
    fe = dict(request_us=50, input_token_us=1, step_output_us=300, output_token_us=30, network_us=10)
    specs = [(i * 400, 16 + (i * 37) % 120, 1 + (i * 13) % 40, 0 if i % 7 else i * 400 + 30_000)
             for i in range(50)]
    got = {}
    for impl in IMPLS:
        for mode in ("server", "client"):
            sc = fe_scenario(mode, fe, impl=impl, total_kv_blocks=40, preemption_model=preemption_model)
            sim, res = simulate(sc, make_requests(specs, seed=9))
            got[impl, mode] = (res.instances[0], sim.instances[0].frontend)
    for mode in ("server", "client"):
        a, b = got["reference", mode][0], got["fast", mode][0]
        for name in ("ttft", "e2e", "itl", "scheduling_delay", "completion_time", "all_itls",
                     "preemption_count", "timed_out_requests", "ttft_sum"):
            assert getattr(a, name) == getattr(b, name), (mode, name)
    ms, mc = got["fast", "server"][0], got["fast", "client"][0]
    assert ms.preemption_count > 0 and ms.timed_out_requests > 0
    assert set(mc.e2e) == set(ms.e2e) and got["fast", "client"][1].undelivered == 0
    assert sum(mc.all_itls.values()) == sum(ms.all_itls.values())
    for rid, e2e in mc.e2e.items():
        assert e2e >= mc.ttft[rid] and mc.ttft[rid] >= ms.ttft[rid]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.fixed_dictionaries({
    k: st.sampled_from([0.0, 0.5, 7.0, 300.0, 2500.0]) for k in FE}))
def test_engines_agree_and_modes_share_one_simulation(w, fe):
    """Random workloads (chunked prefill, preemption under both models, prefix hits,
    MaxModelLen, timeouts, horizon cuts) with random front-end costs: the two engines give
    identical results in each mode; the two modes run the same simulation (the engine's
    counters agree); client TTFTs are never earlier than the server's, preemptions included
    (but where a timeout leaves a stale step that overlaps a new chain of steps — BLIS's
    behaviour, docs/engine.md — a later token can reach the client first); every request the
    engine completed is delivered unless the horizon cut it off."""
    specs, groups, engine, seed, horizon = w
    got = {}
    for mode in ("server", "client"):
        for impl in IMPLS:
            sc = fe_scenario(mode, fe, alpha=(100.0, 1.0, 20.0), impl=impl, **engine)
            sim, res = simulate(sc, make_requests(specs, seed=seed, prefixes=groups), horizon)
            got[mode, impl] = (res.instances[0], sim)
        a, b = (got[mode, impl][0] for impl in IMPLS)
        for name in FIELDS:
            assert getattr(a, name) == getattr(b, name), (mode, name)
        fes = [got[mode, impl][1].instances[0].frontend for impl in IMPLS]
        if fes[0] is not None:              # the same work on the API server's CPU
            assert fes[0].busy_us == fes[1].busy_us, mode
    ms, mc = got["server", "fast"][0], got["client", "fast"][0]
    for name in ("completed_requests", "total_output_tokens", "step_samples", "timed_out_requests",
                 "preemption_count", "kv_blocks_integral"):
        assert getattr(ms, name) == getattr(mc, name), name
    assert set(mc.e2e) <= set(ms.e2e)
    if not ms.timed_out_requests:
        for rid, t in mc.ttft.items():
            assert t >= ms.ttft[rid], rid
    sim = got["client", "fast"][1]
    fe_obj = sim.instances[0].frontend
    if fe_obj is not None and horizon is None:
        assert fe_obj.undelivered == 0 and set(mc.e2e) == set(ms.e2e)
