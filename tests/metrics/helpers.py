"""Builders for hand-made metrics records and readers for the conformance cases."""

from __future__ import annotations

import csv
import json
from collections import Counter, OrderedDict
from pathlib import Path

from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.request import Request
from tests.conftest import conformance_case


def req(rid: str, arrival_us: int, n_in: int = 4, n_out: int = 3, **kw) -> Request:
    r = Request(rid, arrival_us, [0] * n_in, [1] * n_out,
                **{k: v for k, v in kw.items() if k != "assigned_instance"})
    r.assigned_instance = kw.get("assigned_instance", "")
    return r


def instance(instance_id: str = "instance_0", *, requests=(), ttft=None, e2e=None, itl=None,
             sched=None, all_itls=None, **counters) -> InstanceMetrics:
    m = InstanceMetrics(instance_id=instance_id, **counters)
    m.registry = {r.id: r for r in requests}
    m.ttft = dict(ttft or {})
    m.e2e = dict(e2e or {})
    m.itl = dict(itl or {})
    m.scheduling_delay = dict(sched or {})
    m.all_itls = Counter(all_itls or {})
    return m


def case_dir(name: str) -> Path:
    return conformance_case(name)


def load_expected(name: str) -> OrderedDict:
    with open(case_dir(name) / "expected.json") as fh:
        return json.load(fh, object_pairs_hook=OrderedDict)


def trace_rows(name: str) -> dict[str, dict]:
    """``request_<id>`` → the trace.csv row."""
    with open(case_dir(name) / "trace.csv", newline="") as fh:
        return {f"request_{r['request_id']}": r for r in csv.DictReader(fh)}


def _counters_from_block(block) -> dict:
    sim = round(block["vllm_estimated_duration_s"] * 1e6)
    assert float(sim) / 1e6 == block["vllm_estimated_duration_s"]
    return dict(completed_requests=block["completed_requests"],
                still_queued=block["still_queued"], still_running=block["still_running"],
                total_input_tokens=block["total_input_tokens"],
                total_output_tokens=block["total_output_tokens"], sim_ended_time=sim,
                preemption_count=block["preemption_count"],
                dropped_unservable=block["dropped_unservable"],
                length_capped_requests=block["length_capped_requests"],
                timed_out_requests=block["timed_out_requests"],
                kv_allocation_failures=block.get("kv_allocation_failures", 0))


def from_replay_case(name):
    exp = load_expected(name)
    block = exp["stdout_metrics"][-1]
    trace = trace_rows(name)
    reqs = []
    ttft, e2e = {}, {}
    for r in exp["results"]:
        rid = f"request_{r['request_id']}"
        reqs.append(req(rid, int(trace[rid]["arrival_time_us"]), r["input_tokens"],
                        r["output_tokens"], slo_class=trace[rid]["slo_class"]))
        ttft[rid] = r["ttft_us"]
        e2e[rid] = r["e2e_us"]
    return exp, block, instance("cluster", requests=reqs, ttft=ttft, e2e=e2e,
                                **_counters_from_block(block))


def from_rows_case(name):
    exp = load_expected(name)
    block = exp["stdout_metrics"][-1]
    trace = trace_rows(name)
    reqs, ttft, e2e, itl, sched = [], {}, {}, {}, {}
    for r in exp["results"]["requests"]:
        rid = r["requestID"]
        reqs.append(req(rid, int(trace[rid]["arrival_time_us"]), r["num_prefill_tokens"],
                        r["num_decode_tokens"], slo_class=r.get("slo_class", ""),
                        tenant_id=r.get("tenant_id", ""), model=r.get("model", ""),
                        assigned_instance=r.get("handled_by", "")))
        if r["ttft_ms"]:
            ttft[rid] = round(r["ttft_ms"] * 1000)
        if r["e2e_ms"]:
            e2e[rid] = round(r["e2e_ms"] * 1000)
        itl[rid] = r["itl_ms"] * 1000
        sched[rid] = round(r["scheduling_delay_ms"] * 1000)
    return exp, block, instance("cluster", requests=reqs, ttft=ttft, e2e=e2e, itl=itl,
                                sched=sched, **_counters_from_block(block))
