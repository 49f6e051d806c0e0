"""Disaggregation deciders: should this admitted request be split into prefill + decode?
(docs/disaggregation.md).

A decider is a plain synchronous policy called at the ``DisaggregationDecision`` event. It
may read only the prompt (tokens, length) and ``max_output_len`` — never the pre-sampled
output (INV-9). Add one by subclassing, like a router::

    class LongPrompt(DisaggregationDecider, name="long-prompt"):
        class Params(BaseModel):
            min_tokens: int = Field(1024, ge=0)
        def decide(self, req):
            return req.input_len >= self.params.min_tokens

and select it with ``--pd-decider long-prompt`` or a scenario's
``disaggregation.decider: {policy: long-prompt, params: {min_tokens: 2048}}``.

A *stateful* decider learns from placements: the cluster calls
``observe(req, instance_index)`` after every routing decision that places a request
(standard and prefill routing, not decode routing). Defining ``observe`` in a subclass makes
it stateful automatically (``stateful`` class attribute).

Constructor keywords every decider receives (accept them if you override ``__init__``):
``block_size`` — tokens per KV block (the global block size).
"""

from __future__ import annotations

import sys
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.plugins import Pluggable, build_failure, checked_results
from blis_simpy.request_view import hand_views
from blis_simpy.routing.prefix_index import DEFAULT_CAPACITY, PrefixIndex

#: The single virtual instance key of the prefix-threshold decider's index.
GLOBAL_KEY = "__global__"


class DisaggregationDecider(Pluggable, family="disaggregation decider"):
    """Decides, per admitted request, whether to disaggregate it (True) or serve it locally."""

    #: True if :meth:`observe` must be called after every placing routing decision.
    stateful: ClassVar[bool] = False
    #: The decision when it never depends on the request (True: ``always``, False:
    #: ``never``), else None. The CLI uses it for its warnings (docs/cli.md).
    constant_decision: ClassVar[bool | None] = None

    def __init__(self, params=None, *, block_size: int = 16, **_ignored):
        if int(block_size) <= 0:
            raise ValueError(f"block size must be > 0, got {block_size}")
        self.params = params if params is not None else type(self).Params()
        self.block_size = int(block_size)

    def decide(self, req) -> bool:
        """True to disaggregate ``req``. Reads only its input and ``max_output_len`` (INV-9)."""
        raise NotImplementedError

    def observe(self, req, instance: int) -> None:
        """``req`` was placed on instance ``instance`` (only called if ``stateful``)."""

    def config_warnings(self) -> list[str]:
        """Notes on a legal but probably unintended configuration (the CLI prints them)."""
        return []

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "observe" in cls.__dict__ and "stateful" not in cls.__dict__:
            cls.stateful = True


def make_decider(name: str, params: dict | None = None, *, block_size: int = 16,
                 field: str | None = None) -> DisaggregationDecider:
    """Look up a decider by name, validate its params and build it (``ConfigError`` on a
    bad name or params). A plugin decider whose constructor raises, or whose ``decide``
    returns anything but a bool, is that plugin's one-line error on ``field.policy``;
    built-in ones are not wrapped."""
    cls = DisaggregationDecider.lookup(name, field=field)
    p = cls.parse_params(params, field=f"{field}.params" if field else None)
    if cls._blis_builtin:
        return cls(p, block_size=block_size)
    key = f"{field}.policy" if field else None
    try:
        decider = cls(p, block_size=block_size)
    except Exception as exc:
        raise build_failure(cls, exc, field=key) from None
    decider = checked_results(decider, {"decide": _a_bool}, field=key)
    return hand_views(decider, ("decide", "observe"))


def _a_bool(value) -> bool:
    """A decider's decision as a bool; a ValueError saying what was expected otherwise."""
    if isinstance(value, bool):
        return value
    np = sys.modules.get("numpy")   # a NumPy bool is taken; numpy is not imported here (CLI help)
    if np is not None and isinstance(value, np.bool_):
        return bool(value)
    raise ValueError("True (disaggregate) or False")


class _Threshold(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Never(DisaggregationDecider, name="never", aliases=("",)):
    """Never disaggregate (the default)."""

    constant_decision = False

    def decide(self, req) -> bool:
        return False


class Always(DisaggregationDecider, name="always"):
    """Disaggregate every request, empty prompts included."""

    constant_decision = True

    def decide(self, req) -> bool:
        return True


class PrefixThreshold(DisaggregationDecider, name="prefix-threshold"):
    """Disaggregate iff the prompt's tokens not already cached anywhere exceed ``threshold``.

    "Cached" is judged by the decider's own prefix index of chained block hashes under one
    virtual key ``"__global__"`` (cluster-wide knowledge, LRU ``lru_capacity`` blocks), fed
    by :meth:`observe`: ``non_cached = len(input) − leading_matched_blocks × block_size``;
    disaggregate iff ``non_cached > threshold`` (strict). Empty prompts never disaggregate
    and are never recorded.
    """

    class Params(_Threshold):
        threshold: int = Field(512, ge=0, description="non-cached prompt tokens above which to "
                                                      "disaggregate (--pd-prefix-threshold)")
        lru_capacity: int = Field(DEFAULT_CAPACITY, gt=0, description="block hashes remembered")

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        self.index = PrefixIndex(self.params.lru_capacity)
        self._hashes_id: str | None = None
        self._hashes: list | None = None

    def _hashes_of(self, req) -> list:
        if self._hashes_id == req.id and self._hashes is not None:
            return self._hashes
        hashes = req.prompt_block_hashes(self.block_size)
        self._hashes_id = req.id
        self._hashes = hashes
        return hashes

    def decide(self, req) -> bool:
        n = req.input_len
        if n == 0:
            return False
        cached = self.index.match(self._hashes_of(req), GLOBAL_KEY)
        return n - cached * self.block_size > self.params.threshold

    def observe(self, req, instance: int) -> None:
        # The prefill sub-request has another ID, so its hashes are recomputed (same tokens,
        # same hashes); a locally routed request reuses the ones from decide.
        if req.input_len == 0:
            return
        self.index.record(self._hashes_of(req), GLOBAL_KEY)

    def config_warnings(self) -> list[str]:
        if self.params.threshold == 0:
            return ["prefix-threshold 0: every request with a non-cached token is disaggregated"]
        return []


class DirectToDecode(DisaggregationDecider, name="direct-to-decode"):
    """Disaggregate iff ``len(input) >= threshold`` (note ≥); short prompts go straight to
    the decode pool. Empty prompts never disaggregate."""

    class Params(_Threshold):
        threshold: int = Field(256, ge=0, description="prompt length from which to disaggregate "
                                                      "(--pd-direct-decode-threshold)")

    def decide(self, req) -> bool:
        n = req.input_len
        return n > 0 and n >= self.params.threshold

    def config_warnings(self) -> list[str]:
        if self.params.threshold == 0:
            return ["direct-to-decode threshold 0: every non-empty request is disaggregated"]
        return []


__all__ = ["Always", "DirectToDecode", "DisaggregationDecider", "GLOBAL_KEY", "Never",
           "PrefixThreshold", "make_decider"]
