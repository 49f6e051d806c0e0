"""The routing-policy family and its simplest member (docs/control-plane.md, "Routing").

A router is a plain synchronous decider: given the request and a read-only
:class:`~blis_simpy.snapshot.RouterState`, it returns a :class:`RoutingDecision`.
Add one by subclassing (see docs/extending.md)::

    class LeastKV(Router, name="least-kv"):
        def route(self, req, state):
            best = min(state.snapshots, key=lambda s: (s.kv_utilization, s.index))
            return RoutingDecision(best.index, "least kv")

Constructor keywords every router receives (accept them if you override ``__init__``):

* ``rng`` — the policy's own :class:`numpy.random.Generator` (RNG stream ``router``;
  ``prefill-router`` / ``decode-router`` for per-pool policies), or ``None``;
* ``block_size`` — tokens per KV block, for policies that hash prompts.

Ties among equally good instances: :func:`break_tie` picks uniformly at random with the
policy's RNG (``tie_break="random"``, the default) or the lowest position in the snapshot
list (``"first"``, BLIS's behaviour when it has no RNG; the conformance cases use it).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from blis_simpy.plugins import Pluggable, is_number, shown
from blis_simpy.snapshot import RouterState

TieBreak = Literal["random", "first"]


@dataclass(slots=True)
class RoutingDecision:
    """The chosen instance (its index in the cluster), why, and optional scores.

    ``scores`` maps instance ID to the policy's score (higher = better); the decision trace
    uses it for counterfactual regret (docs/metrics.md). ``None`` means the policy has no scores
    (the trace then ranks instances by ``−effective_load``).
    """

    target: int
    reason: str = ""
    scores: dict[str, float] | None = field(default=None)
    priority: float = 0.0


class TieBreakParams(BaseModel):
    """Parameters of a router whose only option is how ties are broken."""

    model_config = ConfigDict(extra="forbid")
    tie_break: TieBreak = "random"


def break_tie(tied: list[int], tie_break: str, rng) -> int:
    """One element of ``tied`` (positions in snapshot order, ascending, non-empty).

    ``"first"`` (or no RNG) → ``tied[0]``; ``"random"`` → a uniform draw from ``rng``, made
    only when there is more than one candidate.
    """
    if len(tied) == 1 or tie_break == "first" or rng is None:
        return tied[0]
    return tied[int(rng.integers(0, len(tied)))]


class Router(Pluggable, family="routing policy"):
    """Chooses an instance among ``state.snapshots`` (never empty when called).

    ``route`` must return a :class:`RoutingDecision` whose ``target`` is the ``index`` of
    one of the snapshots; anything else stops the run with this router's error (exit 2,
    :func:`decision_problem`).
    """

    #: the scenario block that configured this router (``policy`` and ``params`` under it);
    #: set by :func:`~blis_simpy.cluster.policies.build_router`, it locates the router's errors
    config_field: str = "cluster.routing"

    def __init__(self, params=None, *, rng=None, block_size: int = 16, **_ignored):
        self.params = params if params is not None else type(self).Params()
        self.rng = rng
        self.block_size = block_size

    def route(self, req, state: RouterState) -> RoutingDecision:
        raise NotImplementedError

    def observe(self, req, target: int) -> None:
        """Called after the cluster placed ``req`` on instance ``target`` (its index)."""


class RoundRobin(Router, name="round-robin", aliases=("",)):
    """``snapshots[counter mod n]``; one counter per policy object."""

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        self.counter = 0

    def route(self, req, state: RouterState) -> RoutingDecision:
        snaps = state.snapshots
        s = snaps[self.counter % len(snaps)]
        self.counter += 1
        return RoutingDecision(s.index, f"round-robin[{s.index}]")


def as_index(target) -> int | None:
    """``target`` as an instance index: an ``int`` for any integer type (numpy's too), else
    None (a bool, a float, a string, None)."""
    if isinstance(target, bool):
        return None
    try:
        return operator.index(target)
    except TypeError:
        return None


def decision_problem(decision, state: RouterState) -> str | None:
    """What is wrong with a router's ``decision`` for ``state`` (the problem, after the
    router's name, of its one-line error), or None when it names one of the candidates."""
    if not hasattr(decision, "target"):
        return f"returned {shown(decision)} from route(); expected a RoutingDecision"
    target = decision.target
    index = as_index(target)
    candidates = [s.index for s in state.snapshots]
    if index is None:
        return (f"returned target {shown(target)} from route(); expected the index (an int) "
                f"of one of the candidate instances {candidates}")
    if index not in candidates:
        return (f"returned instance index {index} from route(), not one of the candidate "
                f"instances {candidates}")
    prio = getattr(decision, "priority", 0.0)
    if not is_number(prio):
        return f"returned priority {shown(prio)} from route(); expected a number"
    scores = getattr(decision, "scores", None)
    if scores is None:
        return None
    if not isinstance(scores, Mapping):
        return (f"returned scores {shown(scores)} from route(); expected None or "
                "{instance_id: number}")
    ids = {s.id for s in state.snapshots}
    for key, v in scores.items():
        if key not in ids:
            return (f"returned a score for {key!r} from route(), not one of the candidate "
                    f"instances {sorted(ids)}")
        if not is_number(v):
            return f"returned score {shown(v)} for {key} from route(); expected a number"
    return None
