"""The KV-transfer fabric's bandwidth: a SimPy resource with processor sharing inside.

:class:`BandwidthLink` is a :class:`simpy.resources.base.BaseResource` subclass. A transfer
*acquires* it with ``link.request(nbytes, parent)``, which returns the :class:`Transfer`
(SimPy's ``Put`` event of this resource); the transfer's ``finished`` event fires when its
bytes are through, and the holder then *releases* it with ``link.release(transfer)``
(SimPy's ``Get`` event) — or by leaving ``with link.request(...) as tr:``, as a transfer
process does (:meth:`blis_simpy.disagg.fabric.KVTransferFabric.transfer`). A request is granted at once: bandwidth is divisible and used by
all holders together, so nobody queues for a slot. ``link.users`` are the transfers holding
the link — acquired and not yet released, BLIS's *active* transfers.

What a holder gets (``contention``; ``rate`` in bytes/µs, ``latency_us`` a fixed
per-transfer delay):

``"none"``
    The full rate: ``finish = start + latency + B / rate``.
``"snapshot"`` (BLIS's)
    ``rate / len(users)`` counted at the acquisition, the new transfer included, kept for
    the transfer's whole life.
``"fair-share"`` (processor sharing)
    After the latency (a pure delay, no bandwidth used) the transfer shares the rate
    equally with every holder in its bytes phase; the rates are re-divided at the exact
    (float) instant any holder joins or leaves that phase. :class:`SharedBandwidth` does
    the bookkeeping.

``finished`` fires at ``ceil`` of the exact (float) finish instant, at least 1 µs after
the start, as an event at the link's heap ``key`` (:mod:`blis_simpy.des`); transfers
finishing in the same µs fire in acquisition order (BLIS pops equal-time completions in
push order). Acquisitions and releases are granted and processed at once
(:func:`blis_simpy.des.process_now`: SimPy would process them as NORMAL events now, ahead of
every model event), so ``yield tr`` goes on without an event. Under none/snapshot the finish
tick is known at the acquisition and ``finished`` is scheduled then. Under fair-share one
keyed timer event is armed for the next finish tick (computed once per change of the holders);
an acquisition that moves that tick earlier arms an earlier one (the superseded timer fires
and does nothing); the timer processes the due ``finished`` events itself when nothing else is
queued before their place. Times on the SimPy clock are integer µs.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Literal

from simpy.core import BoundClass
from simpy.events import Event
from simpy.resources.base import BaseResource, Get, Put

from blis_simpy.des import SimEnv, process_now, succeed_at
from blis_simpy.units import to_int64

Contention = Literal["none", "snapshot", "fair-share"]
CONTENTION_MODES: tuple[str, ...] = ("none", "snapshot", "fair-share")


class SharedBandwidth:
    """Processor-sharing bookkeeping: ``rate`` bytes/µs shared equally by every job in service.

    This is the arithmetic inside :class:`BandwidthLink` under ``fair-share``; it knows
    nothing of SimPy. It uses virtual time: ``vtime`` is the number of bytes each job in
    service has received since the link was last idle; it grows at ``rate / n`` while ``n``
    jobs are in service. A job joining at virtual time ``V`` with ``B`` bytes gets the tag
    ``V + B`` and finishes when ``vtime`` reaches it, so jobs finish in tag order and the
    next finish instant is ``now + (tag_min − vtime) × n / rate``.

    Times here are floats on the caller's axis (the link uses µs since the start of the
    current busy period). The state changes only at joins and finishes, never at arbitrary
    query times, so a finish instant computed ahead (:meth:`next_finish`) is bit-identical
    to the one :meth:`advance` later applies. Joins must be added in non-decreasing time
    order, never before the last processed instant.
    """

    __slots__ = ("rate", "now", "vtime", "_service", "_pending")

    def __init__(self, rate: float):
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"bandwidth rate must be finite and > 0, got {rate}")
        self.rate = float(rate)
        self.reset()

    def reset(self) -> None:
        """Forget everything (only when :attr:`idle`); the time axis restarts at 0."""
        self.now = 0.0
        self.vtime = 0.0
        self._service: list = []           # heap of (tag, seq, job)
        self._pending: deque = deque()     # (join time, seq, nbytes, job), in join order

    @property
    def idle(self) -> bool:
        """No job in service and none waiting to join."""
        return not self._service and not self._pending

    def add(self, join_time: float, seq: int, nbytes: float, job) -> None:
        """Job ``job`` starts sharing the bandwidth at ``join_time`` with ``nbytes`` to move."""
        last = self._pending[-1][0] if self._pending else self.now
        if join_time < last:
            raise ValueError(f"join at {join_time} is before {last}: joins must be in time order")
        self._pending.append((float(join_time), seq, float(nbytes), job))

    def next_finish(self):
        """``(instant, job)`` of the next job to finish given the joins known so far, or None."""
        rate = self.rate
        t = self.now
        v = self.vtime
        n = len(self._service)
        best = self._service[0] if n else None
        for tj, seq, nbytes, job in self._pending:
            if n:
                tf = t + (best[0] - v) * n / rate
                if tf <= tj:
                    return tf, best[2]
                v = v + (tj - t) * rate / n
            t = tj
            tag = v + nbytes
            if best is None or (tag, seq) < (best[0], best[1]):
                best = (tag, seq, job)
            n += 1
        if best is None:
            return None
        return t + (best[0] - v) * n / rate, best[2]

    def advance(self, until: float) -> list:
        """Apply every join and finish at an instant ``<= until``, in time order (a finish
        before a join at the same instant); return the finished ``(instant, job)`` pairs."""
        out = []
        rate = self.rate
        svc = self._service
        pend = self._pending
        inf = math.inf
        while True:
            n = len(svc)
            tf = self.now + (svc[0][0] - self.vtime) * n / rate if n else inf
            tj = pend[0][0] if pend else inf
            if tf <= tj:
                if tf > until:
                    return out
                tag, _seq, job = heapq.heappop(svc)
                self.now = tf
                self.vtime = tag
                out.append((tf, job))
            else:
                if tj > until:
                    return out
                tj, seq, nbytes, job = pend.popleft()
                if n:
                    self.vtime = self.vtime + (tj - self.now) * rate / n
                self.now = tj
                heapq.heappush(svc, (self.vtime + nbytes, seq, job))


def transfer_size(nbytes) -> float:
    """``nbytes`` as a float; ValueError unless finite and ≥ 0 bytes."""
    b = float(nbytes)
    if not (math.isfinite(b) and b >= 0):
        raise ValueError(f"KV transfer size must be finite and >= 0 bytes, got {nbytes}")
    return b


class Transfer(Put):
    """One transfer: a request for the link's bandwidth (SimPy's ``Put`` event of
    :class:`BandwidthLink`), granted as soon as it is made.

    ``nbytes`` (finite, ≥ 0) is its size; ``parent`` is whatever the caller attaches (the
    fabric: the PD parent request). The link fills in ``seq`` (acquisition order, 0-based),
    ``share`` (bytes/µs for the whole transfer under none/snapshot; None under fair-share)
    and ``finish_exact_us`` (the exact float finish instant, once it is known for good).
    ``finished`` is an event that fires at the completion tick with the transfer as its
    value; ``complete_us`` is set by whoever handles it (None until then). Times are µs.
    """

    def __init__(self, link: BandwidthLink, nbytes: float, parent=None):
        b = transfer_size(nbytes)
        env = link._env
        self.parent = parent
        self.nbytes = b
        self.seq = -1
        self.start_us: int = env.now
        self.share: float | None = None
        self.finish_exact_us: float | None = None
        self.complete_us: int | None = None
        #: the completion tick (µs) once known for good (None before)
        self.due_us: int | None = None
        self.finished = Event(env)
        super().__init__(link)

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        """Leaving ``with link.request(...) as tr:`` releases the link (once its bytes are
        through; a transfer whose bytes are not through keeps holding it — never expected
        from a process that waited on ``tr.finished``)."""
        super().__exit__(exc_type, exc_value, traceback)
        if self.finished.triggered and self in self.resource.users:
            self.resource.release(self)

    @property
    def duration_us(self) -> int | None:
        """Completion minus start, µs (None until completed)."""
        return None if self.complete_us is None else self.complete_us - self.start_us

    def _desc(self) -> str:
        return f"Transfer(seq={self.seq}, nbytes={self.nbytes!r})"


class Release(Get):
    """Give the link back after a transfer (SimPy's ``Get`` event of :class:`BandwidthLink`)."""

    def __init__(self, link: BandwidthLink, transfer: Transfer):
        self.transfer = transfer
        super().__init__(link)


class BandwidthLink(BaseResource):
    """A link of ``rate`` bytes/µs with a fixed per-transfer ``latency_us`` (float µs),
    shared under ``contention`` (see the module docstring); its events run at heap ``key``.

    ``request(nbytes, parent=None)`` acquires it (:class:`Transfer`); ``release(transfer)``
    gives it back once ``transfer.finished`` has fired. ``users`` lists the holders in
    acquisition order.
    """

    def __init__(self, env: SimEnv, *, rate: float, latency_us: float, contention: Contention,
                 key: int):
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"bandwidth rate must be finite and > 0, got {rate}")
        if not (math.isfinite(latency_us) and latency_us >= 0):
            raise ValueError(f"link latency must be finite and >= 0 us, got {latency_us}")
        if contention not in CONTENTION_MODES:
            raise ValueError(f"unknown contention mode {contention!r}; valid: {', '.join(CONTENTION_MODES)}")
        super().__init__(env, math.inf)
        self.rate = float(rate)
        self.latency_us = float(latency_us)
        self.contention: str = contention
        self.key = key
        self.users: list[Transfer] = []
        self._ps = SharedBandwidth(self.rate) if contention == "fair-share" else None
        self._epoch = 0                  # integer µs where the sharing time axis starts
        self._due: list = []             # heap of (completion tick, seq, Transfer)
        self._acquired = 0               # transfers acquired so far (the next seq)
        self._armed: int | None = None   # tick of the live timer (None: none armed)
        self._timer = 0                  # id of the live timer; older timers do nothing

    request = BoundClass(Transfer)

    def release(self, transfer: Transfer) -> Release:
        """Give the link back; ``transfer.finished`` must have fired."""
        if transfer.resource is not self or not transfer.finished.triggered:
            raise ValueError(f"{transfer} cannot be released: it does not hold this link or "
                             f"has not finished")
        return Release(self, transfer)

    # ------------------------------------------------------------------ SimPy hooks
    def _do_put(self, tr: Transfer) -> bool:
        """Acquisition: always granted now; schedule the transfer's bytes."""
        now_us = self._env.now
        tr.seq = self._acquired
        self._acquired += 1
        self.users.append(tr)
        ps = self._ps
        if ps is None:
            share = self.rate
            n = len(self.users)
            if self.contention == "snapshot" and n > 1:
                share = share / n                                  # INV-P2-2, fixed at start
            tr.share = share
            exact = self.latency_us + tr.nbytes / share
            tr.finish_exact_us = now_us + exact
            dur = to_int64(math.ceil(exact))
            # known for good now: the completion is scheduled at once, no timer (same-tick
            # completions fire in acquisition order, the order they are scheduled in)
            tr.due_us = now_us + (dur if dur > 1 else 1)
            succeed_at(tr.finished, tr.due_us, self.key, tr)
            process_now(tr)
            return True
        else:
            self._settle(now_us)
            if ps.idle:                   # a new busy period: restart the time axis here
                self._epoch = now_us
                ps.reset()
            ps.add((now_us - self._epoch) + self.latency_us, tr.seq, tr.nbytes, tr)
        process_now(tr)
        self._arm(self.next_completion_us())
        return True

    def _do_get(self, rel: Release) -> bool:
        """Release: the transfer stops holding the link."""
        self.users.remove(rel.transfer)
        process_now(rel)
        return True

    # ------------------------------------------------------------------ timing
    def next_completion_us(self) -> int | None:
        """The tick of the next completion as currently known (None if nothing in flight)."""
        ps = self._ps
        if ps is None:
            return min((tr.due_us for tr in self.users if not tr.finished.processed), default=None)
        self._settle(self._env.now)
        nxt = self._due[0][0] if self._due else None
        ahead = ps.next_finish()
        if ahead is not None:
            f, tr = ahead
            tick = max(tr.start_us + 1, self._epoch + math.ceil(f))
            if nxt is None or tick < nxt:
                nxt = tick
        return nxt

    def _settle(self, now_us: int) -> None:
        """Apply every processor-sharing join/finish up to ``now_us``; finished → due heap."""
        epoch = self._epoch
        for f, tr in self._ps.advance(now_us - epoch):
            tr.finish_exact_us = epoch + f
            tick = max(tr.start_us + 1, epoch + math.ceil(f))
            tr.due_us = tick
            heapq.heappush(self._due, (tick, tr.seq, tr))

    def _arm(self, nxt: int | None) -> None:
        """Arm a timer for the next completion ``nxt`` (µs, :meth:`next_completion_us`,
        computed once per change of the holders) if it is earlier than the live one."""
        if nxt is None or (self._armed is not None and nxt >= self._armed):
            return
        env = self._env
        self._armed = nxt
        self._timer += 1
        env.call_at(max(nxt, env.now), self.key, self._on_timer, self._timer)

    def _on_timer(self, timer: int) -> None:
        """Fire ``finished`` of every transfer due now, in (tick, acquisition) order."""
        if timer != self._timer:
            return                        # superseded by an earlier timer
        self._armed = None
        env = self._env
        key = self.key
        now_us = env.now
        if self._ps is not None:
            self._settle(now_us)
        due = self._due
        while due and due[0][0] <= now_us:
            # processed here rather than as an event right behind this one at (now, key)
            # when nothing is queued before that place (SimEnv.quiet_through): the waiting
            # transfer process resumes in the same order with one event fewer
            tr = heapq.heappop(due)[2]
            if env.quiet_through(key):
                process_now(tr.finished, tr)
            else:
                succeed_at(tr.finished, now_us, key, tr)
        nxt = self.next_completion_us()
        if nxt is not None and nxt <= now_us:
            # everything due now was just fired: a completion at or before now would make
            # the timer spin in place (a bookkeeping bug, never expected)
            raise RuntimeError(f"bandwidth link: next completion {nxt} us is not after {now_us} us")
        self._arm(nxt)


__all__ = ["BandwidthLink", "CONTENTION_MODES", "Contention", "Release", "SharedBandwidth",
           "Transfer", "transfer_size"]
