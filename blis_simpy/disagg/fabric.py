"""The KV-transfer fabric between the prefill and the decode pool (docs/disaggregation.md,
"KV-transfer fabric").

When a prefill sub-request finishes, its KV cache is sent to the decode pool over one
cluster-wide fabric: every transfer shares the same bandwidth budget, whichever instance
pair it connects. A transfer of ``B`` bytes (the prompt's whole KV blocks × block size × KV
bytes per token, computed by :class:`~blis_simpy.cluster.pd.PDCluster`) takes a fixed base
latency plus ``B`` divided by the bandwidth it gets. Three ways of sharing the bandwidth
(``contention``):

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

The fabric is a SimPy process: it takes ``(parent, nbytes)`` from its ``inbox`` (a
:class:`~blis_simpy.des.Mailbox` delivering at key ``KV_TRANSFER_STARTED``: the
``KVTransferStarted`` event) and starts a *transfer process* for each. A transfer process
waits on the shared bandwidth, a SimPy resource
(:class:`~blis_simpy.disagg.bandwidth.BandwidthLink`, processor sharing inside it)::

    with link.request(nbytes, parent) as tr:
        yield tr               # granted at once: bandwidth is divisible
        yield tr.finished      # holds it for its (processor-shared) time
    # released on leaving the with-block

``tr.finished`` fires at key ``KV_TRANSFER_COMPLETED``; the process then counts the
completion and hands the transfer on (``on_complete``). Transfers completing in the same µs
are handed on in start order, as BLIS's heap would (its completion events at equal times
and priority pop in push order, i.e. start order).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from blis_simpy.des import KV_TRANSFER_COMPLETED, KV_TRANSFER_STARTED, Mailbox, SimEnv
from blis_simpy.disagg.bandwidth import (
    CONTENTION_MODES,
    BandwidthLink,
    Contention,
    SharedBandwidth,
    Transfer,
    transfer_size,
)
from blis_simpy.plugins import Pluggable

log = logging.getLogger("blis_simpy.disagg")

#: Largest accepted base latency, ms (1000 hours): keeps every µs value far from int64 limits.
MAX_BASE_LATENCY_MS = 3.6e9
#: Accepted bandwidth range, GB/s (1 MB/s to 1 PB/s): a transfer of any size a scenario allows
#: (docs/scenarios.md, "Limits") then lasts a finite number of µs well inside int64.
MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS = 1e-3, 1e6


class KVTransferFabric(Pluggable, family="kv transfer fabric", name="default"):
    """The cluster-wide KV-transfer fabric: counters around the shared bandwidth resource.

    Fabric classes are a registry (``disaggregation.transfer.fabric``): this one is
    ``default``; a subclass declared with ``name="..."`` is selectable by that name.

    The fabric's process takes ``(parent, nbytes)`` from :attr:`inbox` at the
    ``KVTransferStarted`` event (key ``KV_TRANSFER_STARTED``) and calls
    ``start(parent, nbytes)``, which starts the transfer process (:meth:`transfer`) and
    returns it; at the transfer's completion tick that process releases the link and calls
    ``on_complete(transfer)`` from the event at key ``KV_TRANSFER_COMPLETED``
    (``transfer.complete_us`` is then the current time).

    Counters (docs/disaggregation.md), kept in every mode — BLIS reports the last four only
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

    ``link`` is the :class:`~blis_simpy.disagg.bandwidth.BandwidthLink` every transfer
    acquires (its ``users`` are the transfers in flight).
    """

    def __init__(self, env: SimEnv, *, bandwidth_gbps: float, base_latency_ms: float,
                 contention: Contention, on_complete: Callable[[Transfer], None]):
        bw = float(bandwidth_gbps)
        base = float(base_latency_ms)
        if not (math.isfinite(bw) and MIN_BANDWIDTH_GBPS <= bw <= MAX_BANDWIDTH_GBPS):
            raise ValueError(f"KV transfer bandwidth must be in [{MIN_BANDWIDTH_GBPS:g}, "
                             f"{MAX_BANDWIDTH_GBPS:g}] GB/s, got {bandwidth_gbps}")
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
        self.link = BandwidthLink(env, rate=self.bw, latency_us=self.base_us,
                                  contention=contention, key=KV_TRANSFER_COMPLETED)
        #: ``(parent, nbytes)`` to send, delivered at the ``KVTransferStarted`` event
        self.inbox = Mailbox(env, KV_TRANSFER_STARTED)
        self.process = env.process(self._serve())

    # ------------------------------------------------------------------ public
    @property
    def mean_queue_depth(self) -> float:
        """``depth_sum / starts`` (0.0 before any start)."""
        return self.depth_sum / self.starts if self.starts else 0.0

    def _serve(self):
        """The fabric: take the next transfer to send, start its process."""
        get = self.inbox.get
        while True:
            parent, nbytes = yield get()
            self.start(parent, nbytes)

    def start(self, parent, nbytes: float):
        """Start sending ``nbytes`` (finite, ≥ 0) for ``parent`` now: the transfer process
        (:meth:`transfer`), which acquires the link at once; returns that process.
        ValueError (now) for a size that is not finite and ≥ 0."""
        return self.env.process(self.transfer(parent, transfer_size(nbytes)))

    def transfer(self, parent, nbytes: float):
        """One transfer, a SimPy process: acquire the link, hold it until the bytes are
        through (processor-shared time under ``fair-share``), release it, count the
        completion and hand it on (``on_complete``)."""
        with self.link.request(nbytes, parent) as tr:
            yield tr                                    # granted at once (a share of the rate)
            self._count_start(tr)
            yield tr.finished                           # the bytes are through
        now_us = self.env.now                           # released: the others share the rate
        tr.complete_us = now_us
        self.transfers_completed += 1
        self.active -= 1
        if self.active < 0:
            log.error("KV transfer bookkeeping: active transfers went negative at %d us "
                      "(transfer %d); reset to 0", now_us, tr.seq)
            self.active = 0
            self.corrupted = True
        self.on_complete(tr)

    def _count_start(self, tr: Transfer) -> None:
        self.transfers_initiated += 1
        self.active += 1
        if self.active > self.peak_concurrent:
            self.peak_concurrent = self.active
        self.depth_sum += self.active
        self.starts += 1
        self.transfers.append(tr)


__all__ = ["CONTENTION_MODES", "KVTransferFabric", "MAX_BANDWIDTH_GBPS", "MAX_BASE_LATENCY_MS",
           "MIN_BANDWIDTH_GBPS", "SharedBandwidth", "Transfer"]
