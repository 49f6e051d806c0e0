"""Scorers for the weighted router (docs/control-plane.md, "Weighted scoring") — a registry
family of their own.

A scorer rates every candidate instance for one request, in snapshot order, with values in
[0, 1] (higher = better; the router clamps anything outside). A *stateful* scorer also
learns from the router's decisions through :meth:`Scorer.observe`. Add one by subclassing::

    class ShortQueue(Scorer, name="short-queue"):
        class Params(BaseModel):
            scale: float = 10.0
        def score(self, req, snapshots):
            return [1.0 / (1.0 + s.queue_depth / self.params.scale) for s in snapshots]

and name it in ``--routing-scorers "short-queue:1,queue-depth:2"`` or in a scenario's
``cluster.routing.params.scorers``.

Scorer configurations are lists of :class:`ScorerSpec` ``(name, weight, params)``; the
``"name:weight,…"`` text form of BLIS's flag is read by :func:`parse_scorers`.
"""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from blis_simpy.plugins import Pluggable, validate_params
from blis_simpy.routing.prefix_index import DEFAULT_CAPACITY, PrefixIndex
from blis_simpy.snapshot import InstanceSnapshot, RouterState, leading_run


class Scorer(Pluggable, family="routing scorer"):
    """Rates instances for a request. Instances are created per routing-policy object."""

    #: True if :meth:`observe` must be called after every decision of the owning policy.
    stateful: ClassVar[bool] = False
    #: True if :meth:`see` must be called with the decision's :class:`RouterState` (its clock
    #: and the instances' read-only views) before every :meth:`score`.
    sees_state: ClassVar[bool] = False

    def __init__(self, params=None, *, block_size: int = 16, **_ignored):
        self.params = params if params is not None else type(self).Params()
        self.block_size = block_size

    def score(self, req, snapshots: tuple[InstanceSnapshot, ...]) -> list[float]:
        """One score per snapshot, in order."""
        raise NotImplementedError

    def observe(self, req, chosen: InstanceSnapshot) -> None:
        """The owning policy placed ``req`` on ``chosen`` (only called if ``stateful``)."""

    def see(self, state: RouterState) -> None:
        """The decision about to be scored (only called if ``sees_state``): ``state.clock_us``
        and ``state.views`` (an :class:`~blis_simpy.snapshot.InstanceView` per instance index)."""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "observe" in cls.__dict__ and "stateful" not in cls.__dict__:
            cls.stateful = True
        if "see" in cls.__dict__ and "sees_state" not in cls.__dict__:
            cls.sees_state = True


class QueueDepth(Scorer, name="queue-depth"):
    """Min-max normalised effective load: ``(max − load)/(max − min)``; all equal ⇒ 1."""

    def score(self, req, snapshots):
        loads = [s.queue_depth + s.batch_size + s.in_flight_requests for s in snapshots]
        lo = min(loads)
        hi = max(loads)
        if hi == lo:
            return [1.0] * len(loads)
        span = float(hi - lo)
        return [float(hi - x) / span for x in loads]


class KVUtilization(Scorer, name="kv-utilization"):
    """``1 − kv_utilization``: llm-d's ``kv-cache-utilization-scorer`` (docs/control-plane.md)."""

    def score(self, req, snapshots):
        return [1.0 - s.kv_utilization for s in snapshots]


class LoadBalance(Scorer, name="load-balance"):
    """``1 / (1 + effective_load)``."""

    def score(self, req, snapshots):
        return [1.0 / (1.0 + float(s.queue_depth + s.batch_size + s.in_flight_requests))
                for s in snapshots]


class PrefixAffinity(Scorer, name="prefix-affinity"):
    """Fraction of the prompt's full blocks already placed on the instance (docs/control-plane.md).

    ``matched / total`` over the chained block hashes, looked up in this scorer's own
    router-side :class:`PrefixIndex`; 0 for a prompt shorter than one block. After each
    decision the request's hashes are recorded for the chosen instance.
    """

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        lru_capacity: int = Field(DEFAULT_CAPACITY, gt=0, description="block hashes kept per instance")

    stateful = True

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        self.index = PrefixIndex(self.params.lru_capacity)

    def score(self, req, snapshots):
        hashes = req.prompt_block_hashes(self.block_size)
        total = len(hashes)
        if total == 0:
            return [0.0] * len(snapshots)
        ft = float(total)
        match = self.index.match
        return [float(match(hashes, s.id)) / ft for s in snapshots]

    def observe(self, req, chosen):
        self.index.record(req.prompt_block_hashes(self.block_size), chosen.id)


def _views_of(scorer: Scorer, state: RouterState | None) -> tuple:
    if state is None or state.views is None:
        raise ValueError(f"scorer {scorer.name!r} needs the instances' views (RouterState.views); "
                         "it routes only inside a cluster")
    return state.views


