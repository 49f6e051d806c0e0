"""The discrete-event core: a SimPy environment whose event order reproduces BLIS exactly.

BLIS keeps one event heap for the cluster and one per instance, each ordered by
``(time, priority, seq)``; cluster events win ties with instance events, and among
instances the lowest index wins, one event at a time (docs/architecture.md, "Time and
event order"). All of that is one total order, so a single SimPy heap can hold it: SimPy
orders its queue by ``(time, priority, insertion id)`` and accepts any integer as the
priority. We encode

* cluster event of BLIS priority ``p``  → key ``CLUSTER_BASE + 2p`` (``+1`` for session
  follow-up arrivals, which BLIS pushes after every pre-generated arrival);
* event of BLIS priority ``p`` on instance ``k`` → key ``INSTANCE_BASE + 8k + p``;
* an event of an instance's front end (ours, docs/frontend.md) → key ``FRONTEND``, between
  the two blocks (same-time front-end events keep the order they were scheduled in).

SimPy's own URGENT/NORMAL (0/1) events (process start-up, interrupts, the acknowledgements
of resource requests) sort before all of these; they never change simulation state. The
clock is an integer number of microseconds.

**The one place that touches SimPy's private event fields.** SimPy's public way to fire an
event, :meth:`simpy.events.Event.succeed`, always schedules it *now* at priority NORMAL,
and :class:`simpy.events.Timeout` always uses NORMAL too. BLIS's deterministic order needs
events at an explicit time *and* key, so this module triggers events itself, exactly as
SimPy's own ``Timeout`` and ``Environment.run`` do internally: set ``_ok``/``_value``, then
:meth:`~simpy.core.Environment.schedule` (public) with the key as the priority. That
happens in :class:`Call`, :class:`Wake`, :func:`succeed_at` and :func:`process_now` only (and the clock itself
moves outside :meth:`~simpy.core.Environment.step` only in :meth:`SimEnv.advance_to`); every other module
goes through :meth:`SimEnv.call_at`, :meth:`SimEnv.wake_at`, :func:`succeed_at` and
:class:`Mailbox` (a :class:`simpy.Store`), and never writes an event's private fields.
"""

from __future__ import annotations

from collections import deque

import simpy
from simpy.events import Event
from simpy.resources.store import StoreGet, StorePut

CLUSTER_BASE = 2
CLUSTER_ARRIVAL = CLUSTER_BASE + 0
FOLLOWUP_ARRIVAL = CLUSTER_BASE + 1
ADMISSION = CLUSTER_BASE + 2
#: the gateway queue's dispatcher (ours; docs/control-plane.md, "Gateway queue"): after the
#: admissions of a µs, before its routing decisions
GATEWAY = CLUSTER_BASE + 3
ROUTING = CLUSTER_BASE + 4
DISAGGREGATION = CLUSTER_BASE + 6
PREFILL_ROUTING = CLUSTER_BASE + 8
KV_TRANSFER_STARTED = CLUSTER_BASE + 10
KV_TRANSFER_COMPLETED = CLUSTER_BASE + 12
DECODE_ROUTING = CLUSTER_BASE + 14

INSTANCE_BASE = 32
INSTANCE_STRIDE = 8
ARRIVAL, QUEUED, STEP, SCHEDULED, REQUEST_LEFT, TIMEOUT = range(6)
#: every instance's API server (docs/frontend.md; BLIS has none): after every cluster event
#: and before every instance event at the same time, so a request handed to an engine at
#: ``t`` is in its wait queue when a step begins at ``t``
FRONTEND = INSTANCE_BASE - 1


#: the autoscaler's decisions and its instances becoming ready
#: (:mod:`blis_simpy.cluster.autoscaler`): before every cluster and instance event at the same
#: time, so an instance ready at ``t`` takes a request arriving at ``t``, and a decision at ``t``
#: sees the state every event before ``t`` left. SimPy's NORMAL, which no model event uses.
AUTOSCALE = 1

#: an observer's sample (:mod:`blis_simpy.cluster.monitor`): before every model event at the
#: same time (model keys are >= 2)
OBSERVER_BEFORE = 0
#: an observer's last look at a time: after every model event at that time
OBSERVER_AFTER = 1 << 62

