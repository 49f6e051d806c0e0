"""The fast engine must reproduce the literal reference engine exactly.

:class:`~blis_simpy.engine.instance.Instance` follows docs/engine.md request by request; it
reproduces every A* conformance case. :class:`~blis_simpy.engine.fast.FastInstance`
advances decoding requests lazily. On random workloads chosen to hit chunked prefill,
budget exhaustion, preemption, prefix-cache hits, MaxModelLen caps and timeouts, every
counter, every per-request latency and the full ITL histogram must be identical — under
both recompute-preemption models (``vllm``, the default, and ``blis``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from blis_simpy.engine import lazy_ledger
from blis_simpy.request import COMPLETED, TIMED_OUT
from blis_simpy.run.simulation import Simulation
from tests.engine.helpers import make_requests, run, scenario

FIELDS = ("completed_requests", "total_input_tokens", "total_output_tokens", "ttft_sum",
          "sim_ended_time", "kv_blocks_integral", "peak_kv_blocks", "preemption_count",
          "kv_allocation_failures", "cache_hit_rate", "still_queued", "still_running",
          "dropped_unservable", "length_capped_requests", "timed_out_requests", "ttft", "itl",
          "scheduling_delay", "e2e", "completion_time", "all_itls", "step_counters_sum",
          "waitq_len_sum", "running_len_sum", "step_samples")


def _snapshot(m):
    snap = {f: getattr(m, f) for f in FIELDS}
    # unfinished requests (horizon cut, timed out): their state and ITL samples so far
    snap["unfinished"] = {rid: (r.state, list(r.itl)) for rid, r in m.registry.items()
                          if r.state != COMPLETED}
    snap["first_itl"] = {rid: r.first_itl_us for rid, r in m.registry.items()}
    return snap


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 40))
    groups = draw(st.sampled_from([{}, {"g": 48}, {"g": 33, "h": 64}]))
    specs = []
    t = 0
    for _ in range(n):
        t += draw(st.integers(0, 30_000))
        n_in = draw(st.integers(0, 300))
        n_out = draw(st.integers(0, 60))
        deadline = draw(st.sampled_from([0, 0, 0, t + draw(st.integers(1, 400_000))]))
        group = draw(st.sampled_from(["", *sorted(groups)])) if groups else ""
        specs.append((t, n_in, n_out, deadline, group))
    engine = {
        "block_size": draw(st.sampled_from([1, 2, 4, 16])),
        "total_kv_blocks": draw(st.integers(40, 400)),
        "max_num_running_reqs": draw(st.integers(1, 16)),
        "max_num_scheduled_tokens": draw(st.integers(8, 600)),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 16, 100])),
        "max_model_len": draw(st.sampled_from([0, 0, 200, 400])),
        "scheduler": draw(st.sampled_from(["fcfs", "fcfs", "sjf", "priority-fcfs"])),
        "priority_policy": draw(st.sampled_from(["constant", "slo-based"])),
        "preemption_model": draw(st.sampled_from(["vllm", "blis"])),
    }
    bs = engine["block_size"]
    if engine["max_model_len"]:
        engine["total_kv_blocks"] = max(engine["total_kv_blocks"], -(-engine["max_model_len"] // bs))
    seed = draw(st.integers(0, 2**31))
    horizon = draw(st.sampled_from([None, None, t // 2 + 1, t + 50_000]))
    return specs, groups, engine, seed, horizon


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_fast_engine_equals_reference(w):
    _assert_same(*w)


def _assert_same(specs, groups, engine, seed, horizon):
    results = {}
    for impl in ("reference", "fast"):
        reqs = make_requests(specs, seed=seed, prefixes=groups)
        res = run(scenario(implementation=impl, **engine), reqs, horizon_us=horizon)
        results[impl] = _snapshot(res.instances[0])
    ref, fast = results["reference"], results["fast"]
    for f in (*FIELDS, "unfinished", "first_itl"):
        assert fast[f] == ref[f], f"{f} differs: fast={fast[f]!r} reference={ref[f]!r}"
    return ref


@st.composite
def preemption_heavy(draw):
    """Overlapping requests with long outputs on a KV cache that holds any one of them but
    far from all: running requests outgrow it and are preempted, often repeatedly."""
    bs = draw(st.sampled_from([1, 2, 4, 8]))
    groups = draw(st.sampled_from([{}, {"g": 16}]))
    specs = []
    t = 0
    for _ in range(draw(st.integers(2, 14))):
        t += draw(st.integers(0, 3_000))
        group = draw(st.sampled_from(["", *sorted(groups)])) if groups else ""
        specs.append((t, draw(st.integers(0, 40)), draw(st.integers(2, 80)), 0, group))
    need = [-(-(n_in + groups.get(g, 0) + n_out) // bs) for _, n_in, n_out, _, g in specs]
    engine = {
        "block_size": bs,
        "total_kv_blocks": draw(st.integers(max(need), max(max(need), sum(need) // 2))),
        "max_num_running_reqs": draw(st.integers(2, 16)),
        "max_num_scheduled_tokens": draw(st.integers(16, 256)),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 8])),
        "scheduler": draw(st.sampled_from(["fcfs", "fcfs", "sjf"])),
    }
    return specs, groups, engine, draw(st.integers(0, 2**31))


@pytest.mark.parametrize("model", ["vllm", "blis"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=preemption_heavy())
def test_fast_engine_equals_reference_under_preemption(model, w):
    specs, groups, engine, seed = w
    ref = _assert_same(specs, groups, {**engine, "preemption_model": model}, seed, None)
    n = ref["preemption_count"]
    event("no preemption" if n == 0 else "1-9 preemptions" if n < 10 else "10+ preemptions")


def test_preemption_heavy_long_outputs_finish():
    """BLIS leaks a request's blocks when a decode allocation fails and then livelocks.

    Here 12 requests with long outputs share 60 blocks of 4 tokens: decode allocations
    fail all the time, preemption recomputes, and every request must still finish with
    the KV cache fully free at the end.
    """
    specs = [(i * 1000, 40, 120) for i in range(12)]
    for impl in ("reference", "fast"):
        reqs = make_requests(specs, seed=7)
        sc = scenario(implementation=impl, block_size=4, total_kv_blocks=60,
                      max_num_running_reqs=8, max_num_scheduled_tokens=256)
        res = run(sc, reqs)
        m = res.instances[0]
        assert m.completed_requests == 12
        assert m.preemption_count > 20
        assert m.still_running == 0 and m.still_queued == 0


class _Recorder:
    """Wraps a latency model and records each step's per-request batch entries."""

    def __init__(self, inner, log):
        self.inner, self.log = inner, log

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step_time_us(self, batch):
        self.log.append((list(batch.entries()), batch.decode_count, batch.decode_tokens,
                         batch.decode_pi_sum, batch.size, batch.prefill_tokens))
        return self.inner.step_time_us(batch)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_batch_views_agree(w):
    """Both engines show latency models the same batch, request by request."""
    from blis_simpy.run.simulation import Simulation
    specs, groups, engine, seed, horizon = w
    logs = {}
    for impl in ("reference", "fast"):
        sim = Simulation(scenario(implementation=impl, **engine),
                         make_requests(specs, seed=seed, prefixes=groups), horizon_us=horizon)
        log = logs[impl] = []
        for inst in sim.instances:
            inst.latency = _Recorder(inst.latency, log)
        sim.run()
    assert logs["fast"] == logs["reference"]
    for entries, count, tokens, pi_sum, _size, pf_tokens in logs["fast"]:
        dec = [e for e in entries if not e[0]]
        assert count == len(dec) and tokens == sum(e[2] for e in dec)
        assert pi_sum == sum(e[1] for e in dec)
        assert pf_tokens == sum(e[2] for e in entries if e[0])


