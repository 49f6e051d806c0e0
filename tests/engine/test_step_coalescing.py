"""Step coalescing in the fast engine (docs/performance.md, "Step coalescing").

A step due before every other event runs inline (no SimPy event), and a pure-decode step
takes the short path :meth:`FastInstance._decode_tick`. Neither may change a result: each
case here runs the literal reference engine (one event per step, no short path) and the
fast engine and compares every counter, latency and ITL sample — and checks that the short
path and the inline steps were actually taken, so the comparison is not vacuous.
"""

from __future__ import annotations

import pytest

from blis_simpy.cluster.cluster import Cluster
from blis_simpy.engine.fast import FastInstance
from blis_simpy.run.simulation import Simulation
from tests.engine.helpers import make_requests, run, scenario
from tests.engine.test_fast_vs_reference import FIELDS, _snapshot


def _both(specs, horizon_us=None, instance_class=None, **engine):
    out = {}
    for impl in ("reference", "fast"):
        sim = Simulation(scenario(implementation=impl, **engine), make_requests(specs, seed=3),
                         horizon_us=horizon_us,
                         **({"instance_class": instance_class} if impl == "fast" and instance_class else {}))
        res = sim.run()
        out[impl] = (_snapshot(res.instances[0]), sim.instances[0], res.events_processed)
    return out


def _assert_equal(out):
    ref, fast = out["reference"][0], out["fast"][0]
    for f in (*FIELDS, "unfinished", "first_itl"):
        assert fast[f] == ref[f], f"{f} differs: fast={fast[f]!r} reference={ref[f]!r}"


def test_long_decode_runs_take_the_short_path_and_agree():
    # 6 requests with 400-token outputs, arrivals 0..50 ms: after the last prefill every
    # step is pure decode until the completions.
    specs = [(i * 10_000, 50 + 7 * i, 400 - 13 * i) for i in range(6)]
    out = _both(specs, block_size=4, total_kv_blocks=2000)
    _assert_equal(out)
    ref_inst, fast_inst = out["reference"][1], out["fast"][1]
    steps = fast_inst.metrics.step_samples
    assert steps == ref_inst.metrics.step_samples > 390
    assert fast_inst.decode_ticks > 0.9 * steps           # the short path ran
    assert out["fast"][2] < out["reference"][2] / 10      # most steps were inline
    assert out["reference"][2] > steps                    # the reference: an event per step


def test_short_path_stops_at_kv_pressure_timeouts_and_the_horizon():
    # tight KV (preemption), deadlines and a horizon cut in the middle of the decode run
    specs = [(i * 3_000, 40, 120, (80_000 + i * 15_000) if i % 2 else 0) for i in range(8)]
    for horizon in (None, 120_000):
        out = _both(specs, horizon_us=horizon, block_size=4, total_kv_blocks=150,
                    max_num_running_reqs=8)
        _assert_equal(out)
        m = out["fast"][0]
        assert m["timed_out_requests"] > 0
        assert m["preemption_count"] > 0
        assert out["fast"][1].decode_ticks > 0


class Hooked(FastInstance, name="test-hooked-coalescing"):
    """Overrides a step hook: the short path must step aside (the hook has to run)."""

    calls = 0

    def on_step_end(self, now_us, step_us, completed):
        type(self).calls += 1


def test_a_hooked_instance_runs_every_step_the_ordinary_way():
    specs = [(i * 10_000, 50, 200) for i in range(4)]
    out = _both(specs, instance_class=Hooked, block_size=16)
    _assert_equal(out)
    inst = out["fast"][1]
    assert inst.decode_ticks == 0
    assert Hooked.calls == inst.metrics.step_samples


def test_multi_instance_cluster_agrees():
    specs = [(i * 4_000, 30 + i, 150 + 5 * i) for i in range(12)]
    res = {}
    for impl in ("reference", "fast"):
        r = run(scenario(implementation=impl, num_instances=3, block_size=8),
                make_requests(specs, seed=5))
        res[impl] = [_snapshot(m) for m in r.instances]
    assert res["fast"] == res["reference"]