#: The events a user may hook, by BLIS's name (grep for the name to find its code): the
#: heap key it runs at (instance events: the priority ``p`` of :func:`instance_key`) and
#: where a plugin hooks it (docs/extending.md). The PD ones run in the process named.
EVENTS: dict[str, tuple[int, str]] = {
    "ClusterArrival": (CLUSTER_ARRIVAL, "the arrival process (Cluster._arrivals)"),
    "AdmissionDecision": (ADMISSION, "AdmissionPolicy.admit(req, state)"),
    "GatewayDispatch": (GATEWAY, "GatewayPolicy.has_room(state, pending), GatewayPolicy.pick(heads) "
                        "in the gateway's dispatcher process (Gateway._dispatcher)"),
    "RoutingDecision": (ROUTING, "Router.route(req, state), Router.observe(req, index)"),
    "DisaggregationDecision": (DISAGGREGATION, "DisaggregationDecider.decide(req[, pools]) "
                               "in the decision process (PDCluster._decisions)"),
    "PrefillRoutingDecision": (PREFILL_ROUTING, "the prefill pool's Router.route, in the "
                               "prefill-pool process (PDCluster._prefill_pool)"),
    "KVTransferStarted": (KV_TRANSFER_STARTED, "KVTransferFabric.start(parent, nbytes), "
                          "called by the fabric process; KVTransferFabric.transfer is the transfer process"),
    "KVTransferCompleted": (KV_TRANSFER_COMPLETED, "the end of KVTransferFabric.transfer, "
                            "which hands the transfer on: the fabric's on_complete(transfer), "
                            "by default a put into the decode pool's inbox"),
    "DecodeRoutingDecision": (DECODE_ROUTING, "the decode pool's Router.route, in the "
                              "decode-pool process (PDCluster._decode_pool)"),
    "Arrival": (ARRIVAL, "Instance.inject / Instance.enter_engine"),
    "Queued": (QUEUED, "Instance._on_queued (the wait queue)"),
    "Step": (STEP, "Instance.step_time_us(batch), Instance.on_step_end(now_us, step_us, completed)"),
    "Timeout": (TIMEOUT, "Instance._on_timeout"),
    "RequestDone": (STEP, "InstanceListener.on_request_done(inst, req, tick_us) "
                    "(Cluster / PDCluster), after the step or the front end's delivery"),
}


def instance_key(index: int, prio: int) -> int:
    """Heap key of an instance event of BLIS priority ``prio`` on instance ``index``."""
    return INSTANCE_BASE + INSTANCE_STRIDE * index + prio


def succeed_at(event: Event, time_us: int, key: int, value=None) -> Event:
    """Trigger the pending ``event`` with ``value`` so that it is processed at ``time_us``
    (integer µs, not before now) with heap key ``key``; returns the event.

    The keyed counterpart of :meth:`simpy.events.Event.succeed` (which always means "now,
    NORMAL priority"). Raises RuntimeError if the event was already triggered, ValueError
    if ``time_us`` is in the past.
    """
    if event.triggered:
        raise RuntimeError(f"{event} has already been triggered")
    env = event.env
    delay = time_us - env.now
    if delay < 0:
        raise ValueError(f"cannot schedule at {time_us} us: the clock is at {env.now} us")
    event._ok = True
    event._value = value
    env.schedule(event, key, delay)
    return event


def process_now(event: Event, value=None) -> Event:
    """Trigger the pending ``event`` with ``value`` and process it at once (run its callbacks
    now), without a heap entry; returns the event.

    For a request that a resource grants at once and that nobody is waiting on yet (the
    bandwidth link's acquisitions and releases, :mod:`blis_simpy.disagg.bandwidth`): SimPy
    would process it as a NORMAL-priority event *now*, ahead of every model event at this
    time, so processing it here changes no order; a process that then yields it goes
    on at once, as SimPy does for any processed event. Raises RuntimeError if the event was
    already triggered.
    """
    if event.triggered:
        raise RuntimeError(f"{event} has already been triggered")
    event._ok = True
    event._value = value
    callbacks, event.callbacks = event.callbacks, None
    for cb in callbacks:
        cb(event)
    return event


