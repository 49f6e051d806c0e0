"""Prefill/decode disaggregation in the control plane (docs/disaggregation.md,
"The path step by step").

:class:`PDCluster` extends :class:`~blis_simpy.cluster.cluster.Cluster` with three SimPy
processes, each taking its work from a :class:`~blis_simpy.des.Mailbox` (a SimPy Store) and
doing it: the disaggregation decision, the prefill pool and the decode pool; and the
KV-transfer fabric (:class:`~blis_simpy.disagg.fabric.KVTransferFabric`, a process whose
transfers are processes holding its bandwidth resource) between the pools::

    Admission ─► DisaggregationDecision ─┬─ no ─► RoutingDecision (local: decode pool)
                                         └─ yes ─► parent + "<id>_prefill"
    prefill pool ─► prefill instance ─► [prefill done, detected after its event]
    fabric: KVTransferStarted ─► KVTransferCompleted ─► "<id>_decode"
    decode pool ─► decode instance (KV pre-allocated) ─► [decode done] ─► parent complete

Every hand-off happens at the event key BLIS gives it (docs/architecture.md), so the order of
events, ties included, is BLIS's. Parent records keep each phase's time (INV-PD-4).
"""

from __future__ import annotations

import logging

from blis_simpy.cluster.cluster import Cluster
from blis_simpy.cluster.policies import build_router
from blis_simpy.des import DECODE_ROUTING, DISAGGREGATION, PREFILL_ROUTING, ROUTING, Mailbox
from blis_simpy.disagg.deciders import PoolView, make_decider
from blis_simpy.disagg.fabric import KVTransferFabric
from blis_simpy.disagg.parent import ParentRequest
from blis_simpy.disagg.projection import correct_and_project, pd_metrics
from blis_simpy.engine import tally
from blis_simpy.errors import InvariantError
from blis_simpy.metrics.summary import aggregate
from blis_simpy.request import COMPLETED, DROPPED, Request
from blis_simpy.units import ceil_div

log = logging.getLogger("blis_simpy.cluster")


