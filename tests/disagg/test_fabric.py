"""The KV-transfer fabric: golden transfer times, contention modes, counters (docs/disaggregation.md)."""

from __future__ import annotations

import logging
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_simpy.des import (
    DECODE_ROUTING,
    KV_TRANSFER_STARTED,
    STEP,
    SimEnv,
    instance_key,
)
from blis_simpy.disagg.fabric import KVTransferFabric, SharedBandwidth
from tests.des_support import run_through_horizon

MODES = ("none", "snapshot", "fair-share")
TEN_BLOCKS = 10 * 16 * 512          # 81 920 B
DEFAULT_1000 = 63 * 16 * 512        # 516 096 B: a 1000-token prompt at the defaults


def run(mode, specs, *, bw=10.0, base=0.0, horizon=10**9, probes=()):
    """Start ``specs`` = [(start µs, bytes)] at KV_TRANSFER_STARTED; return (fabric, log).

    ``log`` lists ``(time, seq)`` per on_complete call, plus any probe labels."""
    env = SimEnv(horizon)
    log = []

    def done(tr):
        assert tr.complete_us == env.now
        log.append((env.now, tr.seq))

    fab = KVTransferFabric(env, bandwidth_gbps=bw, base_latency_ms=base, contention=mode,
                           on_complete=done)
    for i, (t, b) in enumerate(specs):
        env.call_at(t, KV_TRANSFER_STARTED, lambda a: fab.start(f"p{a[0]}", a[1]), (i, b))
    for t, key, label in probes:
        env.call_at(t, key, log.append, label)
    run_through_horizon(env)
    return fab, log


def durations(fab):
    return [t.duration_us for t in fab.transfers]


# --------------------------------------------------------------------------- golden values
@pytest.mark.parametrize("mode", MODES)
def test_ten_blocks_alone_take_9us(mode):
    fab, log = run(mode, [(5, TEN_BLOCKS)])
    assert durations(fab) == [9]                        # ceil(81920 / 10000) = ceil(8.192)
    assert log == [(14, 0)]


@pytest.mark.parametrize("mode", MODES)
def test_defaults_1000_token_prompt_take_71us(mode):
    # 516 096 B / 25 000 B/µs = 20.64384 µs + 50 µs base -> 71
    fab, _ = run(mode, [(0, DEFAULT_1000)], bw=25.0, base=0.05)
    assert durations(fab) == [71]
    fab, _ = run(mode, [(123_456_789, DEFAULT_1000)], bw=25.0, base=0.05)
    assert durations(fab) == [71]


def test_snapshot_second_transfer_while_one_active_takes_17us():
    fab, log = run("snapshot", [(0, TEN_BLOCKS), (4, TEN_BLOCKS)])
    assert durations(fab) == [9, 17]      # the first keeps its full share (fixed at start)
    assert [t.share for t in fab.transfers] == [10_000.0, 5_000.0]
    assert log == [(9, 0), (21, 1)]


def test_none_ignores_other_transfers():
    fab, _ = run("none", [(0, TEN_BLOCKS), (0, TEN_BLOCKS), (4, TEN_BLOCKS)])
    assert durations(fab) == [9, 9, 9]


def test_fair_share_two_simultaneous_transfers_take_17us_each():
    fab, log = run("fair-share", [(0, TEN_BLOCKS), (0, TEN_BLOCKS)])
    assert durations(fab) == [17, 17]     # each at 5000 B/µs: 16.384 µs
    assert log == [(17, 0), (17, 1)]


def test_fair_share_staggered_rates_are_redivided():
    fab, log = run("fair-share", [(0, TEN_BLOCKS), (4, TEN_BLOCKS)])
    bw = 10 * 1000.0
    # 0..4: A alone at 10 000 B/µs -> 40 000 B sent (virtual time 40 000); B joins with tag
    # 40 000 + 81 920. From 4 both get 5000 B/µs: A's last 41 920 B take 8.384 µs.
    v_join_b = 0.0 + (4 - 0) * bw / 1
    a_exact = 4 + (TEN_BLOCKS - v_join_b) * 2 / bw                 # 12.384
    # A leaves at 12.384 with B at virtual time 81 920: B's last 40 000 B at full rate.
    b_exact = a_exact + ((v_join_b + TEN_BLOCKS) - TEN_BLOCKS) * 1 / bw   # 16.384
    a, b = fab.transfers
    assert a.finish_exact_us == a_exact and b.finish_exact_us == b_exact
    assert math.ceil(a_exact) == 13 and math.ceil(b_exact) == 17
    assert (a.complete_us, b.complete_us) == (13, 17)
    assert durations(fab) == [13, 13]     # snapshot would give 9 and 17 (completing at 21)
    assert log == [(13, 0), (17, 1)]


