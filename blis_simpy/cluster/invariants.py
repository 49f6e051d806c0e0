"""End-of-run invariants (docs/determinism.md, "Invariants"): request conservation and causality.

Every run checks them; a violation raises :class:`~blis_simpy.errors.InvariantError`
naming the instance and request, so a broken run never prints plausible numbers.
"""

from __future__ import annotations

from blis_simpy.errors import InvariantError


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
                                pool_routed: int = 0, decode_injected: int = 0) -> None:
    """INV-1 over the pipeline: offered = routed + rejected + not yet through the control
    plane. With PD pools, ``pool_routed`` prefill sub-requests were routed in place of their
    parents and ``decode_injected`` decode sub-requests were injected after their transfer."""
    routed = counters.routed + pool_routed
    injected = sum(i.injected for i in instances)
    if injected != routed + decode_injected:
        raise InvariantError(f"routed {routed} (+{decode_injected} decode sub-requests) but "
                             f"instances saw {injected} injections")
    total = (routed + counters.rejected_by_admission + counters.rejected_at_routing
             + pending_in_control_plane)
    if total != counters.offered:
        raise InvariantError(
            f"request conservation broken: offered {counters.offered} != routed {routed} "
            f"+ rejected at admission {counters.rejected_by_admission} + rejected at routing "
            f"{counters.rejected_at_routing} + still in the control plane {pending_in_control_plane}")


def check_causality(inst) -> None:
    """INV-5: arrival ≤ enqueue ≤ schedule ≤ first token ≤ completion, per request."""
    m = inst.metrics
    for rid, req in m.registry.items():
        arr = req.arrival_us
        enq = req.enqueue_us
        if enq >= 0 and enq < arr:
            raise InvariantError(f"enqueued at {enq} before arrival {arr}", instance=inst.id, request=rid)
        sd = m.scheduling_delay.get(rid)
        if sd is not None:
            if sd < 0 or (enq >= 0 and arr + sd < enq and not req.is_decode_sub):
                raise InvariantError(f"scheduled at {arr + sd} before enqueue {enq}",
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