def test_output_blocks_filled_in_the_short_path_are_prefix_cache_hits_later():
    # A decodes 200 tokens alone (short path); B, after A is done, sends A's prompt and
    # outputs plus 20 new tokens: its cached prefix must include the blocks the short path
    # filled with A's outputs (block size 4: A's 40 + 200 tokens are 60 full blocks).
    import numpy as np

    from blis_simpy.request import Request
    rng = np.random.default_rng(11)
    a_in = rng.integers(0, 1000, 40, dtype=np.int32)
    a_out = rng.integers(0, 1000, 200, dtype=np.int32)
    b_in = np.concatenate((a_in, a_out, rng.integers(0, 1000, 20, dtype=np.int32)))
    hits = {}
    for impl in ("reference", "fast"):
        reqs = [Request("a", 0, a_in, a_out), Request("b", 2_000_000, b_in, a_out[:5])]
        sim = Simulation(scenario(implementation=impl, block_size=4), reqs)
        sim.run()
        inst = sim.instances[0]
        hits[impl] = inst.kv.cache_hits
        if impl == "fast":
            assert inst.decode_ticks > 150
    # a's KV holds its 40 prompt and 200 output slots (the completion pass reserves the
    # last one): 60 full blocks, all of them prefix-cache hits for b
    assert hits["fast"] == hits["reference"] == 60


def test_pure_decode_steps_run_back_to_back_in_one_call(monkeypatch):
    # With the built-in (quiet) listener, a run of pure-decode steps due before every other
    # event is one _decode_tick call: far fewer calls than short-path steps, same results.
    calls = []
    real = FastInstance._decode_tick

    def counting(self, now_us):
        calls.append(now_us)
        return real(self, now_us)

    monkeypatch.setattr(FastInstance, "_decode_tick", counting)
    specs = [(i * 10_000, 50 + 7 * i, 400 - 13 * i) for i in range(6)]
    out = _both(specs, block_size=4, total_kv_blocks=2000)
    _assert_equal(out)
    ticks = out["fast"][1].decode_ticks
    assert ticks > 300 and len(calls) < ticks / 10


class _CountingCluster(Cluster, name="test-counting-event-end"):
    """A listener that acts after every instance event: the engine may not skip it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.event_ends = []

    def on_event_end(self, inst) -> None:
        self.event_ends.append(inst.env.now)


def _event_ends(cluster_class) -> dict:
    """The times of every ``on_event_end`` call of a ``cluster_class`` run, per engine
    implementation (the fast one checked to take the short path)."""
    specs = [(i * 10_000, 50 + 7 * i, 400 - 13 * i) for i in range(6)]
    ends = {}
    for impl in ("reference", "fast"):
        sim = Simulation(scenario(implementation=impl, block_size=4, total_kv_blocks=2000),
                         make_requests(specs, seed=3), cluster_class=cluster_class)
        sim.run()
        ends[impl] = sim.cluster.event_ends
        if impl == "fast":
            assert sim.instances[0].decode_ticks > 300
    return ends


def test_a_listener_that_acts_after_each_event_sees_every_step():
    assert Cluster.quiet_steps and not _CountingCluster.quiet_steps
    ends = _event_ends(_CountingCluster)
    # one call after every step and every other instance event, at the same times
    assert ends["fast"] == ends["reference"]


class _EventEndRecorder:
    """A mixin (not a listener itself) that acts after every instance event."""

    def on_event_end(self, inst) -> None:
        self.event_ends.append(inst.env.now)


class _MixedInCluster(_EventEndRecorder, Cluster, name="test-mixed-in-event-end"):
    """``on_event_end`` comes from a mixin: the class does not define it itself, but it
    overrides the quiet one it inherits all the same."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.event_ends = []


