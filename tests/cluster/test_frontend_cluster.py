"""The API server in front of every instance (docs/frontend.md) in a routed cluster, with data
parallelism, with prefill/decode pools and with closed-loop sessions; the latency model's
defaults and the scenario's override.

Blackbox latency with no queueing delay and no OTPT unless stated,
``step = 1000 + 10 * prefill tokens + 5 * decode tokens`` µs (TinyLatency for DP:
``1000 + 100 * tokens``). Front end: 100 µs + 1 µs per prompt token (132 µs for 32 tokens).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_simpy.config.loader import Source, validate
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.resolve import Deployment
from blis_simpy.errors import ConfigError
from blis_simpy.latency.frontend import FrontendParams
from blis_simpy.request import COMPLETED, Request
from blis_simpy.run.simulation import Simulation
from blis_simpy.workload import WorkloadSpecV2, generate_workload
from tests.engine.helpers import DENSE, MOE, TinyLatency, make_requests, scenario

TOKENIZE = dict(request_us=100, input_token_us=1)
FULL = dict(request_us=100, input_token_us=1, step_output_us=200, output_token_us=10, network_us=50)


def with_frontend(sc: Scenario, fe: dict | None, mode: str = "server") -> Scenario:
    sc.frontend = None if fe is None else FrontendParams(**fe)
    sc.metrics.measured_at = mode
    return sc


def blackbox(**kw) -> Scenario:
    return scenario(alpha=(0.0, 0.0, 0.0), beta=(1000.0, 10.0, 5.0), **kw)


# ---------------------------------------------------------------------------- routed cluster
@pytest.mark.parametrize("n, handovers", [(1, [132, 264]), (2, [132, 132])])
def test_each_instance_has_its_own_front_end(n, handovers):
    """Two requests at 0: on one instance the second tokenize waits for the first; behind a
    round-robin router each instance's API server takes one, in parallel."""
    reqs = make_requests([(0, 32, 2), (0, 32, 2)])
    sim = Simulation(with_frontend(blackbox(num_instances=n), TOKENIZE), reqs)
    res = sim.run()
    assert [r.origin_us for r in reqs] == handovers
    assert [inst.frontend.busy_us for inst in sim.instances] == [2 * 132 // n] * n
    assert sum(m.completed_requests for m in res.instances) == 2


# ---------------------------------------------------------------------------- data parallelism
def _dp(model, fe, mode, reqs):
    sc = Scenario(model="test/tiny", dp=2,
                  latency={"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1, 0, 0]},
                  engine={"total_kv_blocks": 1000, "block_size": 16})
    with_frontend(sc, fe, mode)
    dep = Deployment(total_kv_blocks=1000, block_size=16, max_model_len=0,
                     latency_factory=TinyLatency, model_config=model, tp=1)
    sim = Simulation(sc, reqs, deployment=dep)
    return sim, sim.run()


@pytest.mark.parametrize("model, end", [(DENSE, 116 + 2600), (MOE, 116 + 2610)])
def test_every_dp_rank_has_its_own_front_end(model, end):
    """Two requests at 0 (16 prompt tokens, 1 output token): the front door puts one on each
    rank, and each rank's API server tokenizes its own (100 + 16 µs: both handed over at
    116), so both prefill at once: dense ranks step alone (1000 + 100 * 16 = 2600 µs), MoE
    ranks in lockstep (the slowest rank + 10 = 2610 µs)."""
    reqs = make_requests([(0, 16, 1), (0, 16, 1)])
    sim, res = _dp(model, TOKENIZE, "server", reqs)
    assert [r.origin_us for r in reqs] == [116, 116]
    assert [r.assigned_instance for r in reqs] == ["instance_0", "instance_1"]
    assert [m.ttft for m in res.instances] == [{"request_0": end - 116}, {"request_1": end - 116}]
    reqs = make_requests([(0, 16, 1), (0, 16, 1)])
    sim, res = _dp(model, TOKENIZE, "client", reqs)
    assert [m.ttft for m in res.instances] == [{"request_0": end}, {"request_1": end}]
    assert [inst.frontend.busy_us for inst in sim.instances] == [116, 116]


# ---------------------------------------------------------------------------- PD
def _pd_data(mode: str, fe=FULL, compat="fixed") -> dict:
    return {
        "seed": 7, "model": "m",
        "latency": {"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1000, 10, 5]},
        "engine": {"total_kv_blocks": 1000, "block_size": 16},
        "cluster": {"num_instances": 2},
        "disaggregation": {"prefill_instances": 1, "decode_instances": 1,
                           "decider": {"policy": "always"}, "compat": compat,
                           "transfer": {"bandwidth_gbps": 1e6, "base_latency_ms": 0,
                                        "kv_bytes_per_token": 1, "contention": "none"}},
        "frontend": fe, "metrics": {"measured_at": mode}}


def _pd(mode: str, fe=FULL, compat="fixed") -> Scenario:
    return Scenario.model_validate(_pd_data(mode, fe, compat))


def _pd_request() -> Request:
    return Request("r", 0, np.arange(32), np.arange(3) + 7)


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_pd_by_hand(impl):
    """One request (32 prompt tokens, 3 output tokens), decider always; front end FULL on
    both instances (a step's token costs 210 µs; network 50 µs each way).
      prefill instance: its API server has the request at 50, hands it over at 182; prefill
        182 -> 1502 emits the first token, written at 1712, at the proxy at 1762: the prefill
        sub-request leaves then and the KV transfer runs 1762 -> 1763 (1 µs)
      decode instance: no tokenize (the request is already there); decode steps
        1763 -> 2768 -> 3773; its API server streams both tokens: at the client 3028, 4033
      server (from 182): TTFT = decode scheduling delay 1581 + first decode ITL 1005 = 2586,
        E2E = 1581 + 2 * 1005 = 3591
      client (from 0): TTFT 3028 (the decode side's first token), E2E 4033"""
    for mode, ttft, e2e, completion in (("server", 2586, 3591, 3773), ("client", 3028, 4033, 4033)):
        sc = _pd(mode)
        sc.engine.implementation = impl
        sim = Simulation(sc, [_pd_request()])
        res = sim.run()
        p = sim.cluster.parents["r"]
        assert p.phase_times() == (0, 0, 1762, 1762, 1763, 1763, 4033), mode
        agg = res.cluster
        assert (agg.ttft, agg.e2e, agg.completion_time) == ({"r": ttft}, {"r": e2e}, {"r": completion})
        assert agg.itl == {"r": 1005.0} and agg.scheduling_delay == {"r": 0 if mode == "server" else 182}
        assert agg.completed_requests == 1 and res.pd.parent_ttft.mean == ttft
        assert [inst.frontend.busy_us for inst in sim.instances] == [132 + 210, 2 * 210]


def test_pd_parity_mode_refuses_a_front_end():
    """BLIS's PD parity mode (compat checkout) has no API server: a scenario's is a located
    error on ``frontend``, a latency model's one on ``latency.model``; costs of 0 are fine."""
    with pytest.raises(ConfigError) as e:
        validate(_pd_data("server", compat="checkout"), Source(None), semantic=False)
    assert e.value.field == "frontend" and "compat checkout" in e.value.problem
    sim = Simulation(_pd("server", fe={}, compat="checkout"), [_pd_request()])
    assert all(inst.frontend is None for inst in sim.instances)
    dep = Deployment(total_kv_blocks=1000, block_size=16, max_model_len=0,
                     latency_factory=WithFrontend, model_config=None, tp=1)
    with pytest.raises(ConfigError) as e:
        Simulation(_pd("server", fe=None, compat="checkout"), [_pd_request()], deployment=dep)
    assert e.value.field == "latency.model" and "compat checkout" in str(e.value)


# ---------------------------------------------------------------------------- sessions
def _sessions(mode: str):
    client = {"id": "chat", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
              "input_distribution": {"type": "constant", "params": {"value": 40}},
              "output_distribution": {"type": "constant", "params": {"value": 4}},
              "reasoning": {"multi_turn": {"max_rounds": 3, "think_time_us": 5000,
                                           "context_growth": "accumulate"}}}
    spec = WorkloadSpecV2.model_validate({"version": "2", "seed": 3, "aggregate_rate": 20.0,
                                          "num_requests": 6, "clients": [client]})
    wl = generate_workload(spec)
    mgr = wl.session_manager()
    ticks = {}
    orig = mgr.on_request_done

    def spy(r, tick):
        ticks.setdefault(r.id, (tick, r.state))
        return orig(r, tick)

    mgr.on_request_done = spy
    sc = with_frontend(blackbox(), dict(FULL, step_output_us=2000), mode)
    res = Simulation(sc, wl.requests, sessions=mgr).run()
    return wl, mgr, res, ticks


@pytest.mark.parametrize("mode", ["server", "client"])
def test_a_session_sends_its_next_round_when_the_client_has_the_answer(mode):
    """INV-10 with a front end: round n + 1 arrives at the client's receipt of round n's last
    token + the think time. That receipt is the client-side completion time; the engine
    finished earlier (the server-side completion time)."""
    wl, mgr, res, ticks = _sessions(mode)
    m = res.instances[0]
    assert mgr.followups and res.sessions.completed == res.sessions.sessions
    for f in mgr.followups:
        prev = next(r for r in wl.requests + mgr.followups
                    if r.session_id == f.session_id and r.round_index == f.round_index - 1)
        tick, state = ticks[prev.id]
        assert state == COMPLETED and f.arrival_us == tick + 5000
        if mode == "client":
            assert tick == m.completion_time[prev.id]
        else:
            assert tick > m.completion_time[prev.id] + 2000     # one output write at least


# ---------------------------------------------------------------------------- defaults
class WithFrontend(TinyLatency):
    """A latency model that supplies front-end costs."""

    def frontend_params(self):
        return FrontendParams(request_us=100, input_token_us=1)


class Bad(TinyLatency):
    def frontend_params(self):
        return {"request_us": 100}


def _hooked(latency, fe):
    sc = Scenario(model="test/tiny", latency={"model": "blackbox", "alpha_coeffs": [0, 0, 0],
                                               "beta_coeffs": [1, 0, 0]},
                  engine={"total_kv_blocks": 1000, "block_size": 16})
    sc.frontend = fe
    dep = Deployment(total_kv_blocks=1000, block_size=16, max_model_len=0,
                     latency_factory=latency, model_config=None, tp=1)
    return Simulation(sc, make_requests([(0, 16, 2)]), deployment=dep)


def test_the_latency_model_supplies_defaults_and_the_scenario_wins():
    sim = _hooked(WithFrontend, None)
    assert sim.instances[0].frontend.params.request_us == 100
    sim.run()
    assert sim.requests[0].origin_us == 116
    sim = _hooked(WithFrontend, FrontendParams(network_us=7))
    assert sim.instances[0].frontend.params == FrontendParams(network_us=7)
    assert _hooked(WithFrontend, FrontendParams()).instances[0].frontend is None
    assert _hooked(TinyLatency, None).instances[0].frontend is None     # the base: none
    with pytest.raises(ConfigError) as e:
        _hooked(Bad, None)
    assert e.value.field == "latency.model" and "FrontendParams" in str(e.value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 20_000), st.integers(1, 200), st.integers(0, 30),
                          st.sampled_from([0, 0, 60_000])), min_size=1, max_size=25),
       st.sampled_from(["always", "never"]), st.sampled_from([16, 60]),
       st.fixed_dictionaries({k: st.sampled_from([0.0, 3.0, 400.0]) for k in FULL}))
