"""The KV-transfer fabric between the prefill and the decode pool (spec/06 §3.4, §3.5, §5).

When a prefill sub-request finishes, its KV cache is sent to the decode pool over one
cluster-wide fabric: every transfer shares the same bandwidth budget, whichever instance
pair it connects. A transfer of ``B`` bytes (block-rounded, see :func:`kv_transfer_bytes`)
takes a fixed base latency plus ``B`` divided by the bandwidth it gets. Three ways of
sharing the bandwidth (``contention``):

``"none"``
    Every transfer gets the full bandwidth: ``duration = max(1, ceil(base + B / bw))``.
``"snapshot"`` (BLIS's ``--pd-transfer-contention``)
    A starting transfer gets ``bw / active``, where ``active`` counts the transfers in
    flight *including itself* (INV-P2-2); the share is fixed for its whole life, never
    revised when others start or finish.
``"fair-share"`` (processor sharing)
    The base latency is a pure delay at the start, during which the transfer uses no
    bandwidth. Then it shares the bandwidth equally with every transfer in its bytes
    phase, and the rates are re-divided at the exact (float) instant any transfer joins or
    leaves. The completion event fires at ``ceil`` of the exact completion time, and at
    least 1 µs after the start.

Units: bandwidth in GB/s with 1 GB = 1e9 B, i.e. ``bw = GB/s × 1000`` bytes per µs; base
latency in ms, i.e. ``base = ms × 1000`` µs; times are integer µs.

The fabric is a SimPy process. It owns the shared bandwidth (a :class:`SharedBandwidth`
for processor sharing), sleeps until the next completion tick and wakes at event key
``KV_TRANSFER_COMPLETED``; a :meth:`KVTransferFabric.start` that moves the next completion
earlier interrupts it so it re-arms (the usual SimPy idiom for "the world changed"). All
transfers completing in the same µs are delivered in start order, as BLIS's heap would
(its completion events at equal times and priority pop in push order, i.e. start order).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import simpy

from blis_simpy.des import KV_TRANSFER_COMPLETED
from blis_simpy.units import ceil_div, to_int64

log = logging.getLogger("blis_simpy.disagg")

Contention = Literal["none", "snapshot", "fair-share"]
CONTENTION_MODES: tuple[str, ...] = ("none", "snapshot", "fair-share")

#: Largest accepted base latency, ms (1000 hours): keeps every µs value far from int64 limits.
MAX_BASE_LATENCY_MS = 3.6e9


def kv_transfer_bytes(num_tokens: int, block_size: int, kv_bytes_per_token: float) -> float:
    """Bytes moved for a prompt of ``num_tokens``: whole blocks, in float (spec/06 §3.4).

    ``ceil_div(num_tokens, block_size) × block_size × kv_bytes_per_token``.
    """
    blocks = ceil_div(int(num_tokens), int(block_size))
    return float(blocks) * float(block_size) * float(kv_bytes_per_token)


@dataclass(slots=True, eq=False)
class Transfer:
    """One KV transfer. Times are integer µs; ``complete_us`` is None until it completes."""

    parent: object = field(repr=False)
    nbytes: float
    seq: int                                # start order, 0-based
    start_us: int
    #: bytes/µs granted for the whole transfer (none / snapshot); None under fair-share
    share: float | None = None
    #: the exact (float) completion time: start + base + bytes/share, or the
    #: processor-sharing finish instant; set when it is known for good
    finish_exact_us: float | None = None
    complete_us: int | None = None

    @property
    def done(self) -> bool:
        return self.complete_us is not None

    @property
    def duration_us(self) -> int | None:
        return None if self.complete_us is None else self.complete_us - self.start_us


class SharedBandwidth:
    """A link of ``rate`` bytes/µs shared equally by every job in service (processor sharing).

    SimPy's :class:`simpy.Resource` does not fit: it is capacity-based — a job holds one of
    ``capacity`` slots for some time or waits in a queue. Bandwidth is divisible and is used
    by *all* transfers at once, each at a rate that changes whenever another one joins or
    leaves; nothing ever waits for a slot. (A :class:`simpy.Container` models a stock of a
    divisible quantity, not a rate divided among users.)

    The bookkeeping uses virtual time: ``vtime`` is the number of bytes each job in service
    has received since the link was last idle; it grows at ``rate / n`` while ``n`` jobs are
    in service. A job joining at virtual time ``V`` with ``B`` bytes gets the tag ``V + B``
    and finishes when ``vtime`` reaches it, so jobs finish in tag order and the next finish
    instant is ``now + (tag_min − vtime) × n / rate``.

    Times here are floats on the caller's axis (the fabric uses µs since the start of the
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
    def in_service(self) -> int:
        """Jobs currently sharing the bandwidth."""
        return len(self._service)

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


