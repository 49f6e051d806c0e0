"""Wait-queue order: priority policies and schedulers (docs/engine.md, "Wait-queue order").

At the start of every step the engine sets ``req.priority = policy.priority(req, now)`` for
every queued request, then asks the scheduler to reorder the queue in place. Every built-in
scheduler is a *stable* sort; IDs compare as plain strings.

Both are plain synchronous deciders; add one by subclassing::

    class Oldest(PriorityPolicy, name="oldest"):
        def priority(self, req, now_us):
            return float(now_us - req.arrival_us)
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from blis_simpy.plugins import Pluggable


class PriorityPolicy(Pluggable, family="priority policy"):
    """Computes a request's priority (higher = more urgent) at time ``now_us``."""

    #: True if the priority never changes (the engine then skips recomputing it).
    constant: ClassVar[bool] = False

    def __init__(self, params=None):
        self.params = params

    def priority(self, req, now_us: int) -> float:
        raise NotImplementedError


class ConstantPriority(PriorityPolicy, name="constant", aliases=("",)):
    """Every request has priority 0."""

    constant = True

    def priority(self, req, now_us: int) -> float:
        return 0.0


class SLOBasedPriority(PriorityPolicy, name="slo-based"):
    """Age in seconds: ``1e-6·(now − arrival)`` (BLIS does not read the SLO class)."""

    def priority(self, req, now_us: int) -> float:
        return 0 + 1e-6 * (now_us - req.arrival_us)


class InvertedSLOPriority(PriorityPolicy, name="inverted-slo"):
    """Negative age in seconds (youngest first under priority-fcfs)."""

    def priority(self, req, now_us: int) -> float:
        return 0 - 1e-6 * (now_us - req.arrival_us)


class Scheduler(Pluggable, family="scheduler"):
    """Reorders the wait queue in place; must not change its length."""

    #: True if the scheduler never changes the queue order.
    keeps_order: ClassVar[bool] = False

    def __init__(self, params=None):
        self.params = params

    def reorder(self, queue: deque, now_us: int) -> None:
        raise NotImplementedError


def stable_sort(queue: deque, key) -> None:
    """Sort a deque in place (stable), as Go's ``sort.SliceStable``."""
    items = sorted(queue, key=key)
    queue.clear()
    queue.extend(items)


class FCFS(Scheduler, name="fcfs", aliases=("",)):
    """Arrival order, preempted requests at the front."""

    keeps_order = True

    def reorder(self, queue: deque, now_us: int) -> None:
        return None


class PriorityFCFS(Scheduler, name="priority-fcfs"):
    """Priority descending, then arrival time, then ID."""

    def reorder(self, queue: deque, now_us: int) -> None:
        stable_sort(queue, lambda r: (-r.priority, r.arrival_us, r.id))


class SJF(Scheduler, name="sjf"):
    """Shortest prompt first, then arrival time, then ID."""

    def reorder(self, queue: deque, now_us: int) -> None:
        stable_sort(queue, lambda r: (r.input_len, r.arrival_us, r.id))


class ReversePriority(Scheduler, name="reverse-priority"):
    """Priority ascending (a pathological policy for tests), then arrival time, then ID."""

    def reorder(self, queue: deque, now_us: int) -> None:
        stable_sort(queue, lambda r: (r.priority, r.arrival_us, r.id))