class PDCluster(Cluster, name="pd"):
    """A cluster whose instances are split into a prefill pool and a decode pool.

    ``roles[k]`` is ``"prefill"``, ``"decode"`` or ``""`` (unassigned) for instance ``k``.
    ``local_routing`` is ``"decode-pool"`` (the seed's INV-P2-4, our default) or ``"all"``
    (the Go checkout). ``on_parent_done(parent_request, state, tick_us)`` is called when a
    disaggregated request finishes or fails (closed-loop sessions).
    """

    def __init__(self, env, instances, admission, router, *, roles, decider, fabric,
                 kv_bytes_per_token: float, block_size: int, prefill_router=None,
                 decode_router=None, local_routing: str = "decode-pool", on_parent_done=None,
                 transfer_at_step_end: bool = True, **kw):
        super().__init__(env, instances, admission, router, **kw)
        self.roles = list(roles)
        self.prefill_pool = [inst for inst, r in zip(instances, roles, strict=True) if r == "prefill"]
        self.decode_pool = [inst for inst, r in zip(instances, roles, strict=True) if r == "decode"]
        self.decider = decider
        self.fabric = fabric
        self.kv_bytes_per_token = float(kv_bytes_per_token)
        self.block_size = block_size
        self.prefill_router = prefill_router or router
        self.decode_router = decode_router or router
        self.local_routing = local_routing
        self.on_parent_done = on_parent_done
        #: start a KV transfer when the prefill's last step *ends* (ours) or at the start of
        #: that step, where BLIS detects it (divergences.md P13: the step is never paid for)
        self.transfer_at_step_end = transfer_at_step_end
        self.parents: dict[str, ParentRequest] = {}
        self.pending_prefill: dict[str, ParentRequest] = {}
        self.pending_decode: dict[str, ParentRequest] = {}
        self.prefill_completed = 0
        self.decode_completed = 0
        self.dropped_at_decode_kv = 0
        #: prompt KVs each instance holds for a transfer: its prefill done, not yet on a decode
        #: instance (by instance index); ``on_kv_sent(index)`` is told when one arrives (the
        #: autoscaler keeps a draining prefill instance on until it has sent them all)
        self.kv_sending = [0] * len(instances)
        self.on_kv_sent = None
        self._index_of = {inst.id: inst.index for inst in instances}
        self._prefill_done: list = []
        self._decode_done: list = []
        #: admitted requests, delivered at the DisaggregationDecision event
        self.decision_inbox = Mailbox(env, DISAGGREGATION)
        #: parents, delivered at the PrefillRoutingDecision event
        self.prefill_inbox = Mailbox(env, PREFILL_ROUTING)
        #: finished transfers (the fabric's ``on_complete``), delivered at the DecodeRoutingDecision event
        self.decode_inbox = Mailbox(env, DECODE_ROUTING)
        fabric.on_complete = self.decode_inbox.deliver
        env.process(self._decisions())
        env.process(self._prefill_pool())
        env.process(self._decode_pool())

    def set_serving(self, instances) -> None:
        """Route only to ``instances`` (the autoscaler's serving ones): each pool is its
        members among them."""
        super().set_serving(instances)
        roles = self.roles
        self.prefill_pool = [inst for inst in instances if roles[inst.index] == "prefill"]
        self.decode_pool = [inst for inst in instances if roles[inst.index] == "decode"]

    # ------------------------------------------------------------------ decision
    def _after_admission(self, req) -> None:
        if self.gateway is not None:     # the queue sends it on to the decision (to_routing)
            self.gateway.offer(req)
            return
        self.decision_inbox.deliver(req)

    def to_routing(self, req) -> None:
        """A request the gateway queue sends on: to the disaggregation decision, now (the
        routing latency follows the decision, as without a queue). It counts as the gateway's
        ``pending`` until an instance holds it or its prefill sub-request (docs/control-plane.md,
        "Gateway queue")."""
        self.decision_inbox.deliver(req)

    def pool_view(self, req) -> PoolView:
        """What a decider sees of the pools for ``req`` (built when first read)."""
        return PoolView(self.env.now, lambda among: self.router_state(req, among),
                        self.prefill_pool, self.decode_pool)

    def _decisions(self):
        """The DisaggregationDecision process: take the next admitted request, decide, split
        it into a parent and its prefill sub-request (to the prefill pool) or send it to
        local routing."""
        env = self.env
        get = self.decision_inbox.get
        decider = self.decider
        while True:
            req = yield get()
            now_us = env.now
            if decider.reads_pools:
                split = decider.decide(req, self.pool_view(req))
            else:
                split = decider.decide(req)
            if self.trace is not None:
                self.trace.record_disaggregation(req, now_us, split)
            lat = self.routing_latency_us
            if not split:             # local routing, inline when nothing could come before it
                env.call_after(lat, ROUTING, self._on_local_routing, req)
                continue
            parent = ParentRequest(req.id, req, num_kv_blocks=ceil_div(req.input_len, self.block_size),
                                   arrival_us=req.arrival_us)
            self.parents[req.id] = parent
            req.prompt_block_hashes(self.block_size)   # hashed once for both sub-requests
            sub = Request(parent.prefill_sub_id, req.arrival_us, req.tokens[: req.input_len], (),
                          max_output_len=req.max_output_len, deadline_us=req.deadline_us,
                          tenant_id=req.tenant_id, slo_class=req.slo_class, model=req.model,
                          prefix_group=req.prefix_group, prefix_length=req.prefix_length)
            _share_hashes(req, sub)
            parent.prefill_sub = sub
            self.prefill_inbox.hand_on(now_us + lat, parent)

    def _on_local_routing(self, req) -> None:
        if self.gateway is not None:
            self.gateway.routed()
        if self.local_routing == "all":
            inst = self.route(req, None, self.router)
        else:
            inst = self.route(req, self.decode_pool, self.decode_router)
        if inst is not None and self.decider.stateful:
            self.decider.observe(req, inst.index)

    # ------------------------------------------------------------------ prefill pool
    def _prefill_pool(self):
        """The prefill pool: take the next parent, route its prefill sub-request to a
        prefill instance (or reject it at routing)."""
        env = self.env
        get = self.prefill_inbox.get
        while True:
            parent: ParentRequest = yield get()
            sub = parent.prefill_sub
            chosen = self.choose(sub, self.prefill_pool, self.prefill_router, what="prefill sub-request")
            gateway = self.gateway
            if gateway is not None:
                gateway.routed()
            if chosen is None:                  # a rejection at routing (disaggregation.md)
                _drop_hashes(parent.original)
                self.counters.rejected_at_routing += 1
                if gateway is not None:
                    gateway.left(parent.original)
                if self.sessions is not None:
                    self.session_rejected(parent.original)
                continue
            inst, state, decision = chosen
            now_us = env.now
            parent.prefill_instance = inst.id
            parent.prefill_enqueue_us = now_us
            self._placed("prefill", parent, sub, inst, state, decision)
            self.prefill_routed += 1
            inst.inject(sub, now_us)
            self.tell_router(self.prefill_router, sub, inst.index)
            if self.decider.stateful:
                self.decider.observe(sub, inst.index)

    # ------------------------------------------------------------------ decode pool
    def _decode_pool(self):
        """The decode pool: take the next finished KV transfer, make the parent's decode
        sub-request and route it to a decode instance with its prompt's KV pre-allocated
        (or drop the parent there)."""
        env = self.env
        get = self.decode_inbox.get
        while True:
            transfer = yield get()
            parent: ParentRequest = transfer.parent
            now_us = env.now
            parent.transfer_complete_us = transfer.complete_us
            sender = self._index_of[parent.prefill_instance]
            self.kv_sending[sender] -= 1
            if self.on_kv_sent is not None:
                self.on_kv_sent(sender)
            req = parent.original
            sub = Request(parent.decode_sub_id, req.arrival_us, req.tokens[: req.input_len],
                          req.tokens[req.input_len:], max_output_len=req.max_output_len,
                          deadline_us=req.deadline_us, tenant_id=req.tenant_id,
                          slo_class=req.slo_class, model=req.model, prefix_group=req.prefix_group,
                          prefix_length=req.prefix_length, is_decode_sub=True)
            _share_hashes(req, sub)
            _drop_hashes(req)
            # the server's clock of the parent started where its prefill's did (a front end
            # moves it to the hand-over to the prefill engine, docs/frontend.md)
            sub.origin_us = req.origin_us = parent.prefill_sub.origin_us
            parent.decode_sub = sub
            chosen = self.choose(sub, self.decode_pool, self.decode_router, what="decode sub-request")
            if self.gateway is not None:        # out of the transfer: held by an instance or ended
                self.gateway.routed()
            if chosen is None:
                self._drop_at_decode(parent, now_us, "no decode instance")
                continue
            inst, state, decision = chosen
            sub.pi = 0
            if sub.input_len and not inst.kv.allocate(sub, 0, sub.input_len):
                self._drop_at_decode(parent, now_us, f"{inst.id} has no KV room for its prompt")
                continue
            sub.pi = sub.input_len
            parent.decode_instance = inst.id
            parent.decode_enqueue_us = now_us
            if self.trace is not None:
                self.trace.record_kv_transfer(parent)
            self._placed("decode", parent, sub, inst, state, decision)
            self.decode_injected += 1
            inst.inject_decode(sub, now_us)
            self.tell_router(self.decode_router, sub, inst.index)

    def _placed(self, role: str, parent: ParentRequest, sub, inst, state, decision) -> None:
        """``parent``'s ``role`` sub-request goes to ``inst``: trace it, wait for it, count it
        in flight."""
        if self.trace is not None:
            self.trace.record_pool_routing(role, parent.id, state, decision, inst.id)
        pending = self.pending_prefill if role == "prefill" else self.pending_decode
        pending[sub.id] = parent
        self.inflight[inst.index] += 1

    def _drop_at_decode(self, parent: ParentRequest, now_us: int, why: str) -> None:
        tally.note(log, "dropped at decode routing", why, parent.id)   # one line per cause
        self.dropped_at_decode_kv += 1
        parent.completion_us = now_us
        self._parent_failed(parent, now_us, DROPPED)

    # ------------------------------------------------------------------ detection
    def on_request_done(self, inst, req, tick_us: int) -> None:
        super().on_request_done(inst, req, tick_us)
        rid = req.id
        if rid in self.pending_prefill:
            if req.state == COMPLETED:
                self._prefill_done.append((rid, tick_us))
                self.kv_sending[inst.index] += 1
                if self.gateway is not None:    # its parent is on no instance until decode
                    self.gateway.transferring()
            else:                              # timed out or dropped on the prefill pool
                self._parent_failed(self.pending_prefill[rid], tick_us, req.state)
        elif rid in self.pending_decode:
            if req.state == COMPLETED:
                self._decode_done.append((rid, tick_us))
            else:
                self._parent_failed(self.pending_decode[rid], tick_us, req.state)

    #: on_event_end acts only on sub-requests that left an instance (on_request_done)
    quiet_steps = True

    def on_event_end(self, inst) -> None:
        """After each instance event: detect finished prefills and decodes (docs/disaggregation.md)."""
        now_us = self.env.now
        if self._prefill_done:
            fabric = self.fabric
            done, self._prefill_done = sorted(self._prefill_done), []
            for rid, tick in done:
                parent = self.pending_prefill.pop(rid)
                self.prefill_completed += 1
                if self.transfer_at_step_end and tick > now_us:
                    parent.prefill_complete_us = parent.transfer_start_us = tick
                    fabric.inbox.put_at(tick, (parent, self._kv_bytes(parent)))
                else:
                    parent.prefill_complete_us = parent.transfer_start_us = now_us
                    fabric.inbox.deliver((parent, self._kv_bytes(parent)))
        if self._decode_done:
            done, self._decode_done = sorted(self._decode_done), []
            for rid, tick in done:
                parent = self.pending_decode.pop(rid)
                # BLIS: detection time = start of the last decode step; ours: its end
                parent.completion_us = tick if self.transfer_at_step_end else now_us
                self.decode_completed += 1
                if self.on_parent_done is not None or self.gateway is not None:
                    orig = parent.original
                    orig.state = COMPLETED
                    orig.pi = parent.decode_sub.pi
                    self._parent_ended(orig, tick)

    def _kv_bytes(self, parent: ParentRequest) -> float:
        """Bytes of ``parent``'s prompt KV the fabric moves: whole blocks × block size ×
        KV bytes per token."""
        return parent.num_kv_blocks * self.block_size * self.kv_bytes_per_token

    def _parent_failed(self, parent: ParentRequest, tick_us: int, state: int) -> None:
        """A sub-request timed out or was dropped: the parent ends in that state."""
        _drop_hashes(parent.original)
        if self.on_parent_done is not None or self.gateway is not None:
            parent.original.state = state
            self._parent_ended(parent.original, tick_us)

    def _parent_ended(self, orig, tick_us: int) -> None:
        """A disaggregated request ended (completed, timed out or dropped) at ``tick_us``: the
        gateway queue has one in flight fewer, and closed-loop sessions hear of it."""
        if self.gateway is not None:
            self.gateway.left(orig)
        if self.on_parent_done is not None:
            self.on_parent_done(orig, tick_us)