def test_fair_share_three_transfers_with_base_latency_by_hand():
    """bw 10 000 B/µs, base 2 µs (a pure delay: no bandwidth used during it).

    A: start 0, 61 000 B, joins at 2.   B: start 1, 20 500 B, joins at 3.
    C: start 3, 10 000 B, joins at 5.
      2..3  A alone: 10 000 B sent                         (A left 51 000)
      3..5  A, B at 5000 B/µs: 10 000 B each               (A 41 000, B 10 500)
      5..8  A, B, C at 3333.3 B/µs: 10 000 B each -> C done at 8.0   (A 31 000, B 500)
      8..8.1 A, B at 5000 B/µs: B's last 500 B -> B done at 8.1      (A 30 500)
      8.1.. A alone: 30 500 B in 3.05 µs -> A done at 11.15
    Completion events at ceil: C 8 (exact integer), B 9, A 12 — C, started last, finishes
    first (under snapshot it would not)."""
    fab, log = run("fair-share", [(0, 61_000), (1, 20_500), (3, 10_000)], base=0.002)
    a, b, c = fab.transfers
    assert c.finish_exact_us == 8.0
    assert b.finish_exact_us == pytest.approx(8.1, abs=1e-12)
    assert a.finish_exact_us == pytest.approx(11.15, abs=1e-12)
    assert [t.complete_us for t in fab.transfers] == [12, 9, 8]
    assert log == [(8, 2), (9, 1), (12, 0)]
    # bytes conservation of the hand computation
    assert 10_000 + 2 * 10_000 + 3 * 10_000 + 2 * 500 + 30_500 == 61_000 + 20_500 + 10_000
    snap, _ = run("snapshot", [(0, 61_000), (1, 20_500), (3, 10_000)], base=0.002)
    assert [t.complete_us for t in snap.transfers] == [9, 8, 8]


def test_fair_share_finish_just_before_a_pending_join():
    """The process must re-arm for a finish that precedes a known, not yet joined transfer.

    bw 10 000 B/µs, base 5 µs. X (30 000 B) and A (75 000 B) start at 0 and join at 5;
    sharing, X finishes at 5 + 30 000·2/10 000 = 11.0; A then has 45 000 B left alone:
    done at 15.5. B (10 000 B) starts at 11, joins at 16 — after A left — alone: 17.0."""
    fab, log = run("fair-share", [(0, 30_000), (0, 75_000), (11, 10_000)], base=0.005)
    assert [t.finish_exact_us for t in fab.transfers] == [11.0, 15.5, 17.0]
    assert log == [(11, 0), (16, 1), (17, 2)]


def test_inv_p2_2_snapshot_share_counts_the_new_transfer():
    fab, _ = run("snapshot", [(0, TEN_BLOCKS)] * 4)
    assert [t.share for t in fab.transfers] == [10_000.0, 10_000.0 / 2, 10_000.0 / 3, 10_000.0 / 4]
    assert durations(fab) == [9, 17, math.ceil(TEN_BLOCKS / (10_000.0 / 3)), 33]
    assert durations(fab)[2] == 25


def test_zero_bytes_take_the_1us_floor():
    for mode in MODES:
        fab, _ = run(mode, [(7, 0.0)])
        assert durations(fab) == [1]


# --------------------------------------------------------------------------- event order
@pytest.mark.parametrize("mode", MODES)
def test_completion_runs_at_its_key(mode):
    probes = [(9, DECODE_ROUTING, "decode-routing"), (9, instance_key(0, STEP), "step"),
              (9, KV_TRANSFER_STARTED, "started")]
    _, log = run(mode, [(0, TEN_BLOCKS)], probes=probes)
    assert log == ["started", (9, 0), "decode-routing", "step"]


