"""The latency-model interface (docs/latency-models.md) and the batch summary it reads."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from blis_simpy.plugins import Pluggable
from blis_simpy.units import to_int64

if TYPE_CHECKING:
    from blis_simpy.latency.frontend import FrontendParams


@dataclass(slots=True)
class BatchView:
    """What a latency model may know about one step's running batch.

    A request is *prefill-phase* if ``pi < prefill_to`` (its prompt length, or — while a
    preempted request recomputes its prompt and outputs — that recompute's end; requests
    without ``prefill_to`` use ``input_len``; its step tokens are
    ``num_new_tokens``); *decode-phase* if ``pi >= input_len`` and it has at least one
    output token (step tokens 0 or 1). Values are as at step start, before execution.

    * ``prefill``: the prefill-phase requests (read ``pi``, ``num_new_tokens``, ``input_len``)
    * ``decode_count``: number of decode-phase requests
    * ``decode_tokens``: sum of their ``num_new_tokens``
    * ``decode_pi_sum``: sum of their ``pi`` (context length already in the KV cache)
    * ``size``: number of requests in the batch
    * :meth:`entries`: every prefill- or decode-phase request in batch order as
      ``(is_prefill, pi, num_new_tokens, input_len)`` — for models whose floating-point sums
      must follow BLIS's per-request order. It costs O(batch); the aggregates above are O(1).
    """

    prefill: list = field(default_factory=list)
    decode_count: int = 0
    decode_tokens: int = 0
    decode_pi_sum: int = 0
    size: int = 0
    entries_fn: Callable[[], Iterator[tuple[bool, int, int, int]]] | None = None

    def entries(self) -> Iterator[tuple[bool, int, int, int]]:
        """``(is_prefill, pi, num_new_tokens, input_len)`` per request, in batch order."""
        if self.entries_fn is None:
            return iter(())
        return self.entries_fn()

    @property
    def prefill_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.prefill)

    @classmethod
    def dummy(cls) -> BatchView:
        """The 1-token dummy decode an idle data-parallel rank runs in a lockstep step
        (vLLM pads idle DP ranks of an MoE model with a dummy batch): one decode request at
        context 0."""
        v = cls(decode_count=1, decode_tokens=1, decode_pi_sum=0, size=1)
        v.entries_fn = lambda: iter(((False, 0, 1, 0),))
        return v

    @classmethod
    def of(cls, batch) -> BatchView:
        """Classify an iterable of requests (the literal, per-request way)."""
        v = cls()
        v.entries_fn = lambda: _entries(batch)
        for r in batch:
            v.size += 1
            if r.pi < _prefill_end(r):
                v.prefill.append(r)
            elif r.output_len >= 1:
                v.decode_count += 1
                v.decode_tokens += r.num_new_tokens
                v.decode_pi_sum += r.pi
        return v


def _prefill_end(r) -> int:
    return getattr(r, "prefill_to", r.input_len)


def _entries(batch) -> Iterator[tuple[bool, int, int, int]]:
    for r in batch:
        if r.pi < _prefill_end(r):
            yield True, r.pi, r.num_new_tokens, r.input_len
        elif r.output_len >= 1:
            yield False, r.pi, r.num_new_tokens, r.input_len


class LatencyModel(Pluggable, family="latency model"):
    """Times engine steps. All results are integer µs.

    Subclasses implement :meth:`step_time_us`; the overhead terms default to zero.

    A plugin model registers a name (``class Mine(LatencyModel, name="mine")``), may declare
    a pydantic ``Params`` (its own keys, from the scenario's ``latency.params``) and is built
    by :meth:`build` — by default ``cls(params, model_config=..., gpu=..., tp=...)``; this
    base constructor keeps them as ``self.params``, ``self.model_config``, ``self.gpu`` and
    ``self.tp``. The built-in backends have constructors of their own (deploy/backends.py).
    """

    #: True when the model needs the HF model architecture (analytical backends); a plugin
    #: that sets it also needs a GPU (``hardware``) and ``tp`` > 0, as those backends do.
    needs_model_config: ClassVar[bool] = False

    def __init__(self, params=None, *, model_config=None, gpu=None, tp: int = 1, **_ignored):
        self.params = params if params is not None else type(self).Params()
        self.model_config = model_config
        self.gpu = gpu
        self.tp = tp

    @classmethod
    def build(cls, params, *, model_config=None, gpu=None, tp: int = 1) -> LatencyModel:
        """A plugin model for one instance: ``params`` (validated :attr:`Params`), the model
        architecture (a :class:`~blis_simpy.catalog.types.ModelConfig`; None unless
        :attr:`needs_model_config` or a config was resolved), the GPU
        (:class:`~blis_simpy.catalog.types.GPUSpec`, None when no known ``hardware`` is given)
        and tensor parallelism (≥ 1). Called once per instance (and once to validate)."""
        return cls(params, model_config=model_config, gpu=gpu, tp=tp)

    def step_time_us(self, batch: BatchView) -> int:
        """Duration of one engine step, ≥ 1 µs."""
        raise NotImplementedError

    def decode_step_fn(self, size: int, count: int) -> Callable[[int], int] | None:
        """The step time of a *pure-decode* step as a function of the context only, or None.

        For a batch of ``size`` requests of which ``count`` decode one token each and none
        prefills, a function ``f(decode_pi_sum)`` returning exactly :meth:`step_time_us` of
        that batch's view (µs). The fast engine uses it for runs of such steps of the built-in
        models only, used unwrapped (docs/performance.md, "Step coalescing"): a plugin model's
        override is not called, its :meth:`step_time_us` is, every step. A model whose step time of such a batch depends on anything else
        (the per-request :meth:`BatchView.entries`, state) returns None, the default, and is
        then called every step."""
        return None

    def lockstep_step_time_us(self, views: list[BatchView]) -> int:
        """Duration (µs) of one lockstep step of the data-parallel ranks of one engine.

        ``views[r]`` is rank r's batch; an idle rank has ``size == 0`` and runs the dummy
        batch (:meth:`BatchView.dummy`). Every rank waits for the slowest, so the default is
        the maximum of the per-rank step times. Models with cross-rank terms (MoE expert
        reads of the tokens gathered from every rank, EP dispatch/combine) override it.
        """
        dummy = None
        worst = 1
        for v in views:
            if v.size == 0:
                if dummy is None:
                    dummy = BatchView.dummy()
                v = dummy
            t = self.step_time_us(v)
            if t > worst:
                worst = t
        return worst

    def queueing_time_us(self, req) -> int:
        """Arrival → Queued delay (API / pre-scheduling overhead), µs."""
        return 0

    def output_token_time_us(self) -> int:
        """Per-token post-processing (OTPT): added to TTFT once and to every ITL entry, µs."""
        return 0

    def post_decode_us(self) -> int:
        """Added once to the E2E of a request with at least one output token, µs."""
        return 0

    def frontend_params(self) -> FrontendParams | None:
        """The costs of the API server in front of an instance this model times
        (:class:`~blis_simpy.latency.frontend.FrontendParams`, µs), or None: no front end,
        the default. A scenario's ``frontend:`` section, when given, replaces them
        (docs/frontend.md). The three overheads above are BLIS's closed-form stand-ins for
        the same work; a model that supplies front-end costs should not also charge them."""
        return None


class ConstantOverheads:
    """The three request-level overheads as BLIS HEAD's trained backends take them from
    ``alpha``: α0 = arrival → queue delay, α1 = post-decode overhead, α2 = per-output-token
    overhead (µs each, truncated). A mixin placed before :class:`LatencyModel`."""

    def set_overheads(self, alpha) -> None:
        self._queue = to_int64(alpha[0])
        self._post = to_int64(alpha[1])
        self._otpt = to_int64(alpha[2])

    def queueing_time_us(self, req) -> int:
        return self._queue

    def output_token_time_us(self) -> int:
        return self._otpt

    def post_decode_us(self) -> int:
        return self._post


def check_coeffs(name: str, values, minimum: int) -> list[float]:
    """Validate a coefficient vector: at least ``minimum`` entries, each finite and ≥ 0."""
    vals = [float(v) for v in values]
    if len(vals) < minimum:
        raise ValueError(f"{name} needs at least {minimum} coefficients, got {len(vals)}")
    for i, v in enumerate(vals):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name}[{i}] must be finite and >= 0, got {v}")
    return vals


__all__ = ["BatchView", "ConstantOverheads", "LatencyModel", "check_coeffs", "to_int64"]