class Call(Event):
    """An event that calls ``fn(arg)`` when it is processed (a plain timed callback).

    Born triggered, like SimPy's own ``Timeout`` (whose constructor sets the same fields);
    scheduled by :meth:`SimEnv.call_at`.
    """

    __slots__ = ("fn", "arg")

    def __init__(self, env: simpy.Environment, fn, arg):
        self.env = env
        self.callbacks = [self._fire]
        self._value = None
        self._ok = True
        self.fn = fn
        self.arg = arg

    def _fire(self, _event) -> None:
        self.fn(self.arg)


class Wake(Event):
    """A triggered event that a process can wait on, scheduled at an explicit key
    (by :meth:`SimEnv.wake_at`)."""

    __slots__ = ()

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.callbacks = []
        self._value = None
        self._ok = True


class SimEnv(simpy.Environment):
    """SimPy environment with integer-µs time and BLIS-ordered event keys."""

    def __init__(self, horizon_us: int):
        super().__init__(initial_time=0)
        self.horizon_us = int(horizon_us)

    def call_at(self, time_us: int, key: int, fn, arg=None) -> Call:
        """Schedule ``fn(arg)`` at absolute time ``time_us`` with heap key ``key``."""
        ev = Call(self, fn, arg)
        self.schedule(ev, key, time_us - self._now)
        return ev

    def call_after(self, delay_us: int, key: int, fn, arg=None, *, inline: bool = True) -> None:
        """``fn(arg)`` ``delay_us`` from now at heap key ``key``: run at once, inside the event
        being processed, when the delay is 0, ``inline`` allows it and nothing could come in
        between (:meth:`quiet_through`: the same order, one event fewer); otherwise scheduled
        as a keyed event (:meth:`call_at`)."""
        if inline and not delay_us and self.quiet_through(key):
            fn(arg)
        else:
            self.call_at(self._now + delay_us, key, fn, arg)

    def wake_at(self, time_us: int, key: int) -> Wake:
        """A triggered event at ``time_us``/``key`` for a process to ``yield``."""
        ev = Wake(self)
        self.schedule(ev, key, time_us - self._now)
        return ev

    def due_before(self, time_us: int) -> bool:
        """Could the active process run its next event at ``time_us`` (µs) *inline*, with
        no event of its own? Only if nothing else is due before it or at that very time
        (``time_us < peek()``) and it is within the horizon. Then no other event could be
        processed in between, so the order of every event is what it would have been."""
        return time_us < self.peek() and time_us <= self.horizon_us

    def advance_to(self, time_us: int) -> None:
        """Move the clock to ``time_us`` (µs) for an inline event (see :meth:`due_before`,
        which the caller must have checked): what :meth:`simpy.core.Environment.step` does
        to the clock when it pops an event, without the event."""
        self._now = time_us

    def quiet_through(self, key: int) -> bool:
        """Is nothing queued at the current time with a heap key at or below ``key`` (and
        nothing earlier)? Then work that a keyed event at ``(now, key)`` would do may be done
        *inline*, by the event being processed: no other event could run in between, so every
        event keeps its order (the caller must not schedule, after the inline work, anything
        at the same time and key as what that work schedules). SimPy's URGENT/NORMAL events
        (keys 0/1) at the current time make it False."""
        q = self._queue
        if not q:
            return True
        head = q[0]
        return head[0] > self._now or head[1] > key

    def latest_due_us(self, limit_us: int, ignore=None) -> int | None:
        """The latest time (µs) of an event now queued at or before ``limit_us``, leaving out
        observers' last looks (key :data:`OBSERVER_AFTER`: two observers waiting on each other
        would never stop) and the events for which ``ignore(event)`` is true; None when no
        such event is queued. Read-only (an observer uses it to never outlive the run:
        :mod:`blis_simpy.cluster.monitor`); O(queued events)."""
        best = None
        for item in self._queue:
            t = item[0]
            if (t <= limit_us and (best is None or t > best) and item[1] != OBSERVER_AFTER
                    and (ignore is None or not ignore(item[3]))):
                best = t
        return None if best is None else int(best)