@pytest.mark.parametrize("mode", MODES)
def test_same_microsecond_completions_in_start_order(mode):
    # A: 85 000 B from 0; B: 500 B from 8. Under fair-share B finishes first in exact time
    # (8.1 vs 8.55), but both complete in µs 9 and are delivered in start order.
    fab, log = run(mode, [(0, 85_000), (8, 500)])
    assert log == [(9, 0), (9, 1)]
    if mode == "fair-share":
        assert fab.transfers[1].finish_exact_us < fab.transfers[0].finish_exact_us


@pytest.mark.parametrize("mode", MODES)
def test_a_later_short_transfer_overtakes_a_long_one(mode):
    fab, log = run(mode, [(0, 1_000_000), (5, TEN_BLOCKS)])
    assert log[0][1] == 1 and log[1][1] == 0
    expected = {"none": [100, 9], "snapshot": [100, 17], "fair-share": [109, 17]}[mode]
    assert durations(fab) == expected


def test_start_in_the_completion_microsecond_sees_the_finishing_transfer():
    # BLIS order: KVTransferStarted (prio 5) runs before KVTransferCompleted (prio 6).
    snap, _ = run("snapshot", [(0, TEN_BLOCKS), (9, TEN_BLOCKS)])
    assert snap.peak_concurrent == 2 and durations(snap) == [9, 17]
    # Fair-share counts it the same way, but the bandwidth is divided by what is really in
    # its bytes phase: A finished at 8.192, so B gets the full link.
    fs, _ = run("fair-share", [(0, TEN_BLOCKS), (9, TEN_BLOCKS)])
    assert fs.peak_concurrent == 2 and durations(fs) == [9, 9]


def test_horizon_cuts_transfers():
    fab, log = run("fair-share", [(0, TEN_BLOCKS), (0, TEN_BLOCKS)], horizon=16)
    assert log == [] and fab.active == 2
    assert fab.transfers_initiated == 2 and fab.transfers_completed == 0
    fab, log = run("snapshot", [(0, TEN_BLOCKS), (0, TEN_BLOCKS)], horizon=16)
    assert log == [(9, 0)] and fab.active == 1


# --------------------------------------------------------------------------- counters
@pytest.mark.parametrize("mode", MODES)
def test_sequential_transfers_mean_depth_exactly_one(mode):
    fab, _ = run(mode, [(0, TEN_BLOCKS), (100, TEN_BLOCKS), (200, TEN_BLOCKS)])
    assert fab.mean_queue_depth == 1.0 and fab.peak_concurrent == 1
    assert fab.transfers_initiated == fab.transfers_completed == 3
    assert fab.active == 0 and not fab.corrupted


@pytest.mark.parametrize("mode", MODES)
def test_overlapping_transfers_depth_and_peak(mode):
    fab, _ = run(mode, [(0, TEN_BLOCKS), (1, TEN_BLOCKS), (2, TEN_BLOCKS), (500, TEN_BLOCKS)])
    assert fab.peak_concurrent == 3
    assert fab.depth_sum == 1 + 2 + 3 + 1 and fab.starts == 4
    assert fab.mean_queue_depth == 7 / 4


def test_no_transfer_mean_depth_zero():
    fab, _ = run("snapshot", [])
    assert fab.mean_queue_depth == 0.0 and fab.peak_concurrent == 0


def test_negative_active_sets_corruption_flag(caplog):
    env = SimEnv(10**6)
    fab = KVTransferFabric(env, bandwidth_gbps=10, base_latency_ms=0, contention="snapshot",
                           on_complete=lambda tr: None)

    def damage(_):
        assert fab.active == 1              # the transfer (finishing at 9) is in flight
        fab.active = 0                      # bookkeeping damaged from outside

    env.call_at(0, KV_TRANSFER_STARTED, lambda _: fab.start("p", TEN_BLOCKS))
    env.call_at(1, KV_TRANSFER_STARTED, damage)
    with caplog.at_level(logging.ERROR, logger="blis_simpy.disagg"):
        run_through_horizon(env)
    assert fab.corrupted and fab.active == 0 and fab.transfers_completed == 1
    assert "negative" in caplog.text


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kw", [
    {"bandwidth_gbps": 0}, {"bandwidth_gbps": -1}, {"bandwidth_gbps": math.nan},
    {"bandwidth_gbps": math.inf}, {"base_latency_ms": -0.001}, {"base_latency_ms": math.nan},
    {"base_latency_ms": math.inf}, {"base_latency_ms": 3.6e9 * 1.0000001},
    {"contention": "fair"}, {"contention": None},
])
def test_invalid_construction(kw):
    args = {"bandwidth_gbps": 25.0, "base_latency_ms": 0.05, "contention": "snapshot",
            "on_complete": print} | kw
    with pytest.raises(ValueError):
        KVTransferFabric(SimEnv(10), **args)


