"""The fabric's bandwidth as a SimPy resource (:class:`blis_simpy.disagg.bandwidth.BandwidthLink`):
transfers acquire and release it; processor sharing inside it gives hand-computed
completion times. Everything goes through the public API, with real SimPy processes."""

from __future__ import annotations

import pytest
from simpy.resources.base import BaseResource, Get, Put

from blis_simpy.des import DECODE_ROUTING, KV_TRANSFER_COMPLETED, KV_TRANSFER_STARTED, SimEnv
from blis_simpy.disagg.bandwidth import BandwidthLink, Transfer
from blis_simpy.disagg.fabric import KVTransferFabric
from tests.des_support import run_through_horizon

RATE = 1000.0          # bytes per µs (1 GB/s)


def _transfer(env, link, start_us, nbytes, log):
    """A process: at ``start_us`` acquire the link for ``nbytes``, wait for the bytes,
    release it; log ``(completion µs, seq, exact finish µs)``."""
    yield env.wake_at(start_us, KV_TRANSFER_STARTED)
    tr = link.request(nbytes)
    granted = yield tr
    assert granted is None and tr in link.users
    done = yield tr.finished
    assert done is tr
    log.append((env.now, tr.seq, tr.finish_exact_us))
    link.release(tr)
    assert tr not in link.users


def _run(contention, specs, *, latency_us=0.0, probes=()):
    env = SimEnv(10**6)
    link = BandwidthLink(env, rate=RATE, latency_us=latency_us, contention=contention,
                         key=KV_TRANSFER_COMPLETED)
    log = []
    for start, nbytes in specs:
        env.process(_transfer(env, link, start, nbytes, log))
    for t, key, fn in probes:
        env.call_at(t, key, fn, link)
    run_through_horizon(env)
    return link, log


THREE = [(0, 4000.0), (1, 1000.0), (2, 1500.0)]       # A, B, C: (start µs, bytes)


def test_the_link_is_a_simpy_resource_that_transfers_acquire_and_release():
    env = SimEnv(100)
    link = BandwidthLink(env, rate=RATE, latency_us=0.0, contention="fair-share",
                         key=KV_TRANSFER_COMPLETED)
    assert isinstance(link, BaseResource)
    tr = link.request(500.0)
    assert isinstance(tr, Transfer) and isinstance(tr, Put)
    assert tr.triggered and link.users == [tr] and tr.seq == 0
    with pytest.raises(ValueError):          # its bytes are not through yet
        link.release(tr)
    env.run(until=2)
    assert tr.finished.processed and tr.finish_exact_us == 0.5
    rel = link.release(tr)
    assert isinstance(rel, Get) and rel.triggered and link.users == []


def test_fair_share_three_overlapping_transfers_by_hand():
    """Rate 1000 B/µs, no latency. A 4000 B at 0, B 1000 B at 1, C 1500 B at 2.

      0..1    A alone, 1000 B/µs: A 3000 left
      1..2    A, B at 500 B/µs:   A 2500, B 500 left
      2..3.5  A, B, C at 333.3:   B's 500 B take 1.5 µs -> B done at 3.5 (A 2000, C 1000)
      3.5..5.5 A, C at 500 B/µs:  C done at 5.5 (A 1000)
      5.5..6.5 A alone:           A done at 6.5
    Completion events at ceil: B 4, C 6, A 7; the rates sped up as B and then C left."""
    seen = []
    probes = [(2, KV_TRANSFER_COMPLETED, lambda link: seen.append(("at 2", len(link.users)))),
              (5, KV_TRANSFER_COMPLETED, lambda link: seen.append(("at 5", len(link.users))))]
    link, log = _run("fair-share", THREE, probes=probes)
    assert log == [(4, 1, 3.5), (6, 2, 5.5), (7, 0, 6.5)]
    assert seen == [("at 2", 3), ("at 5", 2)]          # B released at 4, A and C still hold it
    assert link.users == []
    # bytes conservation of the hand computation
    assert 1000 + 2 * 500 + 3 * 500 + 2 * 1000 + 1000 == 4000 + 1000 + 1500


def test_two_transfers_with_latency_share_after_the_delay():
    """Latency 1 µs (no bandwidth used during it): both join at 1, each at 500 B/µs, and
    2000 B take 4 µs -> both finish at exactly 5.0; delivered at 5 in acquisition order."""
    _, log = _run("fair-share", [(0, 2000.0), (0, 2000.0)], latency_us=1.0)
    assert log == [(5, 0, 5.0), (5, 1, 5.0)]


def test_snapshot_and_none_on_the_same_transfers():
    # snapshot: the share is rate / holders at acquisition, kept: A 1000 -> 4.0;
    # B 500 -> 1 + 2.0 = 3.0; C 333.3 -> 2 + 4.5 = 6.5 -> completes at 2 + ceil(4.5) = 7
    _, log = _run("snapshot", THREE)
    assert [(t, seq) for t, seq, _ in log] == [(3, 1), (4, 0), (7, 2)]
    # none: full rate for everyone: A 4.0, B 1 + 1.0, C 2 + 1.5 -> 4
    _, log = _run("none", THREE)
    assert [(t, seq) for t, seq, _ in log] == [(2, 1), (4, 0), (4, 2)]