def test_pd_engines_agree_with_a_front_end(gaps, decider, decode_kv, fe):
    """Random 1P1D runs (small decode KV pools: drops and preemptions; deadlines) with random
    front-end costs: both engines give the same parent records in each mode, and the engine
    counters are the same in both modes."""
    t = 0
    reqs_spec = []
    for i, (gap, n_in, n_out, timeout) in enumerate(gaps):
        t += gap
        reqs_spec.append((f"r{i}", t, n_in, n_out, t + timeout if timeout else 0))
    got = {}
    for mode in ("server", "client"):
        for impl in ("reference", "fast"):
            data = _pd_data(mode, fe)
            data["engine"]["implementation"] = impl
            data["disaggregation"]["decider"]["policy"] = decider
            data["disaggregation"]["decode_pool"] = {"total_kv_blocks": decode_kv}
            reqs = [Request(rid, a, np.arange(n) + 10 * i, np.arange(m) + 7, deadline_us=d)
                    for i, (rid, a, n, m, d) in enumerate(reqs_spec)]
            got[mode, impl] = Simulation(Scenario.model_validate(data), reqs).run().cluster
        a, b = got[mode, "reference"], got[mode, "fast"]
        for name in ("ttft", "e2e", "itl", "scheduling_delay", "completion_time",
                     "completed_requests", "timed_out_requests", "dropped_unservable"):
            assert getattr(a, name) == getattr(b, name), (mode, name)
    for name in ("completed_requests", "timed_out_requests", "dropped_unservable",
                 "total_output_tokens", "preemption_count"):
        assert getattr(got["server", "fast"], name) == getattr(got["client", "fast"], name), name