def test_base_latency_upper_bound_is_inclusive():
    fab = KVTransferFabric(SimEnv(10), bandwidth_gbps=1, base_latency_ms=3.6e9,
                           contention="none", on_complete=print)
    assert fab.base_us == 3.6e12


@pytest.mark.parametrize("nbytes", [-1.0, math.nan, math.inf])
def test_invalid_transfer_size(nbytes):
    fab = KVTransferFabric(SimEnv(10), bandwidth_gbps=1, base_latency_ms=0, contention="none",
                           on_complete=print)
    with pytest.raises(ValueError):
        fab.start("p", nbytes)


def test_shared_bandwidth_rejects_out_of_order_joins():
    link = SharedBandwidth(1.0)
    link.add(5.0, 0, 10.0, "a")
    with pytest.raises(ValueError):
        link.add(4.0, 1, 10.0, "b")


# --------------------------------------------------------------------------- processor sharing
def reference_ps(starts, bw: Fraction, base: Fraction) -> list[Fraction]:
    """Exact (rational) processor sharing by remaining bytes: job i joins at start_i + base."""
    joins = sorted(((Fraction(s) + base, i, Fraction(b)) for i, (s, b) in enumerate(starts)))
    remaining: dict[int, Fraction] = {}
    finish: dict[int, Fraction] = {}
    t = Fraction(0)
    k = 0
    while k < len(joins) or remaining:
        n = len(remaining)
        tf = t + min(remaining.values()) * n / bw if n else None
        tj = joins[k][0] if k < len(joins) else None
        if tf is not None and (tj is None or tf <= tj):
            nxt = tf
        else:
            nxt = tj
        if n:
            served = (nxt - t) * bw / n
            for i in remaining:
                remaining[i] -= served
        t = nxt
        for i in [i for i, r in remaining.items() if r == 0]:
            finish[i] = t
            del remaining[i]
        if nxt == tj and (tf is None or tj < tf):
            _, i, b = joins[k]
            k += 1
            remaining[i] = b
            if b == 0:
                finish[i] = t
                del remaining[i]
    return [finish[i] for i in range(len(starts))]


@settings(max_examples=150, deadline=None)
@given(
    starts=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 300_000)), min_size=1, max_size=8),
    bw=st.integers(1, 40),
    base=st.sampled_from([0.0, 0.001, 0.0025, 0.01]),
)
def test_fair_share_matches_exact_processor_sharing(starts, bw, base):
    starts = sorted(starts, key=lambda s: s[0])
    fab, log = run("fair-share", [(s, float(b)) for s, b in starts], bw=float(bw), base=base)
    exact = reference_ps(starts, Fraction(fab.bw), Fraction(fab.base_us))
    eps = Fraction(1, 10**6)
    for tr, f in zip(fab.transfers, exact, strict=True):
        assert abs(Fraction(tr.finish_exact_us) - f) < eps
        lo = max(tr.start_us + 1, math.ceil(f - eps))
        hi = max(tr.start_us + 1, math.ceil(f + eps))
        assert lo <= tr.complete_us <= hi
    # delivered by completion time, ties in start order
    assert log == sorted(log)
    assert fab.transfers_completed == len(starts) and fab.active == 0


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 10**6), min_size=1, max_size=10))
def test_fair_share_simultaneous_never_faster_than_alone_nor_than_work(sizes):
    """All start together: each is at least as slow as alone, and the last one finishes
    exactly when the link has moved every byte (processor sharing is work-conserving)."""
    fab, _ = run("fair-share", [(0, float(b)) for b in sizes])
    for tr, b in zip(fab.transfers, sizes, strict=True):
        assert tr.duration_us >= math.ceil(b / 10_000.0)
    last = max(t.finish_exact_us for t in fab.transfers)
    assert last == pytest.approx(sum(sizes) / 10_000.0, rel=1e-12)