class LoadAware(Scorer, name="load-aware"):
    """Prompt tokens waiting plus running on the instance, lower is better (docs/control-plane.md).

    ``x_j`` = :meth:`~blis_simpy.snapshot.InstanceView.waiting_tokens` +
    :meth:`~blis_simpy.snapshot.InstanceView.running_tokens`. With ``threshold_tokens`` 0 (the
    default) the score is llm-d's pending-tokens form ``1 − x_j / max_k x_k`` (1 for every
    instance when all are 0); with ``threshold_tokens = T > 0`` llm-d's ``load-aware-scorer``
    form ``0.5 · (1 − min(x_j, T) / T)``.
    """

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        threshold_tokens: int = Field(0, ge=0, description="0: relative to the busiest instance")

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        self._state: RouterState | None = None

    def see(self, state):
        self._state = state

    def score(self, req, snapshots):
        views = _views_of(self, self._state)
        loads = [views[s.index].waiting_tokens() + views[s.index].running_tokens()
                 for s in snapshots]
        t = self.params.threshold_tokens
        if t > 0:
            return [0.5 * (1.0 - min(x, t) / t) for x in loads]
        hi = max(loads)
        if hi == 0:
            return [1.0] * len(loads)
        return [1.0 - x / hi for x in loads]


class PrecisePrefixCache(Scorer, name="precise-prefix-cache"):
    """The longest prefix of the prompt's full blocks the instance's KV cache really holds
    (docs/control-plane.md), normalised as llm-d's ``precise-prefix-cache-scorer``.

    ``m_j`` = leading prompt blocks held by instance j's GPU KV cache
    (:meth:`~blis_simpy.snapshot.InstanceView.cached_prefix_blocks`). Instances with
    ``m_j = 0`` score 0; the others ``(m_j − min) / (max − min)`` over those with a hit, 1
    when they are all equal. With ``delay_us = D > 0`` the scorer sees each instance's cache
    as it was at its last refresh: the held hashes are copied when ``D`` µs have passed since
    the last copy (the first copy is due at ``D``; before it the scorer sees empty caches),
    as a router fed by KV events that arrive in batches.
    """

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        delay_us: int = Field(0, ge=0, description="signal delay: the cache as at the last refresh, "
                                                    "refreshed every delay_us µs (0: live)")

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        self._state: RouterState | None = None
        self._seen: dict[int, frozenset] = {}     # instance index -> hashes at the last refresh
        self._last: dict[int, int] = {}           # instance index -> time of that refresh (µs)

    def see(self, state):
        self._state = state

    def score(self, req, snapshots):
        state = self._state
        views = _views_of(self, state)
        hashes = req.prompt_block_hashes(self.block_size)
        delay = self.params.delay_us
        if delay == 0:
            m = [views[s.index].cached_prefix_blocks(hashes) for s in snapshots]
        else:
            m = [self._delayed_match(views[s.index], hashes, state.clock_us) for s in snapshots]
        hits = [x for x in m if x > 0]
        if not hits:
            return [0.0] * len(m)
        lo, hi = min(hits), max(hits)
        if hi == lo:
            return [1.0 if x > 0 else 0.0 for x in m]
        span = float(hi - lo)
        return [(x - lo) / span if x > 0 else 0.0 for x in m]

    def _delayed_match(self, view, hashes, now_us: int) -> int:
        k = view.index
        if now_us - self._last.get(k, 0) >= self.params.delay_us:
            self._seen[k] = view.cached_block_hashes()
            self._last[k] = now_us
        return leading_run(hashes, self._seen.get(k, frozenset()))


# ---------------------------------------------------------------------------- configuration
class ScorerSpec(BaseModel):
    """One weighted scorer of a weighted router."""

    model_config = ConfigDict(extra="forbid")
    name: str
    weight: float = Field(gt=0, allow_inf_nan=False)
    params: dict = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _scorer_params(cls, v: dict, info: ValidationInfo) -> dict:
        # checked where the scenario is validated, not first when the router is built
        scorer = Scorer._registry.get(info.data.get("name"))
        if scorer is not None:
            validate_params(scorer.Params, v)   # an error is located at scorers[i].params.KEY
        return v


#: llm-d parity default (docs/control-plane.md, "Weighted scoring").
DEFAULT_SCORERS = (("prefix-affinity", 3.0), ("queue-depth", 2.0), ("kv-utilization", 2.0))


def default_scorers() -> list[ScorerSpec]:
    return [ScorerSpec(name=n, weight=w) for n, w in DEFAULT_SCORERS]


def parse_scorers(text: str) -> list[dict]:
    """BLIS's ``"name:weight,name:weight"`` (whitespace trimmed) → ``[{name, weight}]``.

    Raises ``ValueError`` naming the bad item. Names are checked against the registry,
    duplicates and non-positive or non-finite weights are errors.
    """
    out: list[dict] = []
    seen: set[str] = set()
    for item in text.split(","):
        item = item.strip()
        name, sep, w = item.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"invalid scorer {item!r}: expected name:weight")
        try:
            weight = float(w.strip())
        except ValueError:
            raise ValueError(f"invalid weight {w.strip()!r} for scorer {name!r}") from None
        check_scorer(name, weight, seen)
        out.append({"name": name, "weight": weight})
    return out


def check_scorer(name: str, weight: float, seen: set[str]) -> None:
    """The scorer-list rules (docs/control-plane.md, "Weighted scoring") for one item;
    ``seen`` collects names for duplicates."""
    if name not in Scorer._registry:
        raise ValueError(f"unknown scorer {name!r}; valid: {', '.join(Scorer.names())}")
    if name in seen:
        raise ValueError(f"duplicate scorer {name!r}")
    if not math.isfinite(weight) or weight <= 0:
        raise ValueError(f"scorer {name!r} weight must be finite and > 0, got {weight:g}")
    seen.add(name)
