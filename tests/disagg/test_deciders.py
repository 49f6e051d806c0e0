"""Disaggregation deciders (docs/disaggregation.md) and the decider registry."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from blis_simpy.disagg.deciders import (
    GLOBAL_KEY,
    Always,
    DirectToDecode,
    DisaggregationDecider,
    Never,
    PrefixThreshold,
    make_decider,
)
from blis_simpy.errors import ConfigError
from blis_simpy.request import Request

BS = 16


def req(rid, tokens, outputs=(7, 7, 7), max_output_len=None):
    return Request(rid, 0, list(tokens), list(outputs), max_output_len=max_output_len)


class InputOnly:
    """A request view exposing only what a decider may read (INV-9): touching the output
    tokens or the true output length fails the test."""

    ALLOWED = {"id", "input_len", "input_tokens", "max_output_len", "prompt_block_hashes"}

    def __init__(self, r):
        self._r = r

    def __getattr__(self, name):
        if name not in self.ALLOWED:
            raise AssertionError(f"decider read request.{name}")
        return getattr(self._r, name)


# --------------------------------------------------------------------------- registry
def test_builtin_names_and_alias():
    assert {"never", "always", "prefix-threshold", "direct-to-decode"} <= set(DisaggregationDecider.names())
    assert DisaggregationDecider.lookup("") is Never
    assert isinstance(make_decider("", block_size=BS), Never)


def test_make_decider_validates():
    d = make_decider("prefix-threshold", {"threshold": 150}, block_size=32)
    assert isinstance(d, PrefixThreshold) and d.params.threshold == 150 and d.block_size == 32
    assert make_decider("prefix-threshold").params.threshold == 512
    assert make_decider("direct-to-decode").params.threshold == 256
    with pytest.raises(ConfigError, match="unknown disaggregation decider"):
        make_decider("sometimes")
    with pytest.raises(ConfigError):
        make_decider("prefix-threshold", {"threshold": -1})
    with pytest.raises(ConfigError):
        make_decider("direct-to-decode", {"treshold": 5})
    with pytest.raises(ConfigError):
        make_decider("never", {"threshold": 5})


def test_stateful_and_constant_flags():
    assert PrefixThreshold.stateful
    assert not Never.stateful and not Always.stateful and not DirectToDecode.stateful
    assert Always.constant_decision is True and Never.constant_decision is False
    assert PrefixThreshold.constant_decision is None and DirectToDecode.constant_decision is None


def test_zero_threshold_warnings():
    assert make_decider("direct-to-decode", {"threshold": 0}).config_warnings()
    assert make_decider("prefix-threshold", {"threshold": 0}).config_warnings()
    assert make_decider("direct-to-decode").config_warnings() == []
    assert make_decider("always").config_warnings() == []


# --------------------------------------------------------------------------- never / always
def test_never_and_always():
    for r in (req("a", []), req("b", range(40))):
        assert Never().decide(r) is False
        assert Always().decide(r) is True          # empty prompts included


# --------------------------------------------------------------------------- prefix-threshold
def test_prefix_threshold_spec_example():
    """Threshold 150, two prompts sharing a 192-token (12-block) prefix."""
    prefix = list(range(192))
    r1 = req("request_0", prefix + [1000 + i for i in range(58)])
    r2 = req("request_1", prefix + [2000 + i for i in range(58)])
    d = PrefixThreshold(PrefixThreshold.Params(threshold=150), block_size=BS)
    assert d.decide(r1) is True                     # nothing cached: 250 > 150
    assert d.decide(r2) is True                     # still nothing observed
    d.observe(r1, 0)
    assert d.index.size(GLOBAL_KEY) == 250 // BS   # its 15 full blocks
    assert d.decide(r2) is False                    # 250 − 12×16 = 58 ≤ 150


def test_prefix_threshold_is_strict():
    d = PrefixThreshold(PrefixThreshold.Params(threshold=150), block_size=BS)
    assert d.decide(req("a", range(150))) is False
    assert d.decide(req("b", range(151))) is True


def test_prefix_threshold_partial_block_is_never_cached():
    d = PrefixThreshold(PrefixThreshold.Params(threshold=10), block_size=BS)
    d.observe(req("a", range(40)), 1)                    # 2 full blocks + 8 tokens
    assert d.index.size(GLOBAL_KEY) == 2
    assert d.decide(req("b", range(40))) is False       # 40 − 32 = 8 ≤ 10
    assert d.decide(req("c", range(43))) is True        # 43 − 32 = 11 > 10


def test_prefix_threshold_counts_leading_matches_only():
    d = PrefixThreshold(PrefixThreshold.Params(threshold=20), block_size=BS)
    d.observe(req("a", range(64)), 0)                    # blocks 0..3
    assert d.decide(req("b", range(64))) is False       # fully cached: 0 ≤ 20
    assert d.decide(req("c", range(75))) is False       # 75 − 64 = 11
    assert d.decide(req("d", range(85))) is True        # 85 − 64 = 21 > 20
    changed_first = [999] + list(range(1, 64))
    assert d.decide(req("e", changed_first)) is True    # chain broken at block 0: 64 > 20


def test_prefix_threshold_empty_prompt():
    d = PrefixThreshold(PrefixThreshold.Params(threshold=0), block_size=BS)
    e = req("e", [])
    assert d.decide(e) is False
    d.observe(e, 0)
    assert d.index.size(GLOBAL_KEY) == 0
    assert d.decide(req("x", [1])) is True              # threshold 0: any uncached token


def test_prefix_threshold_reuses_hashes_of_the_decided_request():
    calls = []

    class Spy(Request):
        __slots__ = ()

        def prompt_block_hashes(self, bs):
            calls.append(self.id)
            return super().prompt_block_hashes(bs)

    d = PrefixThreshold(block_size=BS)
    a = Spy("a", 0, list(range(48)), [1])
    d.decide(a)
    d.observe(a, 0)                               # same ID: hashes from decide
    assert calls == ["a"]
    sub = Spy("a_prefill", 0, list(range(48)), [])
    d.observe(sub, 1)                             # another ID: recomputed
    assert calls == ["a", "a_prefill"]
    assert d.index.size(GLOBAL_KEY) == 3


def test_prefix_threshold_lru_capacity():
    d = make_decider("prefix-threshold", {"threshold": 0, "lru_capacity": 2}, block_size=BS)
    d.observe(req("a", range(64)), 0)                    # 4 blocks, only the last 2 kept
    assert d.index.size(GLOBAL_KEY) == 2
    assert d.decide(req("b", range(16))) is True        # block 0 evicted
    assert PrefixThreshold(block_size=BS).index.capacity == 10_000


# --------------------------------------------------------------------------- direct-to-decode
@pytest.mark.parametrize(("threshold", "length", "expected"), [
    (256, 255, False), (256, 256, True), (256, 257, True),    # ≥, not >
    (0, 0, False), (0, 1, True), (1, 1, True), (1, 0, False),
])
def test_direct_to_decode_boundaries(threshold, length, expected):
    d = DirectToDecode(DirectToDecode.Params(threshold=threshold), block_size=BS)
    assert d.decide(req("r", range(length))) is expected


# --------------------------------------------------------------------------- INV-9
@pytest.mark.parametrize("name", ["never", "always", "prefix-threshold", "direct-to-decode"])
def test_deciders_never_read_outputs(name):
    d = make_decider(name, block_size=BS)
    for n in (0, 5, 300, 600):
        r = InputOnly(req(f"r{n}", range(n), outputs=range(50)))
        d.decide(r)
        if d.stateful:
            d.observe(r, 0)


# --------------------------------------------------------------------------- custom deciders
class LongOutputBudget(DisaggregationDecider, name="test-long-output-budget"):
    """Disaggregate requests whose client budget is large (reads max_output_len only)."""

    class Params(BaseModel):
        min_budget: int = Field(100, ge=0)

    def decide(self, req):
        return req.max_output_len >= self.params.min_budget


class Counting(DisaggregationDecider, name="test-counting"):
    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        self.seen = []

    def decide(self, req):
        return len(self.seen) % 2 == 1

    def observe(self, req, instance):
        self.seen.append((req.id, instance))


def test_custom_decider_by_subclassing():
    assert DisaggregationDecider.lookup("test-long-output-budget") is LongOutputBudget
    d = make_decider("test-long-output-budget", {"min_budget": 64}, block_size=BS)
    assert d.decide(InputOnly(req("a", range(3), max_output_len=64))) is True
    assert d.decide(InputOnly(req("b", range(3), max_output_len=63))) is False
    assert not LongOutputBudget.stateful


def test_custom_decider_with_observe_is_stateful():
    assert Counting.stateful
    d = make_decider("test-counting", block_size=BS)
    assert d.decide(req("a", [1])) is False
    d.observe(req("a", [1]), 3)
    assert d.decide(req("b", [1])) is True and d.seen == [("a", 3)]


def test_duplicate_name_rejected():
    with pytest.raises(ValueError, match="already registered"):
        class Dup(DisaggregationDecider, name="always"):
            def decide(self, req):
                return True