def _share_hashes(src, dst) -> None:
    """Sub-requests have the parent's prompt: reuse its block hashes if already computed."""
    dst.share_prompt_hashes(src)


def _drop_hashes(req) -> None:
    """The parent's prompt hashes are no longer needed (both sub-requests have them, or it
    failed): a kept parent does not hold them to the end of the run."""
    req.drop_prompt_hashes()


# ---------------------------------------------------------------------------- building
def build_pd_cluster(env, instances, admission, router, layout, scenario, rng, block_size: int,
                     *, cluster_class: type[PDCluster] | None = None, fabric_class=None,
                     **kw) -> PDCluster:
    """A :class:`PDCluster` for a resolved :class:`~blis_simpy.deploy.pools.PoolLayout`.

    ``cluster_class`` (a :class:`PDCluster` subclass) and ``fabric_class`` (a
    :class:`~blis_simpy.disagg.fabric.KVTransferFabric` subclass) replace the built-in ones.

    Pool routers: a pool's own router config (``--prefill/--decode-routing-scorers``) with
    RNG stream ``prefill-router`` / ``decode-router``; otherwise its own instance of the main
    policy on that stream — or, under compat ``checkout``, the main policy object itself
    (divergences.md P2: one shared round-robin counter).
    """

    def pool_router(role: str):
        cfg = layout.routing_for(role)
        if cfg is not None:
            return build_router(scenario, rng, block_size, stream=f"{role}-router", cfg=cfg,
                                field=f"disaggregation.{role}_pool.routing")
        if layout.shares_main_router:
            return router
        return build_router(scenario, rng, block_size, stream=f"{role}-router")

    decider = make_decider(layout.decider, dict(layout.decider_params), block_size=block_size,
                           field="disaggregation.decider")
    fabric_class = fabric_class or KVTransferFabric
    fabric = fabric_class(env, bandwidth_gbps=layout.bandwidth_gbps, base_latency_ms=layout.base_latency_ms,
                          contention=layout.contention, on_complete=None)
    roles = ["" if r not in ("prefill", "decode") else r for r in layout.roles]
    cluster_class = cluster_class or PDCluster
    cluster = cluster_class(env, instances, admission, router, roles=roles, decider=decider,
                            fabric=fabric, kv_bytes_per_token=layout.kv_bytes_per_token,
                            block_size=block_size, prefill_router=pool_router("prefill"),
                            decode_router=pool_router("decode"), local_routing=layout.local_routing,
                            transfer_at_step_end=not layout.checkout, **kw)
    cluster.on_parent_done = cluster.session_done
    return cluster


