"""The routing-policy family and its simplest member (spec/05 §4).

A router is a plain synchronous decider: given the request and a read-only
:class:`~blis_simpy.cluster.snapshot.RouterState`, it returns a :class:`RoutingDecision`.
Add one by subclassing::

    class LeastKV(Router, name="least-kv"):
        def route(self, req, state):
            best = min(state.snapshots, key=lambda s: (s.kv_utilization, s.index))
            return RoutingDecision(best.index, "least kv")
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blis_simpy.cluster.snapshot import RouterState
from blis_simpy.plugins import Pluggable


@dataclass(slots=True)
class RoutingDecision:
    """The chosen instance (its index in the cluster) and why."""

    target: int
    reason: str = ""
    scores: dict[str, float] | None = field(default=None)
    priority: float = 0.0


class Router(Pluggable, family="routing policy"):
    """Chooses an instance among ``state.snapshots`` (never empty when called)."""

    def __init__(self, params=None, *, rng=None):
        self.params = params
        self.rng = rng

    def route(self, req, state: RouterState) -> RoutingDecision:
        raise NotImplementedError

    def observe(self, req, target: int) -> None:
        """Called after a decision made through this policy object placed ``req``."""


class RoundRobin(Router, name="round-robin", aliases=("",)):
    """``snapshots[counter mod n]``; one counter per policy object."""

    def __init__(self, params=None, *, rng=None):
        super().__init__(params, rng=rng)
        self.counter = 0

    def route(self, req, state: RouterState) -> RoutingDecision:
        snaps = state.snapshots
        s = snaps[self.counter % len(snaps)]
        self.counter += 1
        return RoutingDecision(s.index, f"round-robin[{s.index}]")
