"""Routing policies: pick the instance for an admitted request (spec/05 §4)."""

from blis_simpy.routing.base import RoundRobin, Router, RoutingDecision

__all__ = ["Router", "RoutingDecision", "RoundRobin"]