def finish_pd(cluster: PDCluster, metrics, layout, *, client_instances=frozenset()):
    """End of a PD run: check the PD invariants, then the corrected, parent-projected
    cluster record and the PD metrics (docs/disaggregation.md, "End-of-run accounting").
    ``client_instances``: the IDs of the instances whose front end measured at the client."""

    check_pd_invariants(cluster)
    agg = aggregate(metrics)
    parents = list(cluster.parents.values())
    ttfts = correct_and_project(
        agg, parents, prefill_completed=cluster.prefill_completed,
        decode_completed=cluster.decode_completed,
        dropped_at_decode_kv=cluster.dropped_at_decode_kv,
        pending_decode=len(cluster.pending_decode),
        compat="checkout" if layout.checkout_parent_timing else "fixed",
        client_instances=client_instances)
    done = {role: sum(m.completed_requests for m, r in zip(metrics, cluster.roles, strict=True)
                      if r == role) for role in ("prefill", "decode")}
    fabric = cluster.fabric
    pd = pd_metrics(parents, ttfts, prefill_done=done["prefill"], decode_done=done["decode"],
                    sim_ended_us=agg.sim_ended_time, fabric=fabric,
                    contention=layout.contention != "none")
    if fabric.corrupted:
        raise InvariantError("KV-transfer contention bookkeeping corrupted (active count went negative)")
    if fabric.active:
        log.warning("%d KV transfers still in flight at the end (cut by the horizon)", fabric.active)
    return agg, pd


