"""The keyed hand-off (:class:`blis_simpy.des.Mailbox`, a ``simpy.Store``) and
:func:`blis_simpy.des.succeed_at`, through their public API; and the rule that only
``des.py`` writes SimPy's private event fields."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import simpy

from blis_simpy.des import (
    DECODE_ROUTING,
    KV_TRANSFER_COMPLETED,
    KV_TRANSFER_STARTED,
    PREFILL_ROUTING,
    ROUTING,
    STEP,
    Mailbox,
    SimEnv,
    instance_key,
    process_now,
    succeed_at,
)
from tests.des_support import run_through_horizon

PACKAGE = Path(__file__).resolve().parents[1] / "blis_simpy"


def _reader(env, box, name, log, n):
    """A process that takes ``n`` items from ``box`` and logs ``(time, name, item)``."""
    for _ in range(n):
        item = yield box.get()
        log.append((env.now, name, item))


def test_mailbox_is_a_simpy_store():
    env = SimEnv(100)
    box = Mailbox(env, KV_TRANSFER_STARTED)
    assert isinstance(box, simpy.Store)
    assert box.key == KV_TRANSFER_STARTED and len(box) == 0


def test_a_second_reader_is_served_not_stranded():
    env = SimEnv(100)
    box = Mailbox(env, DECODE_ROUTING)
    log = []
    env.process(_reader(env, box, "r1", log, 1))
    env.process(_reader(env, box, "r2", log, 1))
    env.call_at(10, ROUTING, box.put, "a")
    env.call_at(20, ROUTING, box.put, "b")
    run_through_horizon(env)
    assert log == [(10, "r1", "a"), (20, "r2", "b")]
    assert len(box) == 0 and len(box.get_queue) == 0


def test_waiting_readers_are_served_first_come_first_served():
    env = SimEnv(100)
    box = Mailbox(env, DECODE_ROUTING)
    log = []
    for name in ("r1", "r2", "r3"):
        env.process(_reader(env, box, name, log, 2))

    def burst(items):
        for it in items:
            box.put(it)

    env.call_at(5, ROUTING, burst, ["a", "b", "c", "d"])
    env.call_at(7, ROUTING, burst, ["e", "f"])
    run_through_horizon(env)
    # at 5 the three waiting readers get a, b, c in the order they came; d waits in the
    # store and goes to the first reader asking again (r1, resumed first)
    assert log == [(5, "r1", "a"), (5, "r2", "b"), (5, "r3", "c"), (5, "r1", "d"),
                   (7, "r2", "e"), (7, "r3", "f")]


def test_delivery_runs_at_the_mailbox_key():
    env = SimEnv(100)
    box = Mailbox(env, KV_TRANSFER_STARTED)
    log = []
    env.process(_reader(env, box, "reader", log, 1))
    env.call_at(30, PREFILL_ROUTING, log.append, "cluster event, lower key")
    env.call_at(30, KV_TRANSFER_COMPLETED, log.append, "cluster event, higher key")
    env.call_at(30, instance_key(0, STEP), box.put, "x")          # a step hands over x
    env.call_at(30, instance_key(0, STEP) + 1, log.append, "the instance's next event")
    run_through_horizon(env)
    # the cluster events at 30 ran before the step; the delivery (a cluster event pushed
    # by the step) runs right after it, before the instance's remaining events at 30
    assert log == ["cluster event, lower key", "cluster event, higher key", (30, "reader", "x"),
                   "the instance's next event"]

    env = SimEnv(100)
    box = Mailbox(env, KV_TRANSFER_STARTED)
    log = []
    env.process(_reader(env, box, "reader", log, 1))
    env.call_at(30, ROUTING, box.put, "y")                          # a cluster event hands over y
    env.call_at(30, KV_TRANSFER_COMPLETED, log.append, "higher key")
    env.call_at(30, PREFILL_ROUTING, log.append, "lower key")
    run_through_horizon(env)
    assert log == ["lower key", (30, "reader", "y"), "higher key"]


def test_items_put_with_no_reader_queue_up_in_order():
    env = SimEnv(100)
    box = Mailbox(env, PREFILL_ROUTING)
    for it in ("a", "b", "c"):
        box.put(it)
    assert len(box) == 3
    log = []
    env.process(_reader(env, box, "late", log, 3))
    run_through_horizon(env)
    assert log == [(0, "late", "a"), (0, "late", "b"), (0, "late", "c")]
    assert len(box) == 0


def test_put_at_delivers_later_at_the_key():
    env = SimEnv(100)
    box = Mailbox(env, PREFILL_ROUTING)
    log = []
    env.process(_reader(env, box, "r", log, 2))
    box.put_at(40, "second")           # scheduled first, for later
    box.put_at(12, "first")
    env.call_at(12, KV_TRANSFER_STARTED, log.append, "after")
    env.call_at(12, ROUTING, log.append, "before")
    run_through_horizon(env)
    assert log == ["before", (12, "r", "first"), "after", (40, "r", "second")]


def test_put_is_accepted_at_once():
    env = SimEnv(100)
    box = Mailbox(env, PREFILL_ROUTING)
    ev = box.put("a")
    assert isinstance(ev, simpy.resources.store.StorePut) and ev.triggered
    assert len(box.put_queue) == 0 and list(box.items) == ["a"]


def _handoffs(hand):
    """Two readers, items handed over at 5 (three of them) and 7 by ``hand(box, item)``:
    the log and the number of events the run processed."""
    env = SimEnv(100)
    box = Mailbox(env, DECODE_ROUTING)
    log = []
    env.process(_reader(env, box, "r1", log, 2))
    env.process(_reader(env, box, "r2", log, 2))
    env.call_at(5, ROUTING, lambda items: [hand(box, it) for it in items], ["a", "b", "c"])
    env.call_at(5, KV_TRANSFER_STARTED, log.append, "between")
    env.call_at(7, ROUTING, lambda it: hand(box, it), "d")
    n = 0
    while env.peek() <= 100:
        env.step()
        n += 1
    return log, n


def test_deliver_is_put_without_the_acceptance_event():
    put_log, put_events = _handoffs(lambda box, it: box.put(it))
    log, events = _handoffs(lambda box, it: box.deliver(it))
    # the same hand-offs at the same times and keys, in the same order
    # (deliveries at 5 run at the mailbox's key, after the lower-keyed event at 5)
    assert log == put_log == ["between", (5, "r1", "a"), (5, "r2", "b"), (5, "r1", "c"),
                              (7, "r2", "d")]
    # one event fewer per item: put()'s acceptance (a no-op at NORMAL priority)
    assert put_events - events == 4


# ---------------------------------------------------------------------------- succeed_at
def test_succeed_at_fires_a_pending_event_at_time_and_key():
    env = SimEnv(100)
    log = []

    def sleeper():
        value = yield bell
        log.append((env.now, "woken", value))

    bell = env.event()
    env.process(sleeper())
    env.call_at(3, ROUTING, lambda _: succeed_at(bell, 9, instance_key(1, STEP), "go"))
    env.call_at(9, instance_key(1, STEP) + 1, log.append, "after")
    env.call_at(9, instance_key(1, STEP) - 1, log.append, "before")
    run_through_horizon(env)
    assert log == ["before", (9, "woken", "go"), "after"]


def test_succeed_at_refuses_a_triggered_event_and_the_past():
    env = SimEnv(100)
    ev = env.event()
    succeed_at(ev, 0, ROUTING)
    with pytest.raises(RuntimeError):
        succeed_at(ev, 5, ROUTING)
    env.run(until=10)
    with pytest.raises(ValueError):
        succeed_at(env.event(), 9, ROUTING)


# ---------------------------------------------------------------------------- fewer events
def _count(env) -> int:
    n = 0
    while env.peek() <= env.horizon_us:
        env.step()
        n += 1
    return n


def test_quiet_through_looks_at_the_head_of_the_queue():
    env = SimEnv(100)
    assert env.quiet_through(ROUTING)                       # nothing queued
    env.call_at(0, PREFILL_ROUTING, lambda _: None)
    assert env.quiet_through(ROUTING) and not env.quiet_through(PREFILL_ROUTING)
    env.call_at(0, ROUTING, lambda _: None)
    assert env.quiet_through(ROUTING - 1)
    assert not env.quiet_through(ROUTING)
    env2 = SimEnv(100)
    env2.call_at(3, ROUTING, lambda _: None)                 # later time: any key is quiet now
    assert env2.quiet_through(1 << 40)
    env2.event().succeed()                                   # SimPy's NORMAL (1) at now
    assert not env2.quiet_through(ROUTING)


def test_process_now_lets_a_process_go_on_without_an_event():
    env = SimEnv(100)
    log = []

    def proc():
        ev = env.event()
        value = yield process_now(ev, "v")                   # processed: no wait
        log.append((env.now, value, ev.processed))

    env.process(proc())
    assert _count(env) == 2                                  # the start and the end, no more
    assert log == [(0, "v", True)]
    with pytest.raises(RuntimeError):
        process_now(process_now(env.event()))


def test_put_at_serves_a_waiting_reader_in_its_own_event():
    """A timed delivery with nothing queued before its place takes one event (not two);
    with an equal-key event queued first, the reader is served behind it, as before."""
    env = SimEnv(100)
    box = Mailbox(env, PREFILL_ROUTING)
    log = []
    env.process(_reader(env, box, "r", log, 2))
    box.put_at(12, "a")
    env.call_at(20, PREFILL_ROUTING, log.append, "queued first")
    box.put_at(20, "b")
    assert _count(env) == 1 + 1 + 2 + 1         # start, a's put, the other event and b's put, end
    assert log == [(12, "r", "a"), "queued first", (20, "r", "b")]


def test_hand_on_delivers_now_when_nothing_comes_in_between():
    env = SimEnv(100)
    box = Mailbox(env, PREFILL_ROUTING)
    log = []
    env.process(_reader(env, box, "r", log, 3))
    results = []
    env.call_at(5, ROUTING, lambda _: results.append(box.hand_on(5, "now")))
    # at 7 an equal-key event is queued first: the hand-off keeps its keyed event behind it
    env.call_at(7, PREFILL_ROUTING, log.append, "first at 7")
    env.call_at(7, ROUTING, lambda _: results.append(box.hand_on(7, "keyed")))
    env.call_at(8, ROUTING, lambda _: results.append(box.hand_on(9, "later")))
    _count(env)
    assert log == [(5, "r", "now"), "first at 7", (7, "r", "keyed"), (9, "r", "later")]
    assert results[0] is None and results[1] is not None and results[2] is not None


# ---------------------------------------------------------------------------- the rule
_PRIVATE = {"_ok", "_value", "_defused"}


def _private_event_writes(path: Path) -> list[str]:
    """Assignments to an event's private fields, and calls of ``<x>.schedule(``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr in _PRIVATE:
                found.append(f"{path.name}:{node.lineno} writes .{t.attr}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "schedule"):
            found.append(f"{path.name}:{node.lineno} calls .schedule(")
    return found


def test_the_scan_sees_des_itself():
    # the scan is not blind: des.py is where the keyed triggering lives
    found = _private_event_writes(PACKAGE / "des.py")
    assert any("writes ._ok" in f for f in found) and any(".schedule(" in f for f in found)


def test_no_module_but_des_writes_private_event_fields_or_schedules_events():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "des.py":
            continue
        offenders += _private_event_writes(path)
    assert offenders == []