def test_an_on_event_end_from_a_mixin_is_not_quiet():
    assert not _MixedInCluster.quiet_steps
    ends = _event_ends(_MixedInCluster)
    assert ends["fast"] == ends["reference"]


class _KVRecorder(FastInstance, name="test-record-kv-every-step"):
    """Overrides the per-step KV bookkeeping: it must run after every step, fused or not
    (the short path calls it: the class declares the short path safe)."""

    short_path_safe = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.recorded = []

    def _record_kv(self, step_us: int) -> None:
        self.recorded.append(step_us)
        super()._record_kv(step_us)


def test_an_instance_overriding_the_step_bookkeeping_runs_it_every_step():
    specs = [(i * 10_000, 50 + 7 * i, 400 - 13 * i) for i in range(6)]
    out = _both(specs, instance_class=_KVRecorder, block_size=4, total_kv_blocks=2000)
    _assert_equal(out)
    inst = out["fast"][1]
    assert inst.decode_ticks > 300                       # the short path calls it too
    assert len(inst.recorded) == inst.metrics.step_samples > 300


class _OwnLoop(FastInstance, name="test-own-steps-loop"):
    """Overrides the instance loop: its code must run between steps, so nothing is fused
    (its steps are the built-in ones: it declares the short path safe)."""

    short_path_safe = True

    def _steps(self):
        return (yield from super()._steps())


def test_an_instance_overriding_the_loop_is_not_fused(monkeypatch):
    # (a plugin engine's step is also wrapped by the stall guard, which alone stops the
    # fusion: without the guard, the overridden loop must stop it)
    import blis_simpy.run.simulation as simulation
    monkeypatch.setattr(simulation, "watch_for_stall", lambda *a, **kw: None)
    calls = []
    real = FastInstance._decode_tick
    monkeypatch.setattr(FastInstance, "_decode_tick",
                        lambda self, now_us: calls.append(now_us) or real(self, now_us))
    specs = [(i * 10_000, 50 + 7 * i, 400 - 13 * i) for i in range(6)]
    out = _both(specs, instance_class=_OwnLoop, block_size=4, total_kv_blocks=2000)
    _assert_equal(out)
    inst = out["fast"][1]
    assert len(calls) == inst.decode_ticks > 300         # one short-path step per call


def test_runs_of_pure_decode_steps_timed_by_the_models_decode_function(monkeypatch):
    # the default physics backend gives the engine a function of the context for runs of
    # pure-decode steps; results equal the reference engine's, which times every step
    from blis_simpy.config.scenario import Scenario
    from blis_simpy.latency.physics import PhysicsModel

    made = []
    real = PhysicsModel.decode_step_fn

    def recording(self, size, count):
        f = real(self, size, count)
        made.append(f is not None)
        return f

    monkeypatch.setattr(PhysicsModel, "decode_step_fn", recording)
    specs = [(i * 10_000, 50 + 7 * i, 400 - 13 * i) for i in range(6)]
    out = {}
    for impl in ("reference", "fast"):
        sc = Scenario(model="meta-llama/llama-3.1-8b-instruct", hardware="H100", tp=2,
                      latency={"model": "physics"},
                      engine={"total_kv_blocks": 2000, "block_size": 4, "implementation": impl})
        sim = Simulation(sc, make_requests(specs, seed=3))
        res = sim.run()
        out[impl] = (_snapshot(res.instances[0]), sim.instances[0])
    _assert_equal(out)
    assert out["fast"][1].decode_ticks > 300 and made and all(made)


def test_a_step_time_set_on_the_model_object_sees_every_step():
    # (a wrapper around the model is covered by tests/engine/test_preemption_models.py)
    sc = scenario(block_size=4, total_kv_blocks=2000)
    specs = [(i * 10_000, 50 + 7 * i, 400 - 13 * i) for i in range(6)]
    sim = Simulation(sc, make_requests(specs, seed=3))
    inst = sim.instances[0]
    seen = []
    real = inst.latency.step_time_us
    inst.latency.step_time_us = lambda view: seen.append(view.size) or real(view)
    sim.run()
    assert inst.decode_ticks > 300
    assert len(seen) == inst.metrics.step_samples


