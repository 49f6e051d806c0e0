"""End-of-run PD accounting: count each parent once, report per parent
(docs/disaggregation.md, "End-of-run accounting").

Instances see sub-requests: a disaggregated request completes twice (its prefill on the
prefill pool, its decode on the decode pool). After aggregation the cluster record is
corrected so each parent counts once (INV-1), and every per-request map is *projected* to
parent IDs: the ``_prefill`` / ``_decode`` entries go, a completed parent gets one entry
(INV-PD-6). Two definitions of a parent's TTFT and E2E (µs, relative to arrival):

* ``fixed`` (default; the upstream fix, divergences.md P3) — what the client sees from the decode
  instance: TTFT = decode scheduling delay + first decode ITL; E2E = decode scheduling delay
  + the decode sub-request's own E2E (its ITLs and post-decode overhead).
* ``checkout`` (BLIS parity) — TTFT = the prefill sub-request's TTFT; E2E = detection time of
  the decode completion − arrival (the *start* of the last decode step, so it can be shorter
  than one decode step).

With a front end measuring at the client on the decode instance (docs/frontend.md), the
decode sub-request's maps already hold the client's figures from the parent's arrival: its
TTFT (its first token at the client) and E2E are the parent's. Server-side figures count
from the request's ``origin_us`` (its arrival, or where a front end handed it to the engine).
"""

from __future__ import annotations

import logging

from blis_simpy.disagg.parent import ParentRequest
from blis_simpy.metrics.percentile import Distribution
from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.metrics.report import FLOAT_MAX, PDMetrics

log = logging.getLogger("blis_simpy.disagg")

_MAPS = ("ttft", "itl", "scheduling_delay", "e2e", "completion_time", "registry")


def correct_and_project(agg: InstanceMetrics, parents: list[ParentRequest], *,
                        prefill_completed: int, decode_completed: int, dropped_at_decode_kv: int,
                        pending_decode: int, compat: str = "fixed",
                        client_instances=frozenset()) -> dict[str, int]:
    """Correct ``agg`` in place and project its maps to parents; returns each completed
    parent's projected TTFT (µs), for the PD metrics. ``client_instances``: IDs of the
    instances whose front end measured at the client (module docstring)."""
    agg.completed_requests -= prefill_completed
    agg.dropped_unservable += dropped_at_decode_kv
    in_transfer = prefill_completed - decode_completed - dropped_at_decode_kv - pending_decode
    if in_transfer > 0:
        agg.still_running += in_transfer        # in KV transfer or decode routing at the horizon
    elif in_transfer < 0:
        log.warning("PD bookkeeping: %d more parents finished than prefills completed", -in_transfer)

    maps = [getattr(agg, name) for name in _MAPS]
    ttfts: dict[str, int] = {}
    for parent in sorted(parents, key=lambda p: p.id):
        pid, did = parent.prefill_sub_id, parent.decode_sub_id
        pre = {name: m.pop(pid, None) for name, m in zip(_MAPS, maps, strict=True)}
        dec = {name: m.pop(did, None) for name, m in zip(_MAPS, maps, strict=True)}
        if not parent.completed:
            continue
        orig = parent.original
        if compat == "checkout":
            e2e = parent.completion_us - parent.arrival_us
            if e2e < 0:
                log.error("parent %s completes before it arrives; skipped", parent.id)
                continue
            ttft = pre["ttft"]
            if ttft is None:
                log.warning("parent %s has no prefill TTFT", parent.id)
            completion = parent.completion_us
        elif parent.decode_instance in client_instances:
            ttft = dec["ttft"]
            e2e = dec["e2e"] or 0
            completion = orig.arrival_us + e2e
        else:
            sd = dec["scheduling_delay"] or 0
            sub = parent.decode_sub
            if sub.ttft_set:
                # it recorded an arrival-relative TTFT of its own: no output (its tokenless
                # step's end), or recomputed from scratch after a preemption on the decode
                # instance; its engine E2E is then the parent's
                ttft = dec["ttft"] if dec["ttft"] is not None else dec["e2e"]
                e2e = dec["e2e"] or 0
            else:
                ttft = sd + sub.first_itl_us
                e2e = sd + (dec["e2e"] or 0)      # its ITLs and post-decode overhead
            completion = orig.origin_us + e2e
        agg.e2e[parent.id] = e2e
        if ttft is not None:
            agg.ttft[parent.id] = ttft
            ttfts[parent.id] = ttft
        if pre["scheduling_delay"] is not None:
            agg.scheduling_delay[parent.id] = pre["scheduling_delay"]
        if dec["itl"] is not None:
            agg.itl[parent.id] = dec["itl"]
        agg.completion_time[parent.id] = completion
        orig.assigned_instance = parent.decode_instance
        agg.registry[parent.id] = orig
    return ttfts


def pd_metrics(parents: list[ParentRequest], ttfts: dict[str, int], *, prefill_done: int,
               decode_done: int, sim_ended_us: int, fabric=None, contention: bool = False
               ) -> PDMetrics | None:
    """The ``=== PD Metrics ===`` figures (docs/disaggregation.md, "PD metrics"); None when no parent exists.

    ``prefill_done`` / ``decode_done``: completed requests of the prefill / decode pool
    instances (sub-requests plus any local requests that ran there).
    """
    if not parents:
        return None
    ps = sorted(parents, key=lambda p: p.id)
    disagg = [p for p in ps if p.transfer_complete_us > 0]
    seconds = sim_ended_us / 1e6
    pre_tp = prefill_done / seconds if seconds > 0 else 0.0
    dec_tp = decode_done / seconds if seconds > 0 else 0.0
    if pre_tp == 0 and dec_tp == 0:
        ratio = 1.0
    elif pre_tp == 0 or dec_tp == 0:
        ratio = FLOAT_MAX
    else:
        ratio = max(pre_tp, dec_tp) / min(pre_tp, dec_tp)
    durations = [p.transfer_complete_us - p.transfer_start_us for p in ps
                 if p.transfer_start_us > 0 and p.transfer_complete_us >= p.transfer_start_us]
    m = PDMetrics(
        disaggregated_count=len(disagg),
        dropped_at_decode_kv=sum(1 for p in disagg if not p.decode_instance),
        prefill_throughput=pre_tp, decode_throughput=dec_tp, load_imbalance_ratio=ratio,
        parent_ttft=Distribution.from_values([ttfts[p.id] for p in ps if ttfts.get(p.id, 0) > 0]),
        transfer_duration=Distribution.from_values(durations),
        contention=contention)
    if contention and fabric is not None:
        m.peak_concurrent_transfers = fabric.peak_concurrent
        m.mean_transfer_queue_depth = fabric.mean_queue_depth
    return m
