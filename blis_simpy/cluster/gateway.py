"""The gateway queue: admitted requests wait here before routing (docs/control-plane.md,
"Gateway queue").

``cluster.gateway`` puts a bounded queue between admission and routing, as BLIS's flow
control (inference-sim ``sim/cluster/gateway_queue.go``) and llm-d's inference gateway
(gateway-api-inference-extension ``pkg/epp/flowcontrol``) do. An admitted request enters
the queue (:meth:`Gateway.offer`) or is shed; a **dispatcher process** sends requests on to
the router while the policy says the cluster has room. The process sleeps on a doorbell (a
plain ``simpy.Event``) rung at key :data:`~blis_simpy.des.GATEWAY` (the GatewayDispatch event) — after the admissions of
that µs, before its routing decisions — when a request enters, when one finishes (its
instance reports it completed, dropped or timed out, or routing rejects it), and, for a policy
that reads instance load (``polls``), every ``dispatch_tick_us`` while requests wait.

The decisions are the :class:`~blis_simpy.admission.gateway.GatewayPolicy`'s; this module
keeps the queue (one heap per flow and band, ordered by the policy's rank), the per-band
counts, and the results: shed requests, queue waits, depth.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from dataclasses import dataclass, field

from blis_simpy.admission.gateway import GatewayPolicy, Queued
from blis_simpy.des import GATEWAY, succeed_at
from blis_simpy.plugins import plugin_error
from blis_simpy.request import COMPLETED
from blis_simpy.request_view import as_view

log = logging.getLogger("blis_simpy.cluster")

#: why a request was shed: the queue held ``max_depth``; its band held ``band_queue_limit``;
#: a queued request pushed out by a higher-ranked arrival (``shed: lowest``)
SHED_REASONS = ("queue_full", "band_full", "displaced")


@dataclass
class GatewayCounters:
    """What the gateway did; ``offered`` = ``dispatched`` + ``shed`` + ``queued`` (checked at
    the end, :func:`~blis_simpy.cluster.invariants.check_gateway_conservation`)."""

    offered: int = 0
    dispatched: int = 0
    shed: int = 0
    queued: int = 0
    peak_depth: int = 0
    shed_by_reason: dict[str, int] = field(default_factory=dict)
    #: per fair-share flow (tenant or SLO class): arrivals, requests offered, sent, shed
    arrived_by_flow: Counter = field(default_factory=Counter)
    offered_by_flow: Counter = field(default_factory=Counter)
    dispatched_by_flow: Counter = field(default_factory=Counter)
    shed_by_flow: Counter = field(default_factory=Counter)
    #: requests of each flow that passed the gateway and completed
    completed_by_flow: Counter = field(default_factory=Counter)
    #: the time each dispatched request waited in the queue, µs, and its flow, in dispatch order
    waits_us: list[int] = field(default_factory=list)
    dispatched_flows: list[str] = field(default_factory=list)
    #: the queued request ids in the order they left (tests read the dispatch order)
    order: list[str] = field(default_factory=list)


class Gateway:
    """The queue of one cluster. ``route(req)`` sends a dispatched request on to routing (the
    cluster's routing step after its routing latency); ``state()`` is the cluster's
    :class:`~blis_simpy.snapshot.RouterState` over every instance now; ``on_shed(req)`` is told
    of every shed request."""

    def __init__(self, env, policy: GatewayPolicy, *, route, state, on_shed=None, max_depth: int = 0,
                 band_queue_limit: int = 0, band_inflight_limit: int = 0,
                 dispatch_tick_us: int = 1000, field_name: str = "cluster.gateway", trace=None):
        self.env = env
        self.policy = policy
        self._route = route
        self._state = state
        self._on_shed = on_shed
        self.max_depth = max_depth
        self.band_queue_limit = band_queue_limit
        self.band_inflight_limit = band_inflight_limit
        self.dispatch_tick_us = dispatch_tick_us
        self.field = field_name
        #: the run's :class:`~blis_simpy.trace.DecisionTrace` (every queue decision), or None
        self.trace = trace
        self.counters = GatewayCounters()
        self._heaps: dict[tuple[str, int], list] = {}   # (flow, band) -> [(rank, seq, entry)]
        self._flow_len: Counter = Counter()
        self._band_len: Counter = Counter()
        self._band_inflight: Counter = Counter()
        self._inflight: dict[str, tuple[int, str]] = {}  # dispatched request id -> (band, flow)
        self._seq = 0
        self._reqs: dict[int, object] = {}   # a plugin policy's entries hold views: seq -> request
        #: dispatched requests no instance holds: inside the routing latency, or with
        #: prefill/decode pools in the disaggregation decision and the KV transfer
        self._pending = 0
        self._tick_due = False
        self._bell = env.event()
        self.process = env.process(self._dispatcher())

    # ------------------------------------------------------------------ entering
    def arrived(self, req) -> None:
        """A ClusterArrival (before admission): the per-flow offered load of the results."""
        pol = self.policy
        self.counters.arrived_by_flow[pol.flow(req if pol._blis_builtin else as_view(req))] += 1

    def offer(self, req) -> None:
        """An admitted request: into the queue, or shed (the arriving one or a queued victim)."""
        c = self.counters
        pol = self.policy
        now = self.env.now
        self._seq += 1
        seen = req if pol._blis_builtin else as_view(req)   # a plugin sees a read-only view
        if not pol._blis_builtin:
            self._reqs[self._seq] = req
        entry = Queued(seen, self._seq, now, pol.flow(seen), pol.band(seen),
                       tuple(pol.rank(seen, self._seq, now)))
        c.offered += 1
        c.offered_by_flow[entry.flow] += 1
        if self.band_queue_limit and self._band_len[entry.band] >= self.band_queue_limit:
            self._shed(entry, "band_full")
            return
        if self.max_depth and c.queued >= self.max_depth:
            victim = None
            if pol.sheds_queued():
                queued = self.entries()
                victim = pol.victim(queued, entry)
                if victim is not None and victim not in queued:
                    raise plugin_error(pol, f"victim() returned {victim!r}, not a queued request "
                                       "or None", field=f"{self.field}.policy")
            if victim is None:
                self._shed(entry, "queue_full")
                return
            self._remove(victim)
            self._shed(victim, "displaced")
        was_empty = self._flow_len[entry.flow] == 0
        heapq.heappush(self._heaps.setdefault((entry.flow, entry.band), []),
                       (entry.rank, entry.seq, entry))
        self._flow_len[entry.flow] += 1
        self._band_len[entry.band] += 1
        c.queued += 1
        c.peak_depth = max(c.peak_depth, c.queued)
        if self.trace is not None:
            self.trace.record_gateway(req.id, now, "queued", entry, c.queued)
        pol.enqueued(entry, was_empty)
        self.ring()

    def _shed(self, entry: Queued, reason: str) -> None:
        c = self.counters
        c.shed += 1
        c.shed_by_reason[reason] = c.shed_by_reason.get(reason, 0) + 1
        c.shed_by_flow[entry.flow] += 1
        log.debug("gateway shed %s (%s)", entry.req.id, reason)
        req = self._reqs.pop(entry.seq, entry.req)
        if self.trace is not None:
            self.trace.record_gateway(req.id, self.env.now, "shed", entry, c.queued, reason)
        if self._on_shed is not None:
            self._on_shed(req)

    def entries(self) -> list[Queued]:
        """Every queued request, in (flow, band) then rank order."""
        return [e for key in sorted(self._heaps) for _, _, e in sorted(self._heaps[key])]

    def _remove(self, entry: Queued) -> None:
        heap = self._heaps[(entry.flow, entry.band)]
        heap.remove((entry.rank, entry.seq, entry))
        heapq.heapify(heap)
        self._dequeued(entry)

    def _dequeued(self, entry: Queued) -> None:
        key = (entry.flow, entry.band)
        if not self._heaps[key]:
            del self._heaps[key]
        self._flow_len[entry.flow] -= 1
        self._band_len[entry.band] -= 1
        self.counters.queued -= 1

    # ------------------------------------------------------------------ leaving
    def left(self, req) -> None:
        """A request that passed the gateway finished (completed, dropped, timed out) or was
        rejected at routing: its band has one in flight fewer, and the cluster may have room."""
        sent = self._inflight.pop(req.id, None)
        if sent is not None:
            self._band_inflight[sent[0]] -= 1
            if req.state == COMPLETED:
                self.counters.completed_by_flow[sent[1]] += 1
        if self.counters.queued:
            self.ring()

    def routed(self) -> None:
        """A dispatched request reached the router (after the routing latency; with
        prefill/decode pools, its prefill or decode sub-request reached its pool's router)."""
        self._pending -= 1

    def transferring(self) -> None:
        """With prefill/decode pools: a dispatched request's prefill finished, and no instance
        holds it while its KV moves (pending again until its decode pool routes it)."""
        self._pending += 1

    def ring(self) -> None:
        """Wake the dispatcher at the current time (once, however often it is rung)."""
        if not self._bell.triggered:
            succeed_at(self._bell, self.env.now, GATEWAY)

    def _tick(self, _arg=None) -> None:
        self._tick_due = False
        self.ring()

    def _dispatcher(self):
        while True:
            yield self._bell
            self._bell = self.env.event()
            self._dispatch()

    def _heads(self) -> list[Queued]:
        """The head of every flow that may send: per flow, its best entry among the bands
        below their in-flight limit."""
        limit = self.band_inflight_limit
        best: dict[str, Queued] = {}
        for (flow, band), heap in self._heaps.items():
            if limit and self._band_inflight[band] >= limit:
                continue
            e = heap[0][2]
            cur = best.get(flow)
            if cur is None or (e.rank, e.seq) < (cur.rank, cur.seq):
                best[flow] = e
        return [best[f] for f in sorted(best)]

    def _dispatch(self) -> None:
        pol = self.policy
        c = self.counters
        now = self.env.now
        while c.queued:
            if not pol.has_room(self._state(), self._pending):
                break
            heads = self._heads()
            if not heads:
                break
            entry = pol.pick(heads)
            if entry not in heads:
                raise plugin_error(pol, f"pick() returned {entry!r}, not one of the heads it was "
                                   "given", field=f"{self.field}.policy")
            heapq.heappop(self._heaps[(entry.flow, entry.band)])
            self._dequeued(entry)
            pol.dispatched(entry)
            c.dispatched += 1
            c.dispatched_by_flow[entry.flow] += 1
            c.waits_us.append(now - entry.enqueue_us)
            c.dispatched_flows.append(entry.flow)
            c.order.append(entry.req.id)
            self._band_inflight[entry.band] += 1
            self._inflight[entry.req.id] = (entry.band, entry.flow)
            self._pending += 1
            req = self._reqs.pop(entry.seq, entry.req)
            if self.trace is not None:
                self.trace.record_gateway(req.id, now, "dispatched", entry, c.queued,
                                          wait_us=now - entry.enqueue_us)
            self._route(req)
        if c.queued and pol.polls and not self._tick_due:
            self._tick_due = True
            self.env.call_at(now + self.dispatch_tick_us, GATEWAY, self._tick)
