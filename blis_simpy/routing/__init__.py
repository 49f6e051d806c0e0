"""Routing policies: pick the instance for an admitted request (docs/control-plane.md,
"Routing").

Importing the package registers every built-in policy and scorer.
"""

from blis_simpy.routing.base import RoundRobin, Router, RoutingDecision, break_tie
from blis_simpy.routing.policies import AlwaysBusiest, LeastLoaded, Weighted
from blis_simpy.routing.prefix_index import PrefixIndex
from blis_simpy.routing.scorers import (
    KVUtilization,
    LoadAware,
    LoadBalance,
    PrecisePrefixCache,
    PrefixAffinity,
    QueueDepth,
    Scorer,
    ScorerSpec,
    parse_scorers,
)

__all__ = [
    "AlwaysBusiest", "KVUtilization", "LeastLoaded", "LoadAware", "LoadBalance",
    "PrecisePrefixCache", "PrefixAffinity",
    "PrefixIndex", "QueueDepth", "RoundRobin", "Router", "RoutingDecision", "Scorer",
    "ScorerSpec", "Weighted", "break_tie", "parse_scorers",
]
