"""No workload-spec sample is above the 2^24 token cap (docs/workloads.md, "Length
distributions"): the parameters are refused above it (tests/config/test_validate_agrees.py),
and what an unbounded distribution, a multimodal sum or an accumulating session could still
produce is stopped at it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from blis_simpy.config.scenario import MAX_TOKENS as SCENARIO_MAX_TOKENS
from blis_simpy.request import COMPLETED
from blis_simpy.rng import numpy_rng
from blis_simpy.workload import WorkloadSpecV2, generate_workload
from blis_simpy.workload.lengths import MAX_TOKENS, empirical_sampler, make_length_sampler
from blis_simpy.workload.samplers import MultimodalSampler, RequestSampler
from blis_simpy.workload.sessions import SessionBlueprint, SessionManager
from blis_simpy.workload.spec import MultimodalSpec
from blis_simpy.workload.tracev2_read import MAX_TRACE_TOKENS

CONST = lambda v: {"type": "constant", "params": {"value": v}}  # noqa: E731


class Expo:
    """An RNG whose exponential draws are the given values."""

    def __init__(self, *values):
        self.values = list(values)

    def standard_exponential(self):
        return self.values.pop(0)


def test_one_cap_for_scenarios_traces_and_specs():
    assert MAX_TOKENS == SCENARIO_MAX_TOKENS == MAX_TRACE_TOKENS == 2**24


def test_unbounded_samplers_clip_at_the_cap():
    s = make_length_sampler("exponential", {"mean": MAX_TOKENS})        # the largest mean allowed
    assert s.sample(Expo(0.5)) == MAX_TOKENS // 2
    assert s.sample(Expo(30.0)) == MAX_TOKENS                           # 30 x 2^24: clipped
    p = make_length_sampler("pareto_lognormal", {"alpha": 0.01, "xm": MAX_TOKENS, "mu": 0,
                                                 "sigma": 1, "mix_weight": 1})
    rng = np.random.default_rng(1)
    assert max(p.sample(rng) for _ in range(200)) == MAX_TOKENS
    assert make_length_sampler("constant", {"value": MAX_TOKENS}).sample(rng) == MAX_TOKENS
    assert empirical_sampler({str(MAX_TOKENS): 1.0}).sample(rng) == MAX_TOKENS


def test_a_multimodal_request_stops_at_the_cap():
    """text 2^24 - 10, then 1000 images of 4 tokens: the images stop at 10 tokens (3 items,
    the third cut), no audio fits; the request has exactly 2^24 input tokens."""
    mm = MultimodalSpec.model_validate({
        "text_distribution": CONST(MAX_TOKENS - 10),
        "image_distribution": CONST(4), "image_count_distribution": CONST(1000),
        "audio_distribution": CONST(7), "audio_count_distribution": CONST(2)})
    assert MultimodalSampler(mm, "m").sample(np.random.default_rng(0)) == (MAX_TOKENS - 10, 10, 0, 0)
    small = MultimodalSpec.model_validate({
        "text_distribution": CONST(5), "image_distribution": CONST(4),
        "image_count_distribution": CONST(3)})
    assert MultimodalSampler(small, "m").sample(np.random.default_rng(0)) == (5, 12, 0, 0)   # unchanged


def test_an_accumulating_session_ends_before_its_prompt_passes_the_cap():
    """8,000,000 new tokens and 1 output token a round: round 1 holds 16,000,001 tokens
    (<= 2^24 = 16,777,216), round 2 would hold 24,000,002: the session ends after round 1."""
    spec = WorkloadSpecV2.model_validate({
        "version": "2", "aggregate_rate": 1.0, "num_requests": 10, "clients": [{
            "id": "c", "rate_fraction": 1.0, "arrival": {"process": "constant"},
            "input_distribution": CONST(8_000_000), "output_distribution": CONST(1),
            "reasoning": {"multi_turn": {"max_rounds": 5, "context_growth": "accumulate",
                                         "single_session": True}}, "closed_loop": False}]})
    reqs = generate_workload(spec).requests
    assert [len(r.input_tokens) for r in reqs] == [8_000_000, 16_000_001]
    assert [r.round_index for r in reqs] == [0, 1]


def _closed_loop(n_in: int) -> tuple[SessionManager, SessionBlueprint]:
    c = SimpleNamespace(input_distribution=SimpleNamespace(type="constant", params={"value": n_in}),
                        output_distribution=SimpleNamespace(type="constant", params={"value": 3}),
                        multimodal=None, reasoning=None)
    bp = SessionBlueprint(session_id="s", sampler=RequestSampler(c), rng=numpy_rng(1), max_rounds=5,
                          think_time_us=10, horizon_us=10**9, timeout_us=None, accumulate=True,
                          prefix=np.zeros(0, dtype=np.int32), client_id="c", tenant_id="t",
                          slo_class="", model="m", prefix_group="", current_id="r0")
    return SessionManager([bp]), bp


def _done(n_in: int) -> SimpleNamespace:
    """A finished round with ``n_in`` input tokens (a zero-copy view) and no output generated."""
    inp = np.broadcast_to(np.int32(0), (n_in,))
    return SimpleNamespace(id="r0", session_id="s", state=COMPLETED, input_tokens=inp,
                           output_tokens=np.zeros(3, dtype=np.int32), pi=n_in)


def test_a_closed_loop_round_past_the_cap_is_not_sent():
    """Context (the finished input) + 5 new tokens: at 2^24 the round is sent, one past it
    the session ends cancelled (dropped) and nothing is submitted."""
    mgr, _ = _closed_loop(5)
    (nxt,) = mgr.on_request_done(_done(MAX_TOKENS - 5), 100)
    assert len(nxt.input_tokens) == MAX_TOKENS and nxt.round_index == 1
    mgr, bp = _closed_loop(5)
    assert mgr.on_request_done(_done(MAX_TOKENS - 4), 100) == []
    assert mgr.counters.cancelled_dropped == 1 and mgr.counters.active == 0 and bp.state == "cancelled"
