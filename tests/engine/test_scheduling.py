"""Wait-queue priority policies and schedulers (docs/engine.md)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blis_simpy.engine.scheduling import (
    FCFS,
    SJF,
    ConstantPriority,
    InvertedSLOPriority,
    PriorityFCFS,
    PriorityPolicy,
    ReversePriority,
    Scheduler,
    SLOBasedPriority,
)
from blis_simpy.errors import ConfigError
from blis_simpy.request import Request
from tests.engine.helpers import make_requests, run, scenario


def _r(rid, arrival=0, n_in=1, prio=0.0):
    r = Request(rid, arrival, [1] * n_in, [2])
    r.priority = prio
    return r


def _ids(q):
    return [r.id for r in q]


# ---------------------------------------------------------------------------- priority policies
def test_constant_priority_is_zero_and_flagged_constant():
    p = ConstantPriority()
    assert p.priority(_r("a", arrival=5), 1_000_000) == 0.0
    assert ConstantPriority.constant is True
    assert SLOBasedPriority.constant is False and InvertedSLOPriority.constant is False


def test_slo_based_priority_is_age_in_seconds():
    p = SLOBasedPriority()
    # age 2 000 000 µs = 2.0 s
    assert p.priority(_r("a", arrival=500_000), 2_500_000) == 2.0
    # age 1500 µs = 0.0015 s
    assert p.priority(_r("a", arrival=1000), 2500) == pytest.approx(0.0015, rel=1e-15)
    assert p.priority(_r("a", arrival=7), 7) == 0.0
    # older is larger
    assert p.priority(_r("old", arrival=0), 10) > p.priority(_r("new", arrival=5), 10)


def test_slo_based_priority_ignores_slo_class():
    a = Request("a", 100, [1], [1], slo_class="critical")
    b = Request("b", 100, [1], [1], slo_class="batch")
    assert SLOBasedPriority().priority(a, 900) == SLOBasedPriority().priority(b, 900)


def test_inverted_slo_priority_is_negative_age():
    p = InvertedSLOPriority()
    assert p.priority(_r("a", arrival=500_000), 2_500_000) == -2.0
    assert p.priority(_r("a", arrival=1000), 2500) == pytest.approx(-0.0015, rel=1e-15)
    # younger is larger
    assert p.priority(_r("new", arrival=5), 10) > p.priority(_r("old", arrival=0), 10)


@given(st.integers(0, 10**12), st.integers(0, 10**12))
def test_slo_and_inverted_are_exact_negatives(arrival, age):
    r = _r("a", arrival=arrival)
    now = arrival + age
    s = SLOBasedPriority().priority(r, now)
    assert InvertedSLOPriority().priority(r, now) == -s
    assert s == 1e-6 * age


# ---------------------------------------------------------------------------- schedulers
def test_fcfs_keeps_order_including_preempted_at_front():
    # a preempted request was pushed to the front although it arrived last
    q = deque([_r("request_7", arrival=700), _r("request_1", arrival=100), _r("request_3", arrival=300)])
    FCFS().reorder(q, 10_000)
    assert _ids(q) == ["request_7", "request_1", "request_3"]
    assert FCFS.keeps_order is True
    for cls in (PriorityFCFS, SJF, ReversePriority):
        assert cls.keeps_order is False


def test_priority_fcfs_priority_descending_then_arrival_then_id():
    q = deque([
        _r("request_2", arrival=20, prio=1.0),
        _r("request_9", arrival=10, prio=1.0),     # same priority+arrival as request_10
        _r("request_0", arrival=0, prio=0.5),
        _r("request_10", arrival=10, prio=1.0),
        _r("request_5", arrival=50, prio=3.0),
    ])
    PriorityFCFS().reorder(q, 0)
    # 3.0 first; then priority 1.0 by arrival 10,10,20 with "request_10" < "request_9" as strings
    assert _ids(q) == ["request_5", "request_10", "request_9", "request_2", "request_0"]


def test_sjf_input_length_then_arrival_then_id():
    q = deque([
        _r("request_1", arrival=10, n_in=50),
        _r("request_9", arrival=30, n_in=20),
        _r("request_3", arrival=40, n_in=5),
        _r("request_10", arrival=30, n_in=20),
        _r("request_4", arrival=5, n_in=20),
    ])
    SJF().reorder(q, 0)
    assert _ids(q) == ["request_3", "request_4", "request_10", "request_9", "request_1"]


def test_sjf_ignores_priority_and_output_length():
    a = Request("a", 0, [1] * 10, [1] * 1)
    b = Request("b", 0, [1] * 5, [1] * 1000)
    a.priority, b.priority = 100.0, -100.0
    q = deque([a, b])
    SJF().reorder(q, 0)
    assert _ids(q) == ["b", "a"]


def test_reverse_priority_ascending_then_arrival_then_id():
    q = deque([
        _r("request_5", arrival=50, prio=3.0),
        _r("request_9", arrival=10, prio=1.0),
        _r("request_0", arrival=0, prio=0.5),
        _r("request_10", arrival=10, prio=1.0),
        _r("request_2", arrival=5, prio=1.0),
    ])
    ReversePriority().reorder(q, 0)
    assert _ids(q) == ["request_0", "request_2", "request_10", "request_9", "request_5"]


@pytest.mark.parametrize("cls", [PriorityFCFS, SJF, ReversePriority])
def test_sorts_are_stable_on_full_ties(cls):
    # identical keys (same id, arrival, length, priority): the original order must be kept
    reqs = [_r("dup", arrival=1, n_in=3, prio=1.0) for _ in range(6)]
    q = deque(reqs)
    cls().reorder(q, 0)
    assert [id(r) for r in q] == [id(r) for r in reqs]


@pytest.mark.parametrize(("cls", "key"), [
    (PriorityFCFS, lambda r: (-r.priority, r.arrival_us, r.id)),
    (SJF, lambda r: (r.input_len, r.arrival_us, r.id)),
    (ReversePriority, lambda r: (r.priority, r.arrival_us, r.id)),
])
@given(data=st.data())
def test_reorder_is_a_sorted_permutation(cls, key, data):
    n = data.draw(st.integers(0, 12))
    reqs = [_r(f"request_{data.draw(st.integers(0, 30))}",
               arrival=data.draw(st.integers(0, 5)),
               n_in=data.draw(st.integers(1, 4)),
               prio=data.draw(st.sampled_from([0.0, 0.5, 1.0, -1.0])))
            for _ in range(n)]
    q = deque(reqs)
    cls().reorder(q, 0)
    assert len(q) == n
    assert sorted(map(id, q)) == sorted(map(id, reqs))
    keys = [key(r) for r in q]
    assert keys == sorted(keys)
    # stability: among equal keys the input order is kept
    pos = {id(r): i for i, r in enumerate(reqs)}
    items = list(q)
    for a, b in zip(items[:-1], items[1:], strict=True):
        if key(a) == key(b):
            assert pos[id(a)] < pos[id(b)]


# ---------------------------------------------------------------------------- registries
def test_lookup_by_name_and_alias():
    assert Scheduler.lookup("fcfs") is FCFS
    assert Scheduler.lookup("") is FCFS
    assert Scheduler.lookup("priority-fcfs") is PriorityFCFS
    assert Scheduler.lookup("sjf") is SJF
    assert Scheduler.lookup("reverse-priority") is ReversePriority
    assert PriorityPolicy.lookup("constant") is ConstantPriority
    assert PriorityPolicy.lookup("") is ConstantPriority
    assert PriorityPolicy.lookup("slo-based") is SLOBasedPriority
    assert PriorityPolicy.lookup("inverted-slo") is InvertedSLOPriority


def test_unknown_scheduler_lists_valid_names():
    with pytest.raises(ConfigError) as ei:
        Scheduler.lookup("lifo", field="engine.scheduler")
    msg = str(ei.value)
    assert "'lifo'" in msg
    assert "engine.scheduler" in msg
    assert "fcfs, priority-fcfs, reverse-priority, sjf" in msg


def test_unknown_priority_policy_lists_valid_names():
    with pytest.raises(ConfigError) as ei:
        PriorityPolicy.lookup("slo")
    assert "constant, inverted-slo, slo-based" in str(ei.value)


@pytest.fixture
def clean_registries():
    before = (dict(PriorityPolicy._registry), dict(Scheduler._registry))
    yield
    PriorityPolicy._registry.clear()
    PriorityPolicy._registry.update(before[0])
    Scheduler._registry.clear()
    Scheduler._registry.update(before[1])


def test_custom_policy_and_scheduler_by_subclassing(clean_registries):
    class Oldest(PriorityPolicy, name="test-oldest"):
        def priority(self, req, now_us):
            return float(now_us - req.arrival_us)

    class LongestFirst(Scheduler, name="test-longest", aliases=("test-lf",)):
        def reorder(self, queue, now_us):
            items = sorted(queue, key=lambda r: -r.input_len)
            queue.clear()
            queue.extend(items)

    assert PriorityPolicy.lookup("test-oldest") is Oldest
    assert "test-oldest" in PriorityPolicy.names()
    assert Oldest().priority(_r("a", arrival=10), 25) == 15.0
    assert Scheduler.lookup("test-lf") is LongestFirst
    assert "test-longest" in Scheduler.names() and "test-lf" not in Scheduler.names()
    q = deque([_r("a", n_in=1), _r("b", n_in=3)])
    Scheduler.lookup("test-longest")().reorder(q, 0)
    assert _ids(q) == ["b", "a"]
    # the families stay separate
    with pytest.raises(ConfigError):
        Scheduler.lookup("test-oldest")


def test_registering_a_taken_name_fails(clean_registries):
    with pytest.raises(ValueError, match="already registered"):
        class Dup(Scheduler, name="sjf"):
            pass
    assert Scheduler.lookup("sjf") is SJF


# ---------------------------------------------------------------------------- in the engine
# One admission per step (max_num_running_reqs=1, every step takes 1000 µs, no queueing
# delay). R0 (2 output tokens) runs the steps at 0 (prefill) and 1000 (its one decode step;
# it completes there, after batch formation found the batch full). R1 (32 tokens, t=100),
# R2 (16 tokens, t=200) and R3 (48 tokens, t=300) have 1 output token each, so each finishes
# in its admission step; they are admitted at 2000, 3000, 4000 in scheduler order.
# scheduling_delay = admission time - arrival.
@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize(("sched", "policy", "order"), [
    ("fcfs", "constant", ["request_1", "request_2", "request_3"]),
    ("sjf", "constant", ["request_2", "request_1", "request_3"]),
    ("priority-fcfs", "constant", ["request_1", "request_2", "request_3"]),
    ("priority-fcfs", "slo-based", ["request_1", "request_2", "request_3"]),
    # youngest first, recomputed at every step: R3 at 1000, then R2 (younger than R1) at 2000
    ("priority-fcfs", "inverted-slo", ["request_3", "request_2", "request_1"]),
    ("reverse-priority", "slo-based", ["request_3", "request_2", "request_1"]),
    ("reverse-priority", "inverted-slo", ["request_1", "request_2", "request_3"]),
])
def test_engine_admits_in_scheduler_order(impl, sched, policy, order):
    reqs = make_requests([(0, 16, 2), (100, 32, 1), (200, 16, 1), (300, 48, 1)])
    sc = scenario(alpha=(0, 0, 0), beta=(1000, 0, 0), implementation=impl,
                  max_num_running_reqs=1, scheduler=sched, priority_policy=policy)
    m = run(sc, reqs).instances[0]
    arrival = {"request_1": 100, "request_2": 200, "request_3": 300}
    expected = {rid: 1000 * (k + 2) - arrival[rid] for k, rid in enumerate(order)}
    expected["request_0"] = 0
    assert m.scheduling_delay == expected
    assert m.completed_requests == 4
