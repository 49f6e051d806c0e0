"""The event order of :mod:`blis_simpy.des` must be BLIS's (docs/architecture.md).

BLIS: cluster heap and one heap per instance, each ordered by (time, priority, seq); at a
given time cluster events win, then the lowest instance index; one instance event is
processed at a time, so a cluster event created while processing an instance event at T
runs before that instance's remaining events at T.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_simpy.des import (
    ADMISSION,
    ARRIVAL,
    CLUSTER_ARRIVAL,
    DECODE_ROUTING,
    DISAGGREGATION,
    FOLLOWUP_ARRIVAL,
    KV_TRANSFER_COMPLETED,
    KV_TRANSFER_STARTED,
    PREFILL_ROUTING,
    QUEUED,
    REQUEST_LEFT,
    ROUTING,
    SCHEDULED,
    STEP,
    TIMEOUT,
    SimEnv,
    instance_key,
)
from blis_simpy.run.simulation import Simulation
from tests.des_support import run_through_horizon
from tests.engine.helpers import make_requests, scenario

# BLIS cluster priorities, in order
CLUSTER_KEYS = [CLUSTER_ARRIVAL, ADMISSION, ROUTING, DISAGGREGATION, PREFILL_ROUTING,
                KV_TRANSFER_STARTED, KV_TRANSFER_COMPLETED, DECODE_ROUTING]
INSTANCE_PRIOS = [ARRIVAL, QUEUED, STEP, SCHEDULED, REQUEST_LEFT, TIMEOUT]


def _env(horizon=10**9):
    return SimEnv(horizon)


def _logger(log, env):
    def fn(tag):
        log.append((env.now, tag))
    return fn


def test_blis_instance_priority_numbers():
    assert (ARRIVAL, QUEUED, STEP, SCHEDULED, REQUEST_LEFT, TIMEOUT) == (0, 1, 2, 3, 4, 5)


def test_cluster_events_before_instance_events_at_equal_time():
    env = _env()
    log = []
    f = _logger(log, env)
    # instance events pushed first, with the smallest instance priority
    env.call_at(100, instance_key(0, ARRIVAL), f, "inst0-arrival")
    env.call_at(100, instance_key(3, ARRIVAL), f, "inst3-arrival")
    env.call_at(100, DECODE_ROUTING, f, "decode-routing")       # largest cluster priority
    env.call_at(100, CLUSTER_ARRIVAL, f, "arrival")
    env.call_at(99, instance_key(5, TIMEOUT), f, "earlier-instance")
    run_through_horizon(env)
    assert log == [(99, "earlier-instance"), (100, "arrival"), (100, "decode-routing"),
                   (100, "inst0-arrival"), (100, "inst3-arrival")]


def test_cluster_priorities_in_blis_order():
    env = _env()
    log = []
    f = _logger(log, env)
    for k in reversed(CLUSTER_KEYS):
        env.call_at(7, k, f, k)
    run_through_horizon(env)
    assert [tag for _, tag in log] == CLUSTER_KEYS


def test_lower_instance_index_first_whatever_the_priority():
    env = _env()
    log = []
    f = _logger(log, env)
    env.call_at(50, instance_key(2, ARRIVAL), f, "i2-arrival")
    env.call_at(50, instance_key(1, TIMEOUT), f, "i1-timeout")
    env.call_at(50, instance_key(0, TIMEOUT), f, "i0-timeout")
    env.call_at(50, instance_key(10, ARRIVAL), f, "i10-arrival")
    env.call_at(50, instance_key(1, ARRIVAL), f, "i1-arrival")
    run_through_horizon(env)
    assert [t for _, t in log] == ["i0-timeout", "i1-arrival", "i1-timeout", "i2-arrival",
                                   "i10-arrival"]


def test_within_an_instance_lower_blis_priority_first():
    env = _env()
    log = []
    f = _logger(log, env)
    for p in reversed(INSTANCE_PRIOS):
        env.call_at(5, instance_key(4, p), f, p)
    run_through_horizon(env)
    assert [t for _, t in log] == [ARRIVAL, QUEUED, STEP, SCHEDULED, REQUEST_LEFT, TIMEOUT]


def test_completion_step_beats_timeout_at_same_tick():
    # "Priority 5 for timeouts means a completion in the same tick wins over the cancellation"
    env = _env()
    log = []
    f = _logger(log, env)
    env.call_at(1000, instance_key(0, TIMEOUT), f, "timeout")
    env.call_at(1000, instance_key(0, STEP), f, "step")
    run_through_horizon(env)
    assert [t for _, t in log] == ["step", "timeout"]


@pytest.mark.parametrize("key", [CLUSTER_ARRIVAL, ROUTING, instance_key(0, STEP), instance_key(7, TIMEOUT)])
def test_fifo_among_equal_keys(key):
    env = _env()
    log = []
    f = _logger(log, env)
    for i in range(20):
        env.call_at(3, key, f, i)
    run_through_horizon(env)
    assert [t for _, t in log] == list(range(20))


def test_session_followups_after_pregenerated_arrivals():
    env = _env()
    log = []
    f = _logger(log, env)
    # the follow-up is pushed before the pre-generated arrivals, yet runs after all of them
    env.call_at(10, FOLLOWUP_ARRIVAL, f, "followup-1")
    env.call_at(10, CLUSTER_ARRIVAL, f, "pregen-1")
    env.call_at(10, FOLLOWUP_ARRIVAL, f, "followup-2")
    env.call_at(10, CLUSTER_ARRIVAL, f, "pregen-2")
    # ... and still before any other cluster event at that time (it is a ClusterArrival)
    env.call_at(10, ADMISSION, f, "admission")
    run_through_horizon(env)
    assert [t for _, t in log] == ["pregen-1", "pregen-2", "followup-1", "followup-2", "admission"]


def test_cluster_event_created_by_instance_event_runs_before_remaining_instance_events():
    env = _env()
    log = []
    f = _logger(log, env)

    def step(_):
        log.append((env.now, "i0-step"))
        env.call_at(env.now, ROUTING, f, "cluster-from-step")   # e.g. a PD transfer start
        env.call_at(env.now, instance_key(1, ARRIVAL), f, "i1-arrival-from-step")

    env.call_at(200, instance_key(0, STEP), step)
    env.call_at(200, instance_key(0, TIMEOUT), f, "i0-timeout")
    env.call_at(200, instance_key(1, QUEUED), f, "i1-queued")
    env.call_at(201, CLUSTER_ARRIVAL, f, "later-cluster")
    run_through_horizon(env)
    assert log == [(200, "i0-step"), (200, "cluster-from-step"), (200, "i0-timeout"),
                   (200, "i1-arrival-from-step"), (200, "i1-queued"), (201, "later-cluster")]


def test_instance_event_created_for_lower_index_runs_next():
    env = _env()
    log = []
    f = _logger(log, env)

    def step2(_):
        log.append((env.now, "i2-step"))
        env.call_at(env.now, instance_key(1, TIMEOUT), f, "i1-timeout-new")
        env.call_at(env.now, instance_key(2, QUEUED), f, "i2-queued-new")

    env.call_at(9, instance_key(2, STEP), step2)
    env.call_at(9, instance_key(2, TIMEOUT), f, "i2-timeout")
    run_through_horizon(env)
    # new i1 event first (lower index); new i2 Queued (prio 1) before the old i2 Timeout (5)
    assert [t for _, t in log] == ["i2-step", "i1-timeout-new", "i2-queued-new", "i2-timeout"]


def test_wake_at_resumes_a_process_in_key_order():
    env = _env()
    log = []
    f = _logger(log, env)

    def proc():
        yield env.wake_at(30, instance_key(0, STEP))
        log.append((env.now, "proc-step"))
        yield env.wake_at(30, instance_key(0, STEP))   # same time: after the queued ones
        log.append((env.now, "proc-step-again"))

    env.process(proc())
    env.call_at(30, instance_key(0, TIMEOUT), f, "timeout")
    env.call_at(30, instance_key(0, QUEUED), f, "queued")
    env.call_at(30, CLUSTER_ARRIVAL, f, "arrival")
    run_through_horizon(env)
    assert log == [(30, "arrival"), (30, "queued"), (30, "proc-step"), (30, "proc-step-again"),
                   (30, "timeout")]


def test_clock_is_integer_and_callback_gets_arg():
    env = _env()
    seen = []
    env.call_at(1234, CLUSTER_ARRIVAL, lambda a: seen.append((env.now, a)), {"x": 1})
    ev = env.call_at(5, CLUSTER_ARRIVAL, lambda a: seen.append((env.now, a)))
    run_through_horizon(env)
    assert seen == [(5, None), (1234, {"x": 1})]
    assert type(env.now) is int
    assert ev.processed


def test_a_simulation_runs_events_at_the_horizon_and_none_after():
    """The horizon cut is the simulation's (``Simulation.run``): a request arriving exactly
    at the horizon arrives and is routed (its ClusterArrival, admission and routing events
    all sit at the horizon), one arriving 1 µs later never arrives."""
    reqs = make_requests([(100, 8, 4), (101, 8, 4)])
    res = Simulation(scenario(), reqs, horizon_us=100).run()
    c = res.counters
    assert (c.offered, c.arrived, c.admitted, c.routed) == (2, 1, 1, 1)
    assert res.horizon_us == 100


def test_key_ranges_do_not_overlap():
    # every cluster key (follow-ups included) sorts before every instance key; an instance's
    # six priorities sort before the next instance's first
    all_cluster = [*CLUSTER_KEYS, FOLLOWUP_ARRIVAL]
    assert max(all_cluster) < instance_key(0, ARRIVAL)
    assert min(all_cluster) > 1          # SimPy's own URGENT/NORMAL come first
    for k in range(50):
        assert instance_key(k, TIMEOUT) < instance_key(k + 1, ARRIVAL)
    assert CLUSTER_ARRIVAL < FOLLOWUP_ARRIVAL < ADMISSION


# ---------------------------------------------------------------------------- property
_events = st.lists(
    st.tuples(
        st.integers(0, 4),                                    # time
        st.one_of(
            st.tuples(st.just(0), st.just(0), st.sampled_from(range(len(CLUSTER_KEYS)))),
            st.tuples(st.just(0), st.just(0), st.just(0.5)),  # follow-up arrival
            st.tuples(st.just(1), st.integers(0, 4), st.sampled_from(INSTANCE_PRIOS)),
        ),
    ),
    max_size=40)


def _key_of(kind):
    cls, inst, p = kind
    if cls == 0:
        return FOLLOWUP_ARRIVAL if p == 0.5 else CLUSTER_KEYS[p]
    return instance_key(inst, p)


@settings(max_examples=200)
@given(_events)
def test_processing_order_is_blis_total_order(events):
    """Events pushed in arbitrary order come out sorted by (time, cluster-first, instance
    index, BLIS priority, push order). Follow-ups rank as ClusterArrival pushed after every
    pre-generated arrival, i.e. priority 0.5 in this encoding."""
    env = _env()
    log = []
    for seq, (t, kind) in enumerate(events):
        env.call_at(t, _key_of(kind), log.append, seq)
    run_through_horizon(env)
    expected = sorted(range(len(events)), key=lambda s: (events[s][0], *events[s][1], s))
    assert log == expected
