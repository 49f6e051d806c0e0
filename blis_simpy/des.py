"""The discrete-event core: a SimPy environment whose event order reproduces BLIS exactly.

BLIS keeps one event heap for the cluster and one per instance, each ordered by
``(time, priority, seq)``; cluster events win ties with instance events, and among
instances the lowest index wins, one event at a time (spec/01 §3–§4). All of that is one
total order, so a single SimPy heap can hold it: SimPy orders its queue by
``(time, priority, insertion id)`` and accepts any integer as the priority. We encode

* cluster event of BLIS priority ``p``  → key ``CLUSTER_BASE + 2p`` (``+1`` for session
  follow-up arrivals, which BLIS pushes after every pre-generated arrival);
* event of BLIS priority ``p`` on instance ``k`` → key ``INSTANCE_BASE + 8k + p``.

SimPy's own URGENT/NORMAL (0/1) events (process start-up) sort before all of these; they
never change simulation state. The clock is an integer number of microseconds.
"""

from __future__ import annotations

from collections import deque

import simpy
from simpy.events import Event

CLUSTER_BASE = 2
CLUSTER_ARRIVAL = CLUSTER_BASE + 0
FOLLOWUP_ARRIVAL = CLUSTER_BASE + 1
ADMISSION = CLUSTER_BASE + 2
ROUTING = CLUSTER_BASE + 4
DISAGGREGATION = CLUSTER_BASE + 6
PREFILL_ROUTING = CLUSTER_BASE + 8
KV_TRANSFER_STARTED = CLUSTER_BASE + 10
KV_TRANSFER_COMPLETED = CLUSTER_BASE + 12
DECODE_ROUTING = CLUSTER_BASE + 14

INSTANCE_BASE = 32
INSTANCE_STRIDE = 8
ARRIVAL, QUEUED, STEP, SCHEDULED, REQUEST_LEFT, TIMEOUT = range(6)


def instance_key(index: int, prio: int) -> int:
    """Heap key of an instance event of BLIS priority ``prio`` on instance ``index``."""
    return INSTANCE_BASE + INSTANCE_STRIDE * index + prio


class Call(Event):
    """An event that calls ``fn(arg)`` when it is processed (a plain timed callback)."""

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
    """A triggered event that a process can wait on, scheduled at an explicit key."""

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

    def wake_at(self, time_us: int, key: int) -> Wake:
        """A triggered event at ``time_us``/``key`` for a process to ``yield``."""
        ev = Wake(self)
        self.schedule(ev, key, time_us - self._now)
        return ev

    def run_to_horizon(self) -> None:
        """Process every event with time ≤ horizon (spec/01 §4: events at the horizon run)."""
        self.run(until=self.horizon_us + 1)


class Mailbox:
    """A FIFO hand-off between processes whose deliveries run at a fixed event key.

    ``put(item)`` at time *t* delivers to a waiting ``get()`` as an event at ``(t, key)``,
    exactly where BLIS would have pushed the corresponding event; items put while the
    reader is busy queue up and are delivered in order, each at the reader's next ``get``.
    (A deque plus a wake-up event: SimPy's Store schedules at NORMAL priority, which would
    break BLIS's ordering.)
    """

    __slots__ = ("env", "key", "items", "_getter")

    def __init__(self, env: simpy.Environment, key: int):
        self.env = env
        self.key = key
        self.items: deque = deque()
        self._getter: Event | None = None

    def put(self, item) -> None:
        g = self._getter
        if g is not None:
            self._getter = None
            g._ok = True
            g._value = item
            self.env.schedule(g, self.key, 0)
        else:
            self.items.append(item)

    def put_at(self, time_us: int, item) -> None:
        """Deliver ``item`` at a later time (a keyed timed event that puts it)."""
        ev = Call(self.env, self.put, item)
        self.env.schedule(ev, self.key, time_us - self.env.now)

    def get(self) -> Event:
        ev = Event(self.env)
        if self.items:
            ev._ok = True
            ev._value = self.items.popleft()
            self.env.schedule(ev, self.key, 0)
        else:
            self._getter = ev
        return ev

    def __len__(self) -> int:
        return len(self.items)
