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

from blis_simpy.plugins import Pluggable, call_failure, is_number, plugin_error, shown
from blis_simpy.request_view import RequestView


class PriorityPolicy(Pluggable, family="priority policy"):
    """Computes a request's priority (higher = more urgent) at time ``now_us``.

    A subclass that defines :meth:`priority` without saying ``constant`` in its own body is
    not constant, whatever its parent says: subclassing ``ConstantPriority`` (``constant =
    True``) and overriding ``priority`` gets that method called at every step.
    """

    #: True if the priority never changes (the engine then skips recomputing it).
    constant: ClassVar[bool] = False

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "priority" in cls.__dict__ and "constant" not in cls.__dict__:
            cls.constant = False

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
    """Reorders the wait queue in place: the same requests, each once, in any order. A
    plugin that adds, drops or repeats a request stops the run with its error (exit 2,
    :func:`checked_reorder`)."""

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


# ------------------------------------------------------------------ plugins, checked
def checked_priorities(policy: PriorityPolicy, queue: deque, now_us: int) -> None:
    """Set ``req.priority`` of every queued request from a plugin ``policy``, which reads
    each through its :class:`~blis_simpy.request_view.RequestView`; an exception or a
    value that is not a real number (or is NaN) is that policy's one-line error."""
    field = "engine.priority_policy"
    for r in queue:
        try:
            p = policy.priority(RequestView(r), now_us)
        except Exception as exc:
            raise call_failure(policy, "priority", exc, field=field) from None
        if not is_number(p):
            raise plugin_error(policy, f"returned {shown(p)} from priority() for "
                               f"{r.id}; expected a number", field=field)
        r.priority = p


def checked_reorder(scheduler: Scheduler, queue: deque, now_us: int) -> None:
    """Let a plugin ``scheduler`` reorder a deque of the queued requests'
    :class:`~blis_simpy.request_view.RequestView` objects, check it holds the same requests,
    each once (O(n), as the sort itself), and put ``queue`` in its order; anything else is
    that scheduler's one-line error. Built-in schedulers reorder ``queue`` itself, unchecked."""
    field = "engine.scheduler"
    views = deque(RequestView(r) for r in queue)
    of_view = dict(zip(views, queue, strict=True))    # views hash as their request
    try:
        res = scheduler.reorder(views, now_us)
    except Exception as exc:
        raise call_failure(scheduler, "reorder", exc, field=field) from None
    if res is not None:     # sorted(queue) returned, the queue left as it was: a silent no-op
        raise plugin_error(scheduler, f"returned {shown(res)} from reorder(); a scheduler "
                           "reorders the queue it is handed in place and returns None",
                           field=field)
    order = []
    seen = set()
    what = None
    for v in views:
        r = of_view.get(v) if type(v) is RequestView else None
        if r is None or id(r) in seen:
            what = (f"it holds {v.id!r} twice" if r is not None
                    else f"it added {getattr(v, 'id', v)!r}, which was not queued")
            break
        seen.add(id(r))
        order.append(r)
    if what is None and len(order) == len(queue):
        queue.clear()
        queue.extend(order)
        return
    raise plugin_error(scheduler, f"changed the wait queue in reorder(): {len(queue)} requests "
                       f"before, {len(views)} after, {what or 'it lost a queued request'}; a "
                       "scheduler may only reorder the queue", field=field)