# ------------------------------------------------------------------- per-tick history compaction
# The fast engine drops the per-tick arrays' ticks no request can read any more every
# COMPACT_TICKS ticks (65,536: never in these small runs). Compacting every 2 ticks instead must
# change nothing: the same workloads (timeouts, horizon cuts, preemption of both models, which
# read old ticks) give the reference engine's results exactly.
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_compacting_every_two_ticks_changes_nothing(w):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lazy_ledger, "COMPACT_TICKS", 2)
        _assert_same(*w)


@pytest.mark.parametrize("model", ["vllm", "blis"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=preemption_heavy(), deadlines=st.lists(st.sampled_from([0, 0, 5_000, 30_000, 100_000]),
                                                min_size=14, max_size=14))
def test_compacting_under_preemption_changes_nothing(model, w, deadlines):
    """Heavy preemption with deadlines: requests recompute, time out while queued, and leave
    for good with segments and recompute gaps the compaction must spell out first."""
    specs, groups, engine, seed = w
    specs = [(t, n_in, n_out, t + d if d else 0, g)
             for (t, n_in, n_out, _, g), d in zip(specs, deadlines, strict=False)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lazy_ledger, "COMPACT_TICKS", 2)
        _assert_same(specs, groups, {**engine, "preemption_model": model}, seed, None)


def test_compaction_spells_out_a_timed_out_requests_recompute_gaps():
    """Found by review: request_7 is preempted right after its first token, recomputes twice
    and times out while queued: its only ITL samples are the two recompute gaps (no tick
    segment). Compaction must keep them (10,590 and 52,365 us, as the reference engine)."""
    specs = [(1078, 6, 69, 0, ""), (1555, 27, 4, 25817, ""), (4286, 21, 74, 65348, ""),
             (4662, 18, 14, 0, ""), (4849, 20, 50, 7598, ""), (7084, 15, 45, 102776, ""),
             (8947, 3, 29, 159409, ""), (9815, 14, 36, 73003, ""), (10804, 38, 5, 0, ""),
             (11442, 20, 47, 23411, "")]
    eng = {"block_size": 4, "total_kv_blocks": 27, "max_num_running_reqs": 13, "async_scheduling": False,
           "max_num_scheduled_tokens": 144, "preemption_model": "vllm"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lazy_ledger, "COMPACT_TICKS", 2)
        ref = _assert_same(specs, {}, eng, 1775813183, None)
    assert ref["unfinished"]["request_7"] == (TIMED_OUT, [10590, 52365])


def test_compaction_really_drops_ticks():
    """60 requests of 40-token outputs, 2 ms apart, through one instance: with compaction
    every 2 ticks the arrays keep only the live window (the tests above would pass vacuously
    if nothing were ever dropped)."""
    specs = [(i * 2_000, 30, 40, 0, "") for i in range(60)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lazy_ledger, "COMPACT_TICKS", 2)
        sim = Simulation(scenario(implementation="fast", block_size=4, total_kv_blocks=400,
                                  max_num_running_reqs=8, max_num_scheduled_tokens=256,
                                  async_scheduling=False),    # the counts below: synchronous
                         make_requests(specs, seed=1))
        res = sim.run()
    led = sim.instances[0].ledger
    assert res.instances[0].completed_requests == 60
    # 326 ticks; only the last request's 40 decode ticks (which it may still read) are kept
    assert (led.T, led.base) == (326, 286)
    assert len(led.tick_end) == led.T - led.base == len(led.tick_cum) - 1 == len(led.cov) - 1
