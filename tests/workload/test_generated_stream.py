"""Generated workloads as a stream (workload/generated_stream.py; docs/performance.md,
"Very long runs"): the same requests as the list path, drawn as the iteration reaches them."""

from __future__ import annotations

import json

import pytest

from blis_simpy import run
from blis_simpy.metrics.report import render_json
from blis_simpy.workload import generated_stream
from blis_simpy.workload.generated_stream import GeneratedRequestStream, stream_workload
from blis_simpy.workload.generator import generate_requests
from tests.conftest import REPO
from tests.workload.test_workload_generator import GAUSS, client, spec

QUICKSTART = str(REPO / "scenarios" / "quickstart.yaml")


def _full(reqs):
    return [(r.id, r.arrival_us, r.client_id, r.tokens.tobytes(), r.output_len, r.deadline_us,
             r.prefix_group, r.prefix_length, r.tenant_id, r.slo_class) for r in reqs]


def test_two_constant_clients_hand_checked_ties_in_client_order():
    # 4 req/s split evenly: each client every 500,000 µs; ties keep client order; cut at 5
    s = spec(client("a", 1, "constant"), client("b", 1, "constant"), rate=4, num=5)
    stream = stream_workload(s)
    assert isinstance(stream, GeneratedRequestStream) and len(stream) == 5
    assert [(r.id, r.arrival_us, r.client_id) for r in stream] == [
        ("request_0", 500000, "a"), ("request_1", 500000, "b"), ("request_2", 1000000, "a"),
        ("request_3", 1000000, "b"), ("request_4", 1500000, "a")]


@pytest.mark.parametrize("kw", [
    {},                                                   # unbounded horizon: len = cap
    {"horizon": 1_500_000},                               # the horizon cuts: counted first
    {"seed": 3, "max_requests": 37},
])
def test_same_requests_as_the_list_path(kw):
    s = spec(client("a", 0.6, "gamma", 2.0, GAUSS, GAUSS, prefix_group="sys", prefix_length=16,
                    tenant_id="t1", slo_class="batch", timeout=2_000_000),
             client("b", 0.3, "weibull", 0.5),
             client("c", 0.1, "poisson", prefix_group="sys"), rate=100, num=150)
    listed = generate_requests(s, **kw)
    stream = stream_workload(s, **kw)
    assert len(stream) == len(listed)
    assert _full(stream) == _full(listed)
    assert _full(stream) == _full(listed)                 # each iteration generates them again
    if "horizon" in kw:
        assert len(listed) < 150 and stream.count_arriving_after(1_000_000) == sum(
            r.arrival_us > 1_000_000 for r in listed)


def test_lifecycle_windows_are_counted_not_assumed():
    windows = {"windows": [{"start_us": 0, "end_us": 200_000}, {"start_us": 600_000, "end_us": 700_000}]}
    s = spec(client("a", 1, "poisson", lifecycle=windows), client("b", 1, "constant"), rate=200, num=500)
    listed = generate_requests(s)
    stream = stream_workload(s)
    assert stream._len is None                            # a window may stop a client early
    assert _full(stream) == _full(listed) and len(stream) == len(listed)


def test_counting_draws_the_same_but_builds_no_request(monkeypatch):
    # len() of a horizon-bound stream walks the clients' draws (the count is what an
    # iteration yields) without building requests; the iteration after it is unchanged
    s = spec(client("a", 0.7, "poisson", prefix_group="sys", prefix_length=16),
             client("b", 0.3, "gamma", 2.0), rate=50, num=400)
    listed = generate_requests(s, horizon=3_000_000)
    stream = stream_workload(s, horizon=3_000_000)
    import blis_simpy.workload.generator as gen
    real = gen._new_request
    monkeypatch.setattr(gen, "_new_request", lambda *a, **k: pytest.fail("request built to count"))
    assert len(stream) == len(listed) < 400
    monkeypatch.setattr(gen, "_new_request", real)
    assert _full(stream) == _full(listed)


def test_lists_for_multi_turn_or_no_cap():
    mt = {"multi_turn": {"max_rounds": 2, "think_time_us": 10}}
    assert stream_workload(spec(client("a", reasoning=mt))) is None
    assert stream_workload(spec(client("a"), num=0), horizon=1_000_000) is None


@pytest.mark.parametrize("extra", [
    {"workload.arrival": "poisson"},
    {"horizon_us": 3_000_000, "workload.prefix_tokens": 32, "cluster.num_instances": 2},
])
def test_run_streamed_equals_run_listed(monkeypatch, extra):
    overrides = {"workload.rate": 40, "workload.num_requests": 120, "seed": 5, **extra}
    streamed = run.execute(run.prepare(QUICKSTART, overrides))
    assert isinstance(streamed.requests, GeneratedRequestStream)
    monkeypatch.setattr(generated_stream, "stream_workload", lambda *a, **k: None)
    listed = run.execute(run.prepare(QUICKSTART, overrides))
    assert isinstance(listed.requests, list)
    a, b = json.loads(render_json(streamed.report)), json.loads(render_json(listed.report))
    assert a == b and a["cluster"]["completed_requests"] > 0
