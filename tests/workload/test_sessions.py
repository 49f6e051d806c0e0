"""Closed-loop sessions (docs/workloads.md): the SessionManager's rules, exact follow-up contents,
and whole runs — INV-10 (session causality), INV-11 (session completeness), cancellation on
timeout / drop / rejection, horizon interruption, determinism."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import InvariantError
from blis_simpy.request import COMPLETED, DROPPED, QUEUED, TIMED_OUT
from blis_simpy.rng import child_seed, numpy_rng
from blis_simpy.run.simulation import Simulation
from blis_simpy.workload import WorkloadSpecV2, generate_workload
from blis_simpy.workload.samplers import RequestSampler
from blis_simpy.workload.sessions import SessionBlueprint, SessionManager

CONST = lambda v: {"type": "constant", "params": {"value": v}}  # noqa: E731


# ---------------------------------------------------------------------------- unit helpers
def _sampler(n_in=5, n_out=3):
    c = SimpleNamespace(input_distribution=SimpleNamespace(type="constant", params={"value": n_in}),
                        output_distribution=SimpleNamespace(type="constant", params={"value": n_out}),
                        multimodal=None, reasoning=None)
    return RequestSampler(c)


def _bp(sid="sess_1", *, rounds=3, think=100, horizon=10**9, timeout=None, accumulate=False,
        prefix=(), seed=1, n_in=5, n_out=3):
    return SessionBlueprint(session_id=sid, sampler=_sampler(n_in, n_out), rng=numpy_rng(seed),
                            max_rounds=rounds, think_time_us=think, horizon_us=horizon,
                            timeout_us=timeout, accumulate=accumulate,
                            prefix=np.asarray(prefix, dtype=np.int32), client_id="c", tenant_id="t",
                            slo_class="batch", model="m", prefix_group="g" if prefix else "",
                            current_id=f"r0_{sid}")


def _done(rid, sid, state=COMPLETED, inp=(1, 2), out=(7, 8, 9), pi=None):
    inp, out = np.asarray(inp, dtype=np.int32), np.asarray(out, dtype=np.int32)
    return SimpleNamespace(id=rid, session_id=sid, state=state, input_tokens=inp, output_tokens=out,
                           pi=len(inp) + max(len(out), 1) - 1 if pi is None else pi)


def _followup_draws(seed, n_in, n_out, rounds):
    """What a blueprint RNG seeded ``seed`` yields for ``rounds`` follow-ups (constant lengths:
    only the token-ID draws consume the RNG)."""
    rng = numpy_rng(seed)
    out = []
    for _ in range(rounds):
        ids = rng.integers(0, 128_000, size=n_in + n_out, dtype=np.int32)
        out.append((ids[:n_in], ids[n_in:]))
    return out


# ---------------------------------------------------------------------------- manager rules
def test_ignores_non_session_unknown_foreign_and_ended_sessions():
    m = SessionManager([_bp()])
    assert m.on_request_done(_done("x", ""), 5) == []
    assert m.on_request_done(_done("x", "sess_nope"), 5) == []
    assert m.on_request_done(_done("x_prefill", "sess_1"), 5) == []      # not the outstanding round
    assert m.counters.active == 1 and m.counters.followups == 0
    m.on_request_done(_done("r0_sess_1", "sess_1", TIMED_OUT), 5)
    assert m.on_request_done(_done("r0_sess_1", "sess_1"), 6) == []       # ended: nothing
    assert m.counters.cancelled_timeout == 1 and m.counters.completed == 0


@pytest.mark.parametrize("state, counter", [(TIMED_OUT, "cancelled_timeout"), (DROPPED, "cancelled_dropped"),
                                            (QUEUED, "cancelled_dropped"), ("timed_out", "cancelled_timeout"),
                                            ("dropped", "cancelled_dropped")])
def test_timeout_and_drop_cancel_the_session(state, counter):
    m = SessionManager([_bp()])
    assert m.on_request_done(_done("r0_sess_1", "sess_1", state), 77) == []
    s = m.sessions["sess_1"]
    assert (s.state, s.ended_us) == ("cancelled", 77)
    assert getattr(m.counters, counter) == 1 and m.counters.active == 0 and m.followups == []


def test_rounds_until_completed_with_exact_arrivals_ids_and_deadlines():
    m = SessionManager([_bp(rounds=3, think=250, timeout=None), _bp("sess_2", rounds=2, timeout=0)])
    f1 = m.on_request_done(_done("r0_sess_1", "sess_1"), 1000)
    assert [(r.id, r.arrival_us, r.round_index, r.deadline_us) for r in f1] == [
        ("session_sess_1_round_1_0", 1250, 1, 1250 + 300_000_000)]
    g1 = m.on_request_done(_done("r0_sess_2", "sess_2"), 1100)
    assert [(r.id, r.arrival_us, r.deadline_us) for r in g1] == [("session_sess_2_round_1_1", 1200, 0)]
    f2 = m.on_request_done(_done(f1[0].id, "sess_1"), 5000)
    assert [(r.id, r.arrival_us, r.round_index) for r in f2] == [("session_sess_1_round_2_2", 5250, 2)]
    assert m.on_request_done(_done(f2[0].id, "sess_1"), 9000) == []       # last round done
    assert m.on_request_done(_done(g1[0].id, "sess_2"), 9000) == []
    c = m.counters
    assert (c.completed, c.followups, c.active) == (2, 3, 0)
    r = f1[0]
    assert (r.client_id, r.tenant_id, r.slo_class, r.model, r.session_id) == ("c", "t", "batch", "m", "sess_1")
    assert r.max_output_len == r.output_len == 3
    assert [f.id for f in m.followups] == [f1[0].id, g1[0].id, f2[0].id]


def test_explicit_timeout_sets_the_deadline():
    m = SessionManager([_bp(timeout=5000)])
    (f,) = m.on_request_done(_done("r0_sess_1", "sess_1"), 10)
    assert f.deadline_us == 110 + 5000


def test_horizon_interruption_is_strictly_after_the_horizon():
    m = SessionManager([_bp(think=100, horizon=1100), _bp("sess_2", think=100, horizon=1100)])
    assert len(m.on_request_done(_done("r0_sess_1", "sess_1"), 1000)) == 1   # arrives at the horizon
    assert m.on_request_done(_done("r0_sess_2", "sess_2"), 1001) == []       # 1101 > horizon
    s = m.sessions["sess_2"]
    assert (s.state, s.reason) == ("horizon_interrupted", "next_round")
    assert m.counters.horizon_interrupted == 1


def test_length_capped_completion_counts_as_completed():
    m = SessionManager([_bp(rounds=1)])
    assert m.on_request_done(_done("r0_sess_1", "sess_1", pi=3), 10) == []     # capped early
    assert m.counters.completed == 1


def test_no_context_growth_input_is_prefix_plus_new_tokens():
    m = SessionManager([_bp(prefix=(900, 901), seed=4)])
    (f,) = m.on_request_done(_done("r0_sess_1", "sess_1"), 10)
    (new, out), = _followup_draws(4, 5, 3, 1)
    assert f.input_tokens.tolist() == [900, 901] + new.tolist()
    assert f.output_tokens.tolist() == out.tolist() and f.prefix_length == 2


def test_accumulate_duplicates_the_history_exactly():
    """BLIS's quirk (docs/workloads.md): context += the finished request's ENTIRE input + its generated
    outputs (first pi − input_len); the new input is prefix + context + new tokens."""
    P = [900, 901]
    m = SessionManager([_bp(rounds=4, prefix=P, accumulate=True, seed=9, n_in=5, n_out=3)])
    draws = _followup_draws(9, 5, 3, 3)
    in0, out0 = P + [1, 2, 3], [7, 8, 9]
    # round 0 generated only 2 of its 3 outputs (pi = input + 2): only those join the context
    (r1,) = m.on_request_done(_done("r0_sess_1", "sess_1", inp=in0, out=out0, pi=len(in0) + 2), 100)
    ctx1 = in0 + out0[:2]
    assert r1.input_tokens.tolist() == P + ctx1 + draws[0][0].tolist()
    # round 1 completes normally: pi = input + L − 1 (the last output token is not counted)
    in1, o1 = r1.input_tokens.tolist(), r1.output_tokens.tolist()
    (r2,) = m.on_request_done(_done(r1.id, "sess_1", inp=in1, out=o1), 200)
    ctx2 = ctx1 + in1 + o1[:2]
    assert r2.input_tokens.tolist() == P + ctx2 + draws[1][0].tolist()
    # exact lengths: the prefix now appears 1 (own) + 1 (in0) + 2 (in1 = P + ctx1 + new) times
    assert r2.input_len == 2 + (5 + 2) + (2 + 7 + 5 + 2) + 5 == 30
    assert r2.input_tokens.tolist().count(900) == 4
    assert r2.prefix_length == 2 and r2.round_index == 2


def test_rejection_cancels_without_followups():
    m = SessionManager([_bp()])
    m.on_request_rejected(_done("r0_sess_1", "sess_1", QUEUED), 3)
    assert m.counters.cancelled_rejected == 1 and m.sessions["sess_1"].reason == "rejected"
    assert m.on_request_done(_done("r0_sess_1", "sess_1"), 5) == []


def test_finalize_in_flight_at_horizon_and_drained_violation():
    m = SessionManager([_bp(), _bp("sess_2")])
    m.on_request_done(_done("r0_sess_2", "sess_2", TIMED_OUT), 3)
    c = m.finalize(stopped_at_horizon=True, end_us=50)
    assert (c.in_flight_at_horizon, c.cancelled_timeout, c.active, c.ended()) == (1, 1, 0, 2)
    assert m.sessions["sess_1"].reason == "in_flight"
    with pytest.raises(InvariantError, match="never ended"):
        SessionManager([_bp()]).finalize(stopped_at_horizon=False)


# ---------------------------------------------------------------------------- blueprints
def _mt_spec(*, rounds=3, think=50_000, accumulate=True, num=30, rate=20.0, seed=5, timeout=None,
             closed=None, clients=None, **kw):
    c = {"id": "chat", "tenant_id": "t1", "slo_class": "standard", "rate_fraction": 1.0,
         "arrival": {"process": "poisson"},
         "input_distribution": {"type": "gaussian", "params": {"mean": 40, "std_dev": 10, "min": 10, "max": 80}},
         "output_distribution": {"type": "exponential", "params": {"mean": 12}},
         "prefix_group": "sys", "prefix_length": 16,
         "reasoning": {"multi_turn": {"max_rounds": rounds, "think_time_us": think,
                                      "context_growth": "accumulate" if accumulate else ""}}}
    if timeout is not None:
        c["timeout"] = timeout
    if closed is not None:
        c["closed_loop"] = closed
    return WorkloadSpecV2.model_validate({"version": "2", "seed": seed, "aggregate_rate": rate,
                                          "num_requests": num, "clients": clients or [c], **kw})


def test_closed_loop_keeps_round_zero_and_builds_blueprints_in_order():
    other = {"id": "b", "tenant_id": "t2", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
             "input_distribution": CONST(8), "output_distribution": CONST(4),
             "reasoning": {"multi_turn": {"max_rounds": 2}}}
    std = {"id": "s", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
           "input_distribution": CONST(8), "output_distribution": CONST(4)}
    first = _mt_spec().clients[0].model_dump(exclude_none=True)
    wl = generate_workload(_mt_spec(clients=[first, other, std], num=60))
    reqs = wl.requests
    assert [r.id for r in reqs] == [f"request_{i}" for i in range(len(reqs))]
    assert all(r.round_index == 0 for r in reqs if r.session_id)
    assert {r.client_id for r in reqs} == {"chat", "b", "s"}
    sess = [(r.client_id, r.session_id) for r in reqs if r.session_id]
    want = sorted(sess, key=lambda x: (x[0] != "chat", x[1]))   # client order, sorted IDs
    assert [(b.client_id, b.session_id) for b in wl.blueprints] == want
    by_sid = {r.session_id: r.id for r in reqs if r.session_id}
    assert all(b.current_id == by_sid[b.session_id] for b in wl.blueprints)
    bp_stream = numpy_rng(5 + 7919)                  # the blueprint stream: seed + 7919
    for b in wl.blueprints:
        want_rng = numpy_rng(child_seed(bp_stream))
        assert b.rng.integers(0, 1 << 62) == want_rng.integers(0, 1 << 62)
    chat = next(b for b in wl.blueprints if b.client_id == "chat")
    assert (chat.max_rounds, chat.think_time_us, chat.accumulate, len(chat.prefix)) == (3, 50_000, True, 16)
    assert chat.timeout_us is None and chat.horizon_us == wl.horizon_us


def test_open_loop_multi_turn_pre_generates_every_round():
    wl = generate_workload(_mt_spec(closed=False, num=0, rounds=4, think=300_000),
                           horizon=2_000_000)
    assert wl.blueprints == [] and wl.session_manager() is None
    by = {}
    for r in wl.requests:
        by.setdefault(r.session_id, []).append(r)
    assert len(by) > 10
    for rounds in by.values():
        rounds.sort(key=lambda r: r.round_index)
        assert [r.round_index for r in rounds] == list(range(len(rounds)))
        ctx = []
        for a, b in zip(rounds, rounds[1:], strict=False):
            # t_{r+1} = t_r + think + output_len (1 µs per output token)
            assert b.arrival_us == a.arrival_us + 300_000 + a.output_len
        for r in rounds:
            toks = r.input_tokens.tolist()
            assert toks[16:16 + len(ctx)] == ctx         # accumulate without duplication
            ctx += toks[16 + len(ctx):] + r.output_tokens.tolist()
            assert r.deadline_us == r.arrival_us + 300_000_000   # session default
    assert all(r.arrival_us < 2_000_000 for r in wl.requests)
    assert any(len(v) < 4 for v in by.values())      # rounds at/after the horizon discarded


def test_single_session_and_lifecycle_windows():
    c = {"id": "one", "rate_fraction": 1.0, "arrival": {"process": "constant"},
         "input_distribution": CONST(5), "output_distribution": CONST(10),
         "lifecycle": {"windows": [{"start_us": 1_000_000, "end_us": 1_500_000}]},
         "reasoning": {"reason_ratio_distribution": CONST(150),
                       "multi_turn": {"max_rounds": 6, "think_time_us": 200_000, "single_session": True}},
         "closed_loop": False}
    wl = generate_workload(WorkloadSpecV2.model_validate(
        {"version": "2", "aggregate_rate": 4.0, "num_requests": 100, "clients": [c]}))
    # one session at window0.start + IAT (250 ms); rounds every 200 ms + 10 µs; only those
    # inside [1.0 s, 1.5 s) are kept
    assert [(r.arrival_us, r.round_index) for r in wl.requests] == [(1_250_000, 0), (1_450_010, 1)]
    assert len({r.session_id for r in wl.requests}) == 1
    assert all(r.reason_ratio == 1.0 for r in wl.requests)       # clamp(150/100, 0, 1)


# ---------------------------------------------------------------------------- whole runs
def _scenario(*, impl="fast", max_model_len=0, admission="always-admit", kv=4000, alpha2=0.0):
    return Scenario.model_validate({
        "seed": 42, "model": "m",
        "latency": {"model": "blackbox", "alpha_coeffs": [500.0, 0.0, alpha2],
                    "beta_coeffs": [3000.0, 5.0, 50.0]},
        "engine": {"total_kv_blocks": kv, "max_model_len": max_model_len, "implementation": impl},
        "cluster": {"num_instances": 2, "admission": {"policy": admission}}})


def _run(spec, scenario=None, horizon=None):
    wl = generate_workload(spec, horizon=horizon)
    mgr = wl.session_manager()
    ticks: dict[str, int] = {}
    orig = mgr.on_request_done

    def spy(req, tick):
        ticks[req.id] = tick
        return orig(req, tick)

    mgr.on_request_done = spy
    res = Simulation(scenario or _scenario(), wl.requests, horizon_us=wl.horizon_us,
                     sessions=mgr).run()
    return wl, mgr, res, ticks


def _prev_id(mgr, wl, f):
    s = mgr.sessions[f.session_id]
    chain = [b for b in [next(r for r in wl.requests if r.session_id == s.session_id)] + mgr.followups
             if b.session_id == s.session_id]
    return next(r.id for r in chain if r.round_index == f.round_index - 1)


def test_inv10_followups_arrive_exactly_think_time_after_completion():
    wl, mgr, res, ticks = _run(_mt_spec(rounds=4, num=40))
    c = res.sessions
    assert c.followups == len(mgr.followups) > 20 and c.completed == c.sessions
    completion = {}
    for m in res.instances:
        completion.update(m.completion_time)
    for f in mgr.followups:
        prev = _prev_id(mgr, wl, f)
        assert f.arrival_us == ticks[prev] + 50_000            # the engine's callback tick
        assert f.arrival_us == completion[prev] + 50_000       # = arrival + E2E (no overheads)
    done = sum(m.completed_requests for m in res.instances)
    assert done == len(wl.requests) + len(mgr.followups)


def test_inv10_equality_with_zero_think_time_and_overheads():
    """With an output-token overhead, arrival + E2E lies after the callback tick; the
    follow-up still arrives exactly at the tick (+ think time = 0)."""
    wl, mgr, res, ticks = _run(_mt_spec(rounds=3, num=20, think=0), _scenario(alpha2=700.0))
    completion = {}
    for m in res.instances:
        completion.update(m.completion_time)
    assert mgr.followups
    for f in mgr.followups:
        prev = _prev_id(mgr, wl, f)
        assert f.arrival_us == ticks[prev] <= completion[prev]


def test_accumulate_runs_identically_on_both_engines_and_deterministically():
    def sig(impl):
        _, mgr, res, _ = _run(_mt_spec(rounds=4, num=30), _scenario(impl=impl))
        return [(f.id, f.arrival_us, f.input_len, f.output_len) for f in mgr.followups], res.sessions

    fast, fast2, ref = sig("fast"), sig("fast"), sig("reference")
    assert fast == fast2 == ref
    lens = {}
    for fid, _, n_in, _ in fast[0]:
        lens.setdefault(fid.split("_round_")[0], []).append(n_in)
    # D9: in(r+1) = 2·in(r) − new(r) + generated(r) + new(r+1) ≥ 2·in(r) − 80 + 10
    assert all(b >= 2 * a - 70 for v in lens.values() for a, b in zip(v, v[1:], strict=False))
    assert max(max(v) for v in lens.values()) > 500


def test_inv11_with_drops_timeouts_and_horizon():
    """Accumulate grows the context until MaxModelLen drops the round (cancelled, dropped);
    a tight timeout cancels others; the horizon interrupts the rest."""
    c1 = _mt_spec(rounds=8, think=10_000).clients[0].model_dump(exclude_none=True)
    c2 = dict(c1, id="impatient", timeout=4_000, prefix_group="")
    c3 = dict(c1, id="slow", reasoning={"multi_turn": {"max_rounds": 5, "think_time_us": 900_000}},
              prefix_group="")
    spec = _mt_spec(clients=[c1, c2, c3], num=90, rate=30.0)
    wl, mgr, res, _ = _run(spec, _scenario(max_model_len=1500), horizon=3_000_000)
    c = res.sessions
    assert c.cancelled_dropped > 0 and c.cancelled_timeout > 0
    assert c.horizon_interrupted + c.in_flight_at_horizon > 0
    assert c.active == 0 and c.ended() == c.sessions == len(wl.blueprints)
    states = [s.state for s in mgr.sessions.values()]
    assert states.count("completed") == c.completed
    assert states.count("cancelled") == c.cancelled
    assert states.count("horizon_interrupted") == c.horizon_interrupted + c.in_flight_at_horizon
    for s in mgr.sessions.values():
        if s.reason == "timeout":
            assert s.client_id == "impatient"
        if s.reason == "dropped":
            assert s.client_id == "chat"
    m = res.instances
    assert sum(x.dropped_unservable for x in m) == c.cancelled_dropped
    assert sum(x.timed_out_requests for x in m) == c.cancelled_timeout


def test_rejected_sessions_are_cancelled_and_the_run_drains():
    wl, mgr, res, _ = _run(_mt_spec(num=10), _scenario(admission="reject-all"))
    c = res.sessions
    assert c.cancelled_rejected == c.sessions == len(wl.requests) > 0 and c.followups == 0
    assert res.counters.rejected_by_admission == len(wl.requests)