def test_the_fabric_acquires_and_releases_its_link():
    env = SimEnv(10**6)
    handed_on = []
    fab = KVTransferFabric(env, bandwidth_gbps=1.0, base_latency_ms=0.0, contention="fair-share",
                           on_complete=lambda tr: handed_on.append((env.now, tr.parent, len(fab.link.users))))
    for start, nbytes in THREE:
        env.call_at(start, KV_TRANSFER_STARTED, lambda a: fab.start(*a), (f"p{start}", nbytes))
    run_through_horizon(env)
    # released before being handed on: the holders left are the others still in flight
    assert handed_on == [(4, "p1", 2), (6, "p2", 1), (7, "p0", 0)]
    assert [t.duration_us for t in fab.transfers] == [7, 3, 4]
    assert fab.link.users == [] and fab.active == 0 and fab.peak_concurrent == 3


@pytest.mark.parametrize("contention, ticks", [
    ("fair-share", {"B": 4, "A": 5}),
    ("snapshot", {"A": 3, "B": 4}),     # B keeps 500 B/µs: 1 + 2.4; A keeps 1000: 3.0
    ("none", {"A": 3, "B": 3}),         # B 1 + 1.2 = 2.2; A 3.0
])
def test_a_transfer_process_waits_on_the_link_while_another_holds_it(contention, ticks):
    """The fabric's transfers are processes. 1 GB/s = 1000 B/µs, no latency. A: 3000 B at
    0; B: 1200 B at 1, while A holds the link. Fair share:

      0..1    A alone, 1000 B/µs:  A 2000 left
      1..3.4  A, B at 500 B/µs:    B's 1200 B take 2.4 µs -> B done at 3.4 (A 800 left)
      3.4..4.2 A alone:            A done at 4.2
    Completion events at ceil: B at 4, A at 5. At 2 both processes wait on their transfer's
    ``finished`` event with both holding the link; at 4, after B's completion, B's process
    has released the link and ended while A's still waits."""
    env = SimEnv(10**6)
    done, seen, procs = [], [], {}
    fab = KVTransferFabric(env, bandwidth_gbps=1.0, base_latency_ms=0.0, contention=contention,
                           on_complete=lambda tr: done.append((tr.parent, env.now)))

    def start(arg):
        name, nbytes = arg
        procs[name] = fab.start(name, nbytes)

    def probe(_):
        waiting = sorted(n for n, p in procs.items() if p.is_alive
                         and any(p.target is t.finished for t in fab.link.users))
        seen.append((env.now, [t.parent for t in fab.link.users], waiting))

    env.call_at(0, KV_TRANSFER_STARTED, start, ("A", 3000.0))
    env.call_at(1, KV_TRANSFER_STARTED, start, ("B", 1200.0))
    env.call_at(2, KV_TRANSFER_STARTED, probe)
    env.call_at(4, DECODE_ROUTING, probe)          # after the completions at 4 (key order)
    run_through_horizon(env)
    assert dict(done) == ticks and [n for n, _ in done] == sorted(ticks, key=ticks.get)
    assert seen[0] == (2, ["A", "B"], ["A", "B"])
    if contention == "fair-share":
        assert seen[1] == (4, ["A"], ["A"])
        assert [t.finish_exact_us for t in fab.transfers] == pytest.approx([4.2, 3.4])
    assert fab.link.users == [] and not any(p.is_alive for p in procs.values())


def test_the_fabric_process_takes_its_transfers_from_its_inbox():
    """``(parent, nbytes)`` put in the inbox at 5 start a transfer at 5 (its
    KVTransferStarted event); 2000 B at 1000 B/µs -> completes at 7."""
    env = SimEnv(10**6)
    done = []
    fab = KVTransferFabric(env, bandwidth_gbps=1.0, base_latency_ms=0.0, contention="fair-share",
                           on_complete=lambda tr: done.append((tr.parent, tr.start_us, env.now)))
    fab.inbox.put_at(5, ("p", 2000.0))
    run_through_horizon(env)
    assert done == [("p", 5, 7)] and fab.transfers_initiated == fab.transfers_completed == 1


@pytest.mark.parametrize("kw", [{"rate": 0.0}, {"rate": float("nan")}, {"latency_us": -1.0},
                                {"contention": "fair"}])
def test_invalid_link(kw):
    args = {"rate": RATE, "latency_us": 0.0, "contention": "none", "key": KV_TRANSFER_COMPLETED} | kw
    with pytest.raises(ValueError):
        BandwidthLink(SimEnv(10), **args)


def test_invalid_request_leaves_the_link_untouched():
    link = BandwidthLink(SimEnv(10), rate=RATE, latency_us=0.0, contention="snapshot",
                         key=KV_TRANSFER_COMPLETED)
    with pytest.raises(ValueError):
        link.request(-1.0)
    assert link.users == [] and len(link.put_queue) == 0