def wait_until_due(env: SimEnv, time_us: int, limit_us: int, ignore=None):
    """An observer's wait (a generator for ``yield from``): until an event at or after
    ``time_us`` (within ``limit_us``; not one ``ignore`` leaves out, :meth:`SimEnv.latest_due_us`)
    is queued, wake after the latest queued one (key :data:`OBSERVER_AFTER`) and look again.
    Returns True when one is queued, False when none is left (the run is over). So the
    observer never schedules anything after the run's last event."""
    while True:
        last = env.latest_due_us(limit_us, ignore)
        if last is None:
            return False
        if last >= time_us:
            return True
        yield env.wake_at(last, OBSERVER_AFTER)


class Mailbox(simpy.Store):
    """A FIFO hand-off between processes whose deliveries run at a fixed event key.

    A :class:`simpy.Store` (unbounded) customised through SimPy's documented hooks:

    * ``_do_put`` stores the item, accepts the put at once (``put`` never blocks) and
      serves the longest-waiting reader straight away;
    * ``_do_get`` hands the oldest item to a reader *as an event at* ``(now, key)``
      (:func:`succeed_at`) instead of SimPy's ``(now, NORMAL)``, and tells the get queue
      to go on to the next reader while items remain.

    So ``put(item)`` at time *t* delivers to a waiting ``get()`` as an event at ``(t,
    key)``, exactly where BLIS would have pushed the corresponding event; items put while
    no reader waits queue up and are delivered in order, each at a reader's next ``get``.
    Any number of readers may wait: they are served first come, first served (SimPy's get
    queue). ``len(mailbox)`` is the number of undelivered items.
    """

    def __init__(self, env: simpy.Environment, key: int):
        super().__init__(env)
        self.key = key
        self.items: deque = deque()

    def _do_put(self, event: StorePut) -> bool:
        self.items.append(event.item)
        event.succeed()                # accepted (a NORMAL event with no effect on the run)
        self._trigger_get(event)       # a waiting reader gets it now, at this mailbox's key
        return True

    def _do_get(self, event: StoreGet) -> bool:
        items = self.items
        if not items:
            return False               # nothing to hand out: later readers wait too
        succeed_at(event, self._env.now, self.key, items.popleft())
        return True                    # the next waiting reader may get the next item

    def deliver(self, item) -> None:
        """Put ``item`` now, as :meth:`put` does, without the put event: a put is accepted at
        once and nobody waits on its acceptance, so the simulator's own hand-offs skip that
        effect-free event (a NORMAL-priority no-op in the heap). A waiting reader gets the
        item now, at this mailbox's key, exactly as after :meth:`put`."""
        self.items.append(item)
        self._trigger_get(None)

    def put_at(self, time_us: int, item) -> Call:
        """Put ``item`` at a later time (a keyed timed event at ``(time_us, key)`` that
        delivers it, see :meth:`deliver`)."""
        env = self._env
        ev = Call(env, self._deliver_timed, item)
        env.schedule(ev, self.key, time_us - env.now)
        return ev

    def _deliver_timed(self, item) -> None:
        """:meth:`put_at`'s event: deliver ``item``. When a reader waits (so no item is
        queued) and nothing is queued at or before ``(now, key)`` (:meth:`SimEnv.quiet_through`),
        its get would be the very next event: it is processed here instead (the
        longest-waiting reader resumes now, as :meth:`_do_get` would have served it), the
        same order with one event fewer."""
        waiting = self.get_queue
        if waiting and self._env.quiet_through(self.key):
            process_now(waiting.pop(0), item)
        else:
            self.deliver(item)

    def hand_on(self, time_us: int, item) -> Call | None:
        """:meth:`put_at`, but at the current time with nothing queued at or before ``(now,
        key)`` (:meth:`SimEnv.quiet_through`) the item is delivered at once (None is
        returned): the same order with one event fewer. The caller must not itself schedule
        anything at ``(time_us, key)`` after this call (a decision process hands a request
        on and goes back to its inbox)."""
        env = self._env
        if time_us == env._now and env.quiet_through(self.key):
            self.deliver(item)
            return None
        return self.put_at(time_us, item)

    def __len__(self) -> int:
        return len(self.items)