class KVTransferFabric:
    """The cluster-wide KV-transfer fabric (a SimPy process owning the shared bandwidth).

    ``start(parent, nbytes)`` is called at the ``KVTransferStarted`` event (key
    ``KV_TRANSFER_STARTED``) and returns the :class:`Transfer`; at its completion tick the
    fabric calls ``on_complete(transfer)`` from an event at key ``KV_TRANSFER_COMPLETED``
    (``transfer.complete_us`` is then the current time).

    Counters (spec/06 §3.4, §3.5, §5), kept in every mode — BLIS reports the last four only
    with contention on:

    * ``transfers_initiated``, ``transfers_completed``;
    * ``active``: started and not yet completed (counting the base-latency phase); a start
      and a completion in the same µs are counted in BLIS's order (start first);
    * ``peak_concurrent``: the largest ``active``;
    * ``depth_sum`` / ``starts`` → :attr:`mean_queue_depth`: ``active`` sampled at each
      start including the new transfer (exactly 1.0 when transfers never overlap);
    * ``corrupted``: set if ``active`` would have gone negative (reset to 0 and logged); the
      run should then end with an error;
    * ``transfers``: every :class:`Transfer` in start order (per-transfer start/complete).
    """

    def __init__(self, env: simpy.Environment, *, bandwidth_gbps: float, base_latency_ms: float,
                 contention: Contention, on_complete: Callable[[Transfer], None]):
        bw = float(bandwidth_gbps)
        base = float(base_latency_ms)
        if not (math.isfinite(bw) and bw > 0):
            raise ValueError(f"KV transfer bandwidth must be finite and > 0 GB/s, got {bandwidth_gbps}")
        if not (math.isfinite(base) and 0 <= base <= MAX_BASE_LATENCY_MS):
            raise ValueError(f"KV transfer base latency must be finite and in [0, {MAX_BASE_LATENCY_MS:g}] "
                             f"ms, got {base_latency_ms}")
        if contention not in CONTENTION_MODES:
            raise ValueError(f"unknown KV transfer contention mode {contention!r}; "
                             f"valid: {', '.join(CONTENTION_MODES)}")
        self.env = env
        self.contention: str = contention
        self.bandwidth_gbps = bw
        self.base_latency_ms = base
        self.bw = bw * 1000.0            # bytes per µs (1 GB = 1e9 B)
        self.base_us = base * 1000.0
        self.on_complete = on_complete
        # counters
        self.transfers_initiated = 0
        self.transfers_completed = 0
        self.active = 0
        self.peak_concurrent = 0
        self.depth_sum = 0
        self.starts = 0
        self.corrupted = False
        self.transfers: list[Transfer] = []
        # state
        self._link = SharedBandwidth(self.bw) if contention == "fair-share" else None
        self._epoch = 0                  # integer µs where the link's time axis starts
        self._due: list = []             # heap of (completion tick, seq, Transfer)
        self._armed: int | None = None   # tick the process sleeps until (None: idle)
        self._waiting = False
        self._kicked = False
        self.process = env.process(self._run())

    # ------------------------------------------------------------------ public
    @property
    def mean_queue_depth(self) -> float:
        """``depth_sum / starts`` (0.0 before any start)."""
        return self.depth_sum / self.starts if self.starts else 0.0

    def start(self, parent, nbytes: float) -> Transfer:
        """Start a transfer of ``nbytes`` (finite, ≥ 0) now; returns its record."""
        b = float(nbytes)
        if not (math.isfinite(b) and b >= 0):
            raise ValueError(f"KV transfer size must be finite and >= 0 bytes, got {nbytes}")
        now = self.env.now
        self.transfers_initiated += 1
        self.active += 1
        if self.active > self.peak_concurrent:
            self.peak_concurrent = self.active
        self.depth_sum += self.active
        self.starts += 1
        tr = Transfer(parent, b, len(self.transfers), now)
        self.transfers.append(tr)
        link = self._link
        if link is None:
            share = self.bw
            if self.contention == "snapshot" and self.active > 1:
                share = share / self.active                        # INV-P2-2, fixed at start
            tr.share = share
            exact = self.base_us + b / share
            tr.finish_exact_us = now + exact
            dur = to_int64(math.ceil(exact))
            heapq.heappush(self._due, (now + (dur if dur > 1 else 1), tr.seq, tr))
        else:
            self._settle(now)
            if link.idle:                 # a new busy period: restart the time axis here
                self._epoch = now
                link.reset()
            link.add((now - self._epoch) + self.base_us, tr.seq, b, tr)
        self._rearm()
        return tr

    def next_completion_us(self) -> int | None:
        """The tick of the next completion as currently known (None if nothing in flight)."""
        link = self._link
        nxt = self._due[0][0] if self._due else None
        if link is not None:
            self._settle(self.env.now)
            nxt = self._due[0][0] if self._due else None
            ahead = link.next_finish()
            if ahead is not None:
                f, tr = ahead
                tick = max(tr.start_us + 1, self._epoch + math.ceil(f))
                if nxt is None or tick < nxt:
                    nxt = tick
        return nxt

    # ------------------------------------------------------------------ internals
    def _settle(self, now: int) -> None:
        """Apply every processor-sharing join/finish up to ``now``; finished → due heap."""
        epoch = self._epoch
        for f, tr in self._link.advance(now - epoch):
            tr.finish_exact_us = epoch + f
            tick = max(tr.start_us + 1, epoch + math.ceil(f))
            heapq.heappush(self._due, (tick, tr.seq, tr))

    def _rearm(self) -> None:
        """Wake the sleeping process if the next completion moved earlier."""
        if not self._waiting or self._kicked:
            return
        nxt = self.next_completion_us()
        if nxt is not None and (self._armed is None or nxt < self._armed):
            self._kicked = True
            self.process.interrupt("rearm")

    def _run(self):
        env = self.env
        served = -1                      # time of the last completion pass
        while True:
            nxt = self.next_completion_us()
            if nxt is not None and nxt <= served:
                # everything due at `served` was just delivered: a completion at or before
                # it would make the process spin in place (a bookkeeping bug, never expected)
                raise RuntimeError(f"KV transfer fabric: next completion {nxt} us is not after "
                                   f"{served} us")
            self._armed = nxt
            if nxt is None:
                ev = env.event()                      # idle: only a start() wakes us
            else:
                ev = env.wake_at(max(nxt, env.now), KV_TRANSFER_COMPLETED)
            self._waiting = True
            try:
                yield ev
            except simpy.Interrupt:
                self._kicked = False
                served = -1
                continue
            finally:
                self._waiting = False
            self._complete_due(env.now)
            served = env.now

    def _complete_due(self, now: int) -> None:
        if self._link is not None:
            self._settle(now)
        due = self._due
        while due and due[0][0] <= now:
            _tick, _seq, tr = heapq.heappop(due)
            tr.complete_us = now
            self.transfers_completed += 1
            self.active -= 1
            if self.active < 0:
                log.error("KV transfer bookkeeping: active transfers went negative at %d us "
                          "(transfer %d); reset to 0", now, tr.seq)
                self.active = 0
                self.corrupted = True
            self.on_complete(tr)


__all__ = ["CONTENTION_MODES", "KVTransferFabric", "MAX_BASE_LATENCY_MS", "SharedBandwidth",
           "Transfer", "kv_transfer_bytes"]
