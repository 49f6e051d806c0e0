"""End-of-run invariants (docs/determinism.md, "Invariants"): request conservation and causality.

Every run checks them; a violation raises :class:`~blis_simpy.errors.InvariantError`
naming the instance and request, so a broken run never prints plausible numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from blis_simpy.errors import InvariantError


@dataclass(frozen=True, slots=True)
class RequestEndStates:
    """Where every offered request is when the run ends (requests; PD runs count parents).

    The states are disjoint and, with ``offered``, balance (:func:`check_end_states`):
    ``completed`` + ``still_queued`` + ``still_running`` + ``still_in_control_plane``
    (arrived, inside the admission or routing latency) + ``still_in_queueing_delay`` (routed
    to an instance, inside its API server or its latency model's queueing delay) +
    ``not_arrived`` (arriving after the horizon) + ``dropped_unservable`` + ``timed_out`` + ``rejected_admission`` +
    ``rejected_routing`` = ``offered``; with a gateway queue, + ``still_in_gateway`` (queued at
    the end) + ``shed_gateway`` (shed by the queue). Without one those two are None and absent
    from :meth:`to_dict`.
    """

    offered: int
    completed: int
    still_queued: int
    still_running: int
    still_in_control_plane: int
    still_in_queueing_delay: int
    not_arrived: int
    dropped_unservable: int
    timed_out: int
    rejected_admission: int
    rejected_routing: int
    still_in_gateway: int | None = None
    shed_gateway: int | None = None

    def accounted(self) -> int:
        """The sum of every end state (``offered`` when the balance holds)."""
        return sum(v for k, v in self.to_dict().items() if k != "offered")

    def to_dict(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def check_end_states(end: RequestEndStates) -> None:
    """INV-1 as reported: every offered request is in exactly one end state."""
    if end.accounted() != end.offered:
        parts = " + ".join(f"{k.replace('_', ' ')} {v}" for k, v in end.to_dict().items()
                           if k != "offered")
        raise InvariantError(f"request conservation broken: offered {end.offered} != {parts}")


def check_instance_conservation(inst) -> None:
    """INV-1 per instance: every injected request is in exactly one end state."""
    m = inst.metrics
    accounted = (m.completed_requests + len(inst.waitq) + len(inst.running)
                 + m.dropped_unservable + m.timed_out_requests + inst.in_queueing_delay)
    if accounted != inst.injected:
        raise InvariantError(
            f"request conservation broken: injected {inst.injected} != completed "
            f"{m.completed_requests} + queued {len(inst.waitq)} + running {len(inst.running)} + "
            f"dropped {m.dropped_unservable} + timed out {m.timed_out_requests} + "
            f"in queueing delay {inst.in_queueing_delay}", instance=inst.id)


def check_pipeline_conservation(counters, instances, pending_in_control_plane: int, *,
                                pool_routed: int = 0, decode_injected: int = 0,
                                shed_gateway: int = 0) -> None:
    """INV-1 over the pipeline: offered = routed + rejected + shed by the gateway queue + not
    yet through the control plane (the gateway's queue included). With PD pools,
    ``pool_routed`` prefill sub-requests were routed in place of their parents and
    ``decode_injected`` decode sub-requests were injected after their transfer."""
    routed = counters.routed + pool_routed
    injected = sum(i.injected for i in instances)
    if injected != routed + decode_injected:
        raise InvariantError(f"routed {routed} (+{decode_injected} decode sub-requests) but "
                             f"instances saw {injected} injections")
    total = (routed + counters.rejected_by_admission + counters.rejected_at_routing
             + shed_gateway + pending_in_control_plane)
    if total != counters.offered:
        shed = f" + shed by the gateway {shed_gateway}" if shed_gateway else ""
        raise InvariantError(
            f"request conservation broken: offered {counters.offered} != routed {routed} "
            f"+ rejected at admission {counters.rejected_by_admission} + rejected at routing "
            f"{counters.rejected_at_routing}{shed} + still in the control plane {pending_in_control_plane}")


def check_gateway_conservation(gateway, admitted: int) -> None:
    """INV-1 at the gateway queue: every admitted request entered it, and each one it took is
    sent on, shed or still queued (``offered`` = ``dispatched`` + ``shed`` + ``queued``)."""
    c = gateway.counters
    if c.offered != admitted:
        raise InvariantError(f"the gateway took {c.offered} requests but {admitted} were admitted")
    if c.offered != c.dispatched + c.shed + c.queued or c.queued != len(gateway.entries()):
        raise InvariantError(
            f"gateway conservation broken: offered {c.offered} != dispatched {c.dispatched} + "
            f"shed {c.shed} + queued {c.queued} ({len(gateway.entries())} in its heaps)")


def check_causality(inst) -> None:
    """INV-5: arrival ≤ enqueue ≤ schedule ≤ first token ≤ completion, per request. The
    latencies count from the request's ``origin_us`` (its arrival, or its hand-over to the
    engine by a front end, docs/frontend.md), itself at or after its arrival."""
    m = inst.metrics
    for rid, req in m.registry.items():
        arr = req.arrival_us
        origin = req.origin_us
        enq = req.enqueue_us
        if origin < arr or (enq >= 0 and enq < origin):
            raise InvariantError(f"enqueued at {enq} before arrival {arr} (latencies from {origin})",
                                 instance=inst.id, request=rid)
        sd = m.scheduling_delay.get(rid)
        if sd is not None:
            if sd < 0 or (enq >= 0 and origin + sd < enq and not req.is_decode_sub):
                raise InvariantError(f"scheduled at {origin + sd} before enqueue {enq}",
                                     instance=inst.id, request=rid)
        e2e = m.e2e.get(rid)
        if e2e is None or req.is_decode_sub:
            # unfinished or timed out: later stamps may be partial; a PD decode sub-request
            # has no TTFT of its own (its parent's phases are checked, INV-PD-4)
            continue
        ttft = m.ttft.get(rid)
        if ttft is None or sd is None or not (sd < ttft <= e2e):
            raise InvariantError(
                f"causality broken: scheduled +{sd} us, first token +{ttft} us, "
                f"completed +{e2e} us after arrival {arr}", instance=inst.id, request=rid)


def check_autoscale(record, instances, dp: int) -> None:
    """INV-AS (docs/determinism.md): the autoscaler's spans of an instance lie in the run and
    do not overlap, an instance serves only after its loading delay, and every request an
    instance holds (its registry, when kept) was enqueued while it served or drained."""
    by_unit: dict[int, list[tuple[int, int, int]]] = {}
    for unit, start, serving, end in record.spans:
        where = f"instance_{unit}"
        if not 0 <= start <= end <= max(record.end_us, start):
            raise InvariantError(f"autoscaler span [{start}, {end}] us outside the run "
                                 f"(ends {record.end_us} us)", instance=where)
        delay = record.loading_delay_of(unit)
        if serving >= 0 and start > 0 and serving - start < delay:
            raise InvariantError(f"served from {serving} us, before its loading delay "
                                 f"({delay} us from {start} us) ended", instance=where)
        by_unit.setdefault(unit, []).append((start, serving, end))
    for unit, spans in by_unit.items():
        spans.sort()
        for (_, _, e0), (s1, _, _) in zip(spans, spans[1:], strict=False):
            if s1 < e0:
                raise InvariantError(f"autoscaler spans overlap at {s1} us", instance=f"instance_{unit}")
    for inst in instances:
        spans = by_unit.get(inst.index // dp, [])
        for rid, req in inst.metrics.registry.items():
            enq = req.enqueue_us
            if enq >= 0 and not any(0 <= serving <= enq <= end for _, serving, end in spans):
                raise InvariantError(f"enqueued at {enq} us while the instance was not serving",
                                     instance=inst.id, request=rid)
