"""A guard against an engine that steps forever without progress, put on instances that run a
plugin's batching policy, KV cache or engine class (docs/extending.md, "When a plugin
misbehaves").

An engine whose wait queue never empties keeps scheduling steps. With the built-in batching
policy and KV caches every step runs something, completes it or drops what can never fit
(docs/engine.md); a plugin's may schedule nothing, step after step — a batching policy that
admits no one, a KV cache whose ``allocate`` always fails — and with an unbounded horizon
the run would never end. :func:`watch_for_stall` replaces the instance's ``step`` (on that
object only: built-in engines keep theirs, unchecked) by one that counts the steps in a row
after which nothing changed while requests waited, and stops the run with the plugin's
one-line error at :data:`STALL_STEPS` of them.
"""

from __future__ import annotations

from blis_simpy.plugins import plugin_error

#: steps in a row that change nothing while requests wait: the run is stuck. Any real step
#: changes the state within a KV block's worth of tokens (the KV blocks in use grow), so
#: this is far beyond what progress can take, and a few seconds of simulation at most.
STALL_STEPS = 100_000


def _state(inst) -> tuple:
    """What any progress changes: queue and batch sizes, requests done, KV blocks used."""
    m = inst.metrics
    return (len(inst.waitq), len(inst.running), inst.kv.used,
            m.completed_requests + m.dropped_unservable + m.timed_out_requests)


def watch_for_stall(inst, plugin, *, field: str | None, limit: int = STALL_STEPS) -> None:
    """Make ``inst`` (run by ``plugin``, a batching policy, KV cache or the instance itself)
    stop the run with ``plugin``'s one-line error after ``limit`` steps in a row that
    changed nothing while requests waited in its queue."""
    step = inst.step
    last = None
    same = 0
    since_us = 0

    def watched(now_us: int):
        nonlocal last, same, since_us
        nxt = step(now_us)
        if nxt is None or not inst.waitq:
            last, same = None, 0
            return nxt
        state = _state(inst)
        if state != last:
            last, same, since_us = state, 0, now_us
            return nxt
        same += 1
        if same >= limit:
            raise plugin_error(plugin, f"left {inst.id} stuck: {same} steps in a row from "
                               f"t={since_us} us changed nothing while {len(inst.waitq)} "
                               "requests waited (none admitted, completed or dropped); the "
                               "run would never end", field=field)
        return nxt

    inst.step = watched
