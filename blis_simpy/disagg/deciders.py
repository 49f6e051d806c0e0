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

A *load-aware* decider reads the pools: when its ``decide`` takes a second parameter named
``pools``, the cluster passes a :class:`PoolView` — the same read-only
:class:`~blis_simpy.snapshot.RouterState` per pool that the pool's router gets (queue depth,
batch size, KV use, in-flight count per instance), built only when read::

    class ShortQueue(DisaggregationDecider, name="short-queue"):
        def decide(self, req, pools):
            return sum(s.queue_depth for s in pools.prefill.snapshots) < 4

The built-in ``load-aware`` decider is such a subclass.

A *stateful* decider learns from placements: the cluster calls
``observe(req, instance_index)`` after every routing decision that places a request
(standard and prefill routing, not decode routing). Defining ``observe`` in a subclass makes
it stateful automatically (``stateful`` class attribute).

Constructor keywords every decider receives (accept them if you override ``__init__``):
``block_size`` — tokens per KV block (the global block size).
"""

from __future__ import annotations

import inspect
import sys
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.plugins import Pluggable, build_failure, checked_results
from blis_simpy.request_view import hand_views
from blis_simpy.routing.prefix_index import DEFAULT_CAPACITY, PrefixIndex
from blis_simpy.snapshot import RouterState

#: The single virtual instance key of the prefix-threshold decider's index.
GLOBAL_KEY = "__global__"


class PoolView:
    """What a load-aware decider sees of the pools at a decision: ``prefill`` and
    ``decode``, each the :class:`~blis_simpy.snapshot.RouterState` that pool's router would
    get for the request now (its instances' snapshots, index order, and ``clock_us``).

    Read-only, and built on first read: a decider that looks at one pool costs the run only
    that pool's snapshots (and, under a periodic snapshot refresh, only a read refreshes
    them, as a router's would). ``clock_us`` is the decision time, µs.
    """

    __slots__ = ("clock_us", "_state_of", "_pools", "_states")

    def __init__(self, clock_us: int, state_of, prefill_pool, decode_pool):
        self.clock_us = clock_us
        self._state_of = state_of          # instances -> RouterState
        self._pools = (prefill_pool, decode_pool)
        self._states: list[RouterState | None] = [None, None]

    def _state(self, i: int) -> RouterState:
        st = self._states[i]
        if st is None:
            st = self._states[i] = self._state_of(self._pools[i])
        return st

    @property
    def prefill(self) -> RouterState:
        """The prefill pool as its router sees it."""
        return self._state(0)

    @property
    def decode(self) -> RouterState:
        """The decode pool as its router sees it."""
        return self._state(1)


class DisaggregationDecider(Pluggable, family="disaggregation decider"):
    """Decides, per admitted request, whether to disaggregate it (True) or serve it locally."""

    #: True if :meth:`observe` must be called after every placing routing decision.
    stateful: ClassVar[bool] = False
    #: True if :meth:`decide` takes the pools (``decide(req, pools)``, a :class:`PoolView`);
    #: set from its signature when a subclass defines ``decide``.
    reads_pools: ClassVar[bool] = False
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
        if "decide" in cls.__dict__ and "reads_pools" not in cls.__dict__:
            cls.reads_pools = "pools" in inspect.signature(cls.decide).parameters


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


class LoadAware(DisaggregationDecider, name="load-aware"):
    """Disaggregate iff the prompt is longer than ``max_local_prefill_tokens`` (strict) and
    the prefill pool's queue — the queue depths of its instances, summed — is shorter than
    ``max_prefill_queue`` (strict); otherwise serve the request locally, on the decode pool.

    NVIDIA Dynamo's conditional disaggregation (``ai-dynamo/dynamo``,
    ``examples/llm/components/disagg_router.py``, ``prefill_remote``): prefill remotely iff
    the prefill length exceeds ``max_local_prefill_length`` and the prefill queue holds fewer
    than ``max_prefill_queue_size`` requests (its defaults, 1000 and 2, are ours). Dynamo
    subtracts the prefix-cache hit from the length; this decider does not.
    """

    class Params(_Threshold):
        max_local_prefill_tokens: int = Field(1000, ge=0, description="prompt tokens above which "
                                              "to disaggregate")
        max_prefill_queue: int = Field(2, ge=0, description="disaggregate only while the prefill "
                                       "pool queues fewer requests than this")

    def decide(self, req, pools: PoolView) -> bool:
        if req.input_len <= self.params.max_local_prefill_tokens:
            return False
        queued = sum(s.queue_depth for s in pools.prefill.snapshots)
        return queued < self.params.max_prefill_queue


__all__ = ["Always", "DirectToDecode", "DisaggregationDecider", "GLOBAL_KEY", "LoadAware", "Never",
           "PoolView", "PrefixThreshold", "make_decider"]