@pytest.mark.parametrize("backend", ["physics", "blackbox"])
def test_a_step_time_patched_onto_the_model_class_sees_every_step(monkeypatch, backend):
    # the model's pure-decode function stands for the class's own step only: a step
    # patched onto the class (a spy, a slower step) runs at every step, as in the reference
    from blis_simpy.config.scenario import Scenario
    from blis_simpy.latency.blackbox import BlackboxModel
    from blis_simpy.latency.physics import PhysicsModel

    cls = PhysicsModel if backend == "physics" else BlackboxModel
    real = cls.step_time_us
    calls = []
    monkeypatch.setattr(cls, "step_time_us", lambda self, view: calls.append(1) or real(self, view) + 1)
    latency = ({"model": "physics"} if backend == "physics" else
               {"model": "blackbox", "alpha_coeffs": [100.0, 1.0, 50.0], "beta_coeffs": [1000.0, 10.0, 5.0]})
    specs = [(i * 10_000, 50 + 7 * i, 400 - 13 * i) for i in range(6)]
    out = {}
    for impl in ("reference", "fast"):
        calls.clear()
        sc = Scenario(model="meta-llama/llama-3.1-8b-instruct", hardware="H100", tp=2, latency=latency,
                      engine={"total_kv_blocks": 2000, "block_size": 4, "implementation": impl})
        sim = Simulation(sc, make_requests(specs, seed=3))
        res = sim.run()
        out[impl] = (_snapshot(res.instances[0]), sim.instances[0])
        assert len(calls) == sim.instances[0].metrics.step_samples
    _assert_equal(out)
    assert out["fast"][1].decode_ticks > 300


def _runs_with_patched_instance(specs, patch) -> dict:
    """Run ``specs`` on both engines, ``patch(inst)`` applied to the instance object before
    the run (it returns what it records); per implementation: (snapshot, instance, record)."""
    out = {}
    for impl in ("reference", "fast"):
        sim = Simulation(scenario(implementation=impl, block_size=4, total_kv_blocks=2000),
                         make_requests(specs, seed=3))
        inst = sim.instances[0]
        record = patch(inst)
        res = sim.run()
        out[impl] = (_snapshot(res.instances[0]), inst, record)
    return out


def test_a_step_hook_set_on_the_engine_object_runs_every_step():
    # hooks set on the instance object (not its class) before the run count as overrides
    def patch(inst):
        seen = []
        real = inst.step_time_us
        inst.step_time_us = lambda view: seen.append(1) or real(view) + 1
        return seen

    out = _runs_with_patched_instance([(i * 10_000, 50 + 7 * i, 400 - 13 * i) for i in range(6)],
                                      patch)
    _assert_equal(out)
    for _, inst, seen in out.values():
        assert len(seen) == inst.metrics.step_samples > 300
    assert out["fast"][1].decode_ticks > 300     # the short path calls the engine's hook


def test_an_on_step_end_set_on_the_engine_object_sees_materialised_state():
    # such a hook sees the request state the reference engine shows it, as a subclass's
    # on_step_end does (the fast engine materialised it only for a class override)
    def patch(inst):
        log = []

        def hook(now_us, step_us, completed):
            log.append((now_us, [(r.id, r.pi, r.kv_len) for r in completed],
                        [(r.id, r.pi, r.kv_len, r.num_new_tokens) for r in inst.running]))

        inst.on_step_end = hook
        return log

    out = _runs_with_patched_instance([(i * 10_000, 50 + 7 * i, 60 - 3 * i) for i in range(6)],
                                      patch)
    for _, inst, log in out.values():
        assert len(log) == inst.metrics.step_samples > 50
    assert out["fast"][2] == out["reference"][2]