def check_pd_invariants(cluster: PDCluster) -> None:
    """INV-PD-1/2/3/4 over every parent."""
    fabric = cluster.fabric
    if fabric.transfers_initiated != fabric.transfers_completed + fabric.active:
        raise InvariantError(f"INV-PD-3: {fabric.transfers_initiated} transfers started, "
                             f"{fabric.transfers_completed} completed, {fabric.active} in flight")
    roles = {inst.id: r for inst, r in zip(cluster.instances, cluster.roles, strict=True)}
    for p in cluster.parents.values():
        if p.prefill_instance and roles[p.prefill_instance] != "prefill":
            raise InvariantError("INV-PD-2: prefill sub-request outside the prefill pool",
                                 instance=p.prefill_instance, request=p.id)
        if p.decode_instance and roles[p.decode_instance] != "decode":
            raise InvariantError("INV-PD-2: decode sub-request outside the decode pool",
                                 instance=p.decode_instance, request=p.id)
        if p.decode_instance and p.decode_enqueue_us < p.transfer_complete_us:
            raise InvariantError("INV-PD-1: decode enqueued before its KV arrived", request=p.id)
        reached = [t for t in p.phase_times()[1:] if t > 0]
        if p.completed and (reached != sorted(reached) or reached[0] < p.arrival_us):
            raise InvariantError(f"INV-PD-4: phase times out of order {p.phase_times()}",
                                 request=p.id)
