"""A plugin that misbehaves while the simulation runs is reported as THAT plugin's error:
exit 2, one line naming the scenario key (or flag) that chose it, its family, registered name
and class, and what it returned — never "internal error", never a silently wrong result.

The plugins are defined here and registered by subclassing (importing this module registers
them), so the in-process CLI finds them by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pydantic import BaseModel, model_validator
from typer.testing import CliRunner

from blis_simpy.admission.base import AdmissionPolicy
from blis_simpy.cli.app import app
from blis_simpy.cluster.cluster import Cluster
from blis_simpy.disagg.deciders import DisaggregationDecider
from blis_simpy.disagg.fabric import KVTransferFabric
from blis_simpy.engine.batching import BatchingPolicy
from blis_simpy.engine.fast import FastInstance
from blis_simpy.engine.instance import Instance
from blis_simpy.engine.scheduling import ConstantPriority, PriorityPolicy, Scheduler
from blis_simpy.kv.cache import KVCache
from blis_simpy.latency.base import LatencyModel
from blis_simpy.routing import Router, RoutingDecision, Scorer

MOD = __name__


class Raises(Router, name="bad-raises"):
    def route(self, req, state):
        raise RuntimeError("boom")


class ReturnsNone(Router, name="bad-none"):
    def route(self, req, state):
        return None


class StringTarget(Router, name="bad-string"):
    def route(self, req, state):
        return RoutingDecision("instance_0")


class OutOfRange(Router, name="bad-range"):
    def route(self, req, state):
        return RoutingDecision(len(state.snapshots))


class Negative(Router, name="bad-negative"):
    def route(self, req, state):
        return RoutingDecision(-1)


class Exits(Router, name="bad-exit"):
    """sys.exit() in a plugin is its error, not a silent end of the program with status 0."""

    def route(self, req, state):
        sys.exit(0)


class BuildExits(Router, name="bad-build-exit"):
    def __init__(self, params=None, **kw):
        sys.exit(3)


class ShortensOutputs(Router, name="bad-mutate"):
    """Changes what the client asked for: every request would finish after one token."""

    def route(self, req, state):
        req.output_len = 1
        return RoutingDecision(state.snapshots[0].index)


class NaNScores(Router, name="bad-scores"):
    """Its scores feed the decision trace's regret: NaN there would be silently wrong."""

    def route(self, req, state):
        return RoutingDecision(state.snapshots[0].index, "", {s.id: float("nan") for s in state.snapshots})


class ParamsValidatorRaises(Router, name="bad-params"):
    """A validator raising what pydantic does not turn into a ValidationError."""

    class Params(BaseModel):
        share: float = 0.5

        @model_validator(mode="after")
        def _check(self):
            raise TypeError("share must be a Fraction")

    def route(self, req, state):
        return RoutingDecision(state.snapshots[0].index)


class ObserveRaises(Router, name="bad-observe"):
    def route(self, req, state):
        return RoutingDecision(state.snapshots[0].index)

    def observe(self, req, target):
        raise KeyError(target)


class NaNScore(Scorer, name="bad-nan"):
    def score(self, req, snapshots):
        return [float("nan")] * len(snapshots)


class ShortScore(Scorer, name="bad-short"):
    def score(self, req, snapshots):
        return [0.5]


class HugeScore(Scorer, name="bad-huge"):
    """An int no float can hold: was 'internal error: OverflowError'."""

    def score(self, req, snapshots):
        return [10**400] * len(snapshots)


class RaisingScore(Scorer, name="bad-score-raises"):
    def score(self, req, snapshots):
        return 1 / 0


class Duplicates(Scheduler, name="bad-duplicate"):
    """Puts the head of a queue of two or more in it twice."""

    def reorder(self, queue, now_us):
        if len(queue) >= 2:
            queue.appendleft(queue[0])


class Loses(Scheduler, name="bad-lose"):
    def reorder(self, queue, now_us):
        if len(queue) >= 2:
            queue.pop()


class Swaps(Scheduler, name="bad-swap"):
    """Same length, but the tail is replaced by a second copy of the head."""

    def reorder(self, queue, now_us):
        if len(queue) >= 2:
            queue[-1] = queue[0]


class ReturnsSorted(Scheduler, name="bad-sorted"):
    """Returns a sorted copy instead of sorting in place: the queue would keep its order."""

    def reorder(self, queue, now_us):
        return sorted(queue, key=lambda r: -r.input_len)


class ShrinksPrompts(Scheduler, name="bad-shrink"):
    def reorder(self, queue, now_us):
        for r in queue:
            r.input_len = 1


class SchedulerRaises(Scheduler, name="bad-reorder-raises"):
    def reorder(self, queue, now_us):
        raise ValueError("no order")


class TextPriority(PriorityPolicy, name="bad-priority"):
    def priority(self, req, now_us):
        return "high"


class Backdates(PriorityPolicy, name="bad-backdate"):
    def priority(self, req, now_us):
        req.arrival_us = 0
        return 0.0


class YoungestFirst(ConstantPriority, name="youngest-first"):
    """Leaves ``constant = True`` of its parent, but defines ``priority``: it must be called."""

    def priority(self, req, now_us):
        return float(req.arrival_us)


class AdmitsNone(AdmissionPolicy, name="bad-admit"):
    def admit(self, req, state):
        return None


class AdmitsOne(AdmissionPolicy, name="bad-admit-one"):
    """1 is not a decision (as for a decider): True or False only."""

    def admit(self, req, state):
        return 1, ""


class DecidesNone(DisaggregationDecider, name="bad-decide-none"):
    def decide(self, req):
        return None


class DecidesText(DisaggregationDecider, name="bad-decide-text"):
    def decide(self, req):
        return "yes"


class DecidesNumber(DisaggregationDecider, name="bad-decide-number"):
    """1 is not a decision: True or False only."""

    def decide(self, req):
        return 1


class DecideMutates(DisaggregationDecider, name="bad-decide-mutates"):
    def decide(self, req):
        req.input_tokens[:4] = 0
        return True


class DecideRaises(DisaggregationDecider, name="bad-decide-raises"):
    def decide(self, req):
        raise RuntimeError("no pools today")


class DeciderBuildRaises(DisaggregationDecider, name="bad-decider-build"):
    def __init__(self, params=None, **kw):
        raise ValueError("no threshold")


class DeciderObserveRaises(DisaggregationDecider, name="bad-decider-observe"):
    def decide(self, req):
        return False

    def observe(self, req, instance):
        raise KeyError(instance)


# the simulated machinery: a hook or method of a user subclass that raises, or a latency
# model's duration that is not a whole number of µs >= 0
class HookRaises(FastInstance, name="bad-hook"):
    def on_step_end(self, now_us, step_us, completed):
        super().on_step_end(now_us, step_us, completed)
        raise RuntimeError("hook boom")


class ReferenceHookRaises(Instance, name="bad-reference-hook"):
    def on_step_end(self, now_us, step_us, completed):
        raise RuntimeError("hook boom")


class FinalizeRaises(FastInstance, name="bad-finalize"):
    def finalize(self):
        raise ValueError("no metrics")


class ClusterRaises(Cluster, name="bad-cluster"):
    def on_request_done(self, inst, req, tick_us):
        raise ValueError(f"{req.id} lost")


class Miscounts(Cluster, name="bad-miscounting-cluster"):
    def on_request_done(self, inst, req, tick_us):
        super().on_request_done(inst, req, tick_us)
        self.counters.rejected_at_routing += 1     # a request it never rejected: no exception


class InjectsTwice(FastInstance, name="bad-injects-twice"):
    def inject(self, req, now_us):
        super().inject(req, now_us)
        super().inject(req, now_us)               # the same request twice: no exception here


class FabricRaises(KVTransferFabric, name="bad-fabric"):
    def start(self, parent, nbytes):
        raise OSError("link down")


class NaNStep(LatencyModel, name="bad-nan-step"):
    def step_time_us(self, batch):
        return float("nan")


class NegativeStep(LatencyModel, name="bad-negative-step"):
    def step_time_us(self, batch):
        return -5


class FloatStep(LatencyModel, name="bad-float-step"):
    def step_time_us(self, batch):
        return 1000.5


class StepRaises(LatencyModel, name="bad-step-raises"):
    def step_time_us(self, batch):
        return batch.size // 0


class StepGeneratorExit(LatencyModel, name="bad-generator-exit"):
    """A BaseException that is not an Exception, raised inside the instance's SimPy process."""

    def step_time_us(self, batch):
        raise GeneratorExit


class StepMutates(LatencyModel, name="bad-step-mutates"):
    def step_time_us(self, batch):
        for r in batch.prefill:
            r.max_output_len = 0
        return 1000


class AdmitsNoOne(BatchingPolicy, name="bad-idle"):
    """Schedules nothing: the engine would step forever with its queue full (a hang)."""

    def form_batch(self, a):
        return None


class NeverAllocates(KVCache, name="bad-full"):
    """Claims every allocation fails although the cache is empty: the head never fits."""

    def allocate(self, req, start, end, cached=()):
        return False


class NaNHitRate(KVCache, name="bad-hit-rate"):
    """NaN reached the JSON report, which failed after the results file was written."""

    def cache_hit_rate(self):
        return float("nan")


class FloatStepInstance(FastInstance, name="bad-instance-step"):
    def step_time_us(self, batch):
        return super().step_time_us(batch) / 2


class NoMetrics(FastInstance, name="bad-no-metrics"):
    def finalize(self):
        super().finalize()


class EndlessQueueingTime(LatencyModel, name="bad-endless-queueing"):
    def step_time_us(self, batch):
        return 1000

    def queueing_time_us(self, req):
        return 2**80                      # its request would never arrive (0 injected, exit 0)


class NoQueueingTime(LatencyModel, name="bad-queueing"):
    def step_time_us(self, batch):
        return 1000

    def queueing_time_us(self, req):
        return None


# rate 200/s into 2 instances of 2 running requests each: the wait queues fill up
SCENARIO = """\
seed: 42
model: meta-llama/llama-3.1-8b-instruct
latency:
  model: blackbox
  alpha_coeffs: [10326.268121600151, 0.0, 0.0]
  beta_coeffs: [6472.007648778123, 19.79721387814611, 304.4021040302657]
engine:
  implementation: {engine}
  total_kv_blocks: 2000
  max_num_running_reqs: 2
cluster:
  num_instances: 2
workload:
  kind: distribution
  rate: 200.0
  num_requests: 24
  prompt_tokens: {{mean: 200, stdev: 80, min: 2, max: 600}}
  output_tokens: {{mean: 40, stdev: 20, min: 2, max: 120}}
"""

LATENCY = SCENARIO[SCENARIO.index("latency:"):SCENARIO.index("engine:")]
ROUTERS = "routing policy"
# (flags, the plugin named in the error, what the error says it did)
CASES = {
    "router raises": (["--routing-policy", "bad-raises"], f"{ROUTERS} 'bad-raises' ({MOD}.Raises)",
                      "failed: route() raised RuntimeError: boom"),
    "router returns None": (["--routing-policy", "bad-none"], f"{ROUTERS} 'bad-none' ({MOD}.ReturnsNone)",
                            "returned None from route(); expected a RoutingDecision"),
    "router returns a string target": (
        ["--routing-policy", "bad-string"], f"{ROUTERS} 'bad-string' ({MOD}.StringTarget)",
        "returned target 'instance_0' (str) from route(); expected the index (an int) of one of "
        "the candidate instances [0, 1]"),
    "router index out of range": (
        ["--routing-policy", "bad-range"], f"{ROUTERS} 'bad-range' ({MOD}.OutOfRange)",
        "returned instance index 2 from route(), not one of the candidate instances [0, 1]"),
    "router index negative": (
        ["--routing-policy", "bad-negative"], f"{ROUTERS} 'bad-negative' ({MOD}.Negative)",
        "returned instance index -1 from route(), not one of the candidate instances [0, 1]"),
    "router calls sys.exit": (["--routing-policy", "bad-exit"], f"{ROUTERS} 'bad-exit' ({MOD}.Exits)",
                              "called sys.exit(0) in route()"),
    "router constructor calls sys.exit": (
        ["--routing-policy", "bad-build-exit"], f"{ROUTERS} 'bad-build-exit' ({MOD}.BuildExits)",
        "called sys.exit(3) while being built"),
    "router changes the request": (
        ["--routing-policy", "bad-mutate"], f"{ROUTERS} 'bad-mutate' ({MOD}.ShortensOutputs)",
        "failed: route() raised AttributeError: request_0's output_len is read-only: a plugin "
        "may read the requests it is handed, never change them"),
    "scheduler changes the requests": (
        ["--scheduler", "bad-shrink"], f"scheduler 'bad-shrink' ({MOD}.ShrinksPrompts)",
        "failed: reorder() raised AttributeError: request_0's input_len is read-only: a plugin "
        "may read the requests it is handed, never change them"),
    "priority policy changes the request": (
        ["--scheduler", "priority-fcfs", "--priority-policy", "bad-backdate"],
        f"priority policy 'bad-backdate' ({MOD}.Backdates)",
        "failed: priority() raised AttributeError: request_0's arrival_us is read-only: a "
        "plugin may read the requests it is handed, never change them"),
    "scheduler returns a sorted copy": (
        ["--scheduler", "bad-sorted"], f"scheduler 'bad-sorted' ({MOD}.ReturnsSorted)",
        "returned [RequestView(Request('request_0', arrival=5000, in=55, ou... (list) from "
        "reorder(); a scheduler reorders the queue it is handed in place and returns None"),
    "router returns NaN scores": (
        ["--routing-policy", "bad-scores"], f"{ROUTERS} 'bad-scores' ({MOD}.NaNScores)",
        "returned score nan (float) for instance_0 from route(); expected a number"),
    "scorer returns an int too large for a float": (
        ["--routing-policy", "weighted", "--routing-scorers", "bad-huge:1"],
        f"routing scorer 'bad-huge' ({MOD}.HugeScore)",
        "returned 100000000000000000000000000000000000000000000000000000000... (int) for "
        "instance_0 from score(); expected a number (NaN is not a score)"),
    "admission returns 1": (["--admission-policy", "bad-admit-one"],
                            f"admission policy 'bad-admit-one' ({MOD}.AdmitsOne)",
                            "returned (1, '') (tuple) from admit(); expected a tuple (admitted: "
                            "bool, reason: str)"),
    "router observe raises": (["--routing-policy", "bad-observe"],
                              f"{ROUTERS} 'bad-observe' ({MOD}.ObserveRaises)",
                              "failed: observe() raised KeyError: 0"),
    "scorer returns NaN": (
        ["--routing-policy", "weighted", "--routing-scorers", "bad-nan:1"],
        f"routing scorer 'bad-nan' ({MOD}.NaNScore)",
        "returned nan (float) for instance_0 from score(); expected a number (NaN is not a score)"),
    "scorer returns a short list": (
        ["--routing-policy", "weighted", "--routing-scorers", "queue-depth:1,bad-short:1"],
        f"routing scorer 'bad-short' ({MOD}.ShortScore)",
        "returned 1 scores from score() for 2 instances; expected one per instance"),
    "scorer raises": (["--routing-policy", "weighted", "--routing-scorers", "bad-score-raises:1"],
                      f"routing scorer 'bad-score-raises' ({MOD}.RaisingScore)",
                      "failed: score() raised ZeroDivisionError: division by zero"),
    "scheduler raises": (["--scheduler", "bad-reorder-raises"],
                         f"scheduler 'bad-reorder-raises' ({MOD}.SchedulerRaises)",
                         "failed: reorder() raised ValueError: no order"),
    "priority returns text": (["--priority-policy", "bad-priority"],
                              f"priority policy 'bad-priority' ({MOD}.TextPriority)",
                              "returned 'high' (str) from priority() for request_0; expected a number"),
    "admission returns None": (["--admission-policy", "bad-admit"],
                               f"admission policy 'bad-admit' ({MOD}.AdmitsNone)",
                               "returned None from admit(); expected a tuple (admitted: bool, reason: str)"),
}


# a PD run: 1 prefill + 1 decode instance, every request disaggregated (always)
PD = "disaggregation:\n  prefill_instances: 1\n  decode_instances: 1\n  decider: {policy: always}\n"
DECIDERS = "disaggregation decider"
# (scenario edits (old, new), flags, the error after "error: "; {sc} is the scenario file)
MACHINERY = {
    "decider returns None": (
        [("", PD)], ["--pd-decider", "bad-decide-none"],
        f"--pd-decider: {DECIDERS} 'bad-decide-none' ({MOD}.DecidesNone) returned None from "
        "decide(); expected True (disaggregate) or False"),
    "decider returns a string": (
        [("", PD)], ["--pd-decider", "bad-decide-text"],
        f"--pd-decider: {DECIDERS} 'bad-decide-text' ({MOD}.DecidesText) returned 'yes' (str) "
        "from decide(); expected True (disaggregate) or False"),
    "decider returns a number": (
        [("", PD)], ["--pd-decider", "bad-decide-number"],
        f"--pd-decider: {DECIDERS} 'bad-decide-number' ({MOD}.DecidesNumber) returned 1 (int) "
        "from decide(); expected True (disaggregate) or False"),
    "decider changes the request": (
        [("", PD)], ["--pd-decider", "bad-decide-mutates"],
        f"--pd-decider: {DECIDERS} 'bad-decide-mutates' ({MOD}.DecideMutates) failed: decide() "
        "raised ValueError: assignment destination is read-only"),
    "decider raises": (
        [("", PD.replace("always", "bad-decide-raises"))], [],
        f"{{sc}}:22: disaggregation.decider.policy: {DECIDERS} 'bad-decide-raises' "
        f"({MOD}.DecideRaises) failed: decide() raised RuntimeError: no pools today"),
    "decider constructor raises": (
        [("", PD)], ["--pd-decider", "bad-decider-build"],
        f"--pd-decider: {DECIDERS} 'bad-decider-build' ({MOD}.DeciderBuildRaises) failed to "
        "build: ValueError: no threshold"),
    "decider observe raises": (
        [("", PD)], ["--pd-decider", "bad-decider-observe"],
        f"--pd-decider: {DECIDERS} 'bad-decider-observe' ({MOD}.DeciderObserveRaises) failed: "
        "observe() raised KeyError: 1"),
    "engine hook raises": (
        [("implementation: fast", "implementation: bad-hook")], [],
        f"{{sc}}:8: engine.implementation: engine implementation 'bad-hook' ({MOD}.HookRaises) "
        "failed: on_step_end() raised RuntimeError: hook boom"),
    "reference engine hook raises": (
        [("implementation: fast", "implementation: bad-reference-hook")], [],
        f"{{sc}}:8: engine.implementation: engine implementation 'bad-reference-hook' "
        f"({MOD}.ReferenceHookRaises) failed: on_step_end() raised RuntimeError: hook boom"),
    "engine finalize raises": (
        [("implementation: fast", "implementation: bad-finalize")], [],
        f"{{sc}}:8: engine.implementation: engine implementation 'bad-finalize' "
        f"({MOD}.FinalizeRaises) failed: finalize() raised ValueError: no metrics"),
    "cluster raises": (
        [("  num_instances: 2\n", "  num_instances: 2\n  implementation: bad-cluster\n")], [],
        f"{{sc}}:13: cluster.implementation: cluster 'bad-cluster' ({MOD}.ClusterRaises) failed: "
        "on_request_done() raised ValueError: request_1 lost"),
    "fabric raises": (
        [("", PD + "  transfer: {fabric: bad-fabric}\n")], [],
        f"{{sc}}:23: disaggregation.transfer.fabric: kv transfer fabric 'bad-fabric' "
        f"({MOD}.FabricRaises) failed: start() raised OSError: link down"),
    "latency model returns NaN": (
        [(LATENCY, "latency: {model: bad-nan-step}\n")], [],
        f"{{sc}}:3: latency.model: latency model 'bad-nan-step' ({MOD}.NaNStep) returned nan "
        "(float) from step_time_us(); expected a whole number of microseconds from 0 to 3600000000 (one hour; an int)"),
    "latency model returns a negative step": (
        [(LATENCY, "latency: {model: bad-negative-step}\n")], [],
        f"{{sc}}:3: latency.model: latency model 'bad-negative-step' ({MOD}.NegativeStep) "
        "returned -5 (int) from step_time_us(); expected a whole number of microseconds from 0 "
        "to 3600000000 (one hour; an int)"),
    "latency model returns a float": (
        [(LATENCY, "latency: {model: bad-float-step}\n")], [],
        f"{{sc}}:3: latency.model: latency model 'bad-float-step' ({MOD}.FloatStep) returned "
        "1000.5 (float) from step_time_us(); expected a whole number of microseconds from 0 to 3600000000 (one hour; an int)"),
    "latency model raises": (
        [(LATENCY, "latency: {model: bad-step-raises}\n")], [],
        f"{{sc}}:3: latency.model: latency model 'bad-step-raises' ({MOD}.StepRaises) failed: "
        "step_time_us() raised ZeroDivisionError: integer division or modulo by zero"),
    "latency model raises GeneratorExit": (
        [(LATENCY, "latency: {model: bad-generator-exit}\n")], [],
        f"{{sc}}:3: latency.model: latency model 'bad-generator-exit' ({MOD}.StepGeneratorExit) "
        "failed: step_time_us() raised GeneratorExit"),
    "latency model changes a request": (
        [(LATENCY, "latency: {model: bad-step-mutates}\n")], [],
        f"{{sc}}:3: latency.model: latency model 'bad-step-mutates' ({MOD}.StepMutates) failed: "
        "step_time_us() raised AttributeError: request_0's max_output_len is read-only: a "
        "plugin may read the requests it is handed, never change them"),
    "batching policy schedules nothing forever": (
        [("  total_kv_blocks: 2000\n", "  total_kv_blocks: 2000\n  batching: bad-idle\n")], [],
        f"{{sc}}:10: engine.batching: batching policy 'bad-idle' ({MOD}.AdmitsNoOne) left "
        "instance_0 stuck: 100000 steps in a row from t=125350 us changed nothing while 12 "
        "requests waited (none admitted, completed or dropped); the run would never end"),
    "kv cache never allocates": (
        [("  total_kv_blocks: 2000\n", "  total_kv_blocks: 2000\n  kv_cache: bad-full\n")], [],
        f"{{sc}}:10: engine.kv_cache: kv cache 'bad-full' ({MOD}.NeverAllocates) left "
        "instance_0 stuck: 100000 steps in a row from t=125350 us changed nothing while 12 "
        "requests waited (none admitted, completed or dropped); the run would never end"),
    "kv cache reports a NaN hit rate": (
        [("  total_kv_blocks: 2000\n", "  total_kv_blocks: 2000\n  kv_cache: bad-hit-rate\n")], [],
        f"{{sc}}:10: engine.kv_cache: kv cache 'bad-hit-rate' ({MOD}.NaNHitRate) returned nan "
        "(float) from cache_hit_rate(); expected a number from 0 to 1"),
    "engine step time is a float": (
        [("implementation: fast", "implementation: bad-instance-step")], [],
        f"{{sc}}:8: engine.implementation: engine implementation 'bad-instance-step' "
        f"({MOD}.FloatStepInstance) returned 3780.0 (float) from step_time_us(); "
        "expected a whole number of microseconds from 0 to 3600000000 (one hour; an int)"),
    "engine finalize returns None": (
        [("implementation: fast", "implementation: bad-no-metrics")], [],
        f"{{sc}}:8: engine.implementation: engine implementation 'bad-no-metrics' "
        f"({MOD}.NoMetrics) returned None from finalize(); expected the instance's "
        "InstanceMetrics (return super().finalize())"),
    "latency model queueing time past any run": (
        [(LATENCY, "latency: {model: bad-endless-queueing}\n")], [],
        f"{{sc}}:3: latency.model: latency model 'bad-endless-queueing' ({MOD}.EndlessQueueingTime) "
        "returned 1208925819614629174706176 (int) from queueing_time_us(); expected a whole number "
        "of microseconds from 0 to 3600000000 (one hour; an int)"),
    "latency model queueing time is None": (
        [(LATENCY, "latency: {model: bad-queueing}\n")], [],
        f"{{sc}}:3: latency.model: latency model 'bad-queueing' ({MOD}.NoQueueingTime) returned "
        "None from queueing_time_us(); expected a whole number of microseconds from 0 to 3600000000 (one hour; an int)"),
}


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def scenario(tmp_path, engine: str = "fast"):
    sc = tmp_path / "scenario.yaml"
    sc.write_text(SCENARIO.format(engine=engine))
    return sc


def one_error_line(res, results) -> str:
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    assert res.stdout == "" and "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert not results.exists()
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_misbehaving_plugin_is_its_own_error(cli, tmp_path, case):
    flags, plugin, problem = CASES[case]
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", scenario(tmp_path), *flags, "--results-path", out)
    assert one_error_line(res, out) == f"error: {flags[-2]}: {plugin} {problem}"


@pytest.mark.parametrize("case", sorted(MACHINERY))
def test_misbehaving_decider_engine_cluster_fabric_or_latency_model_is_its_own_error(cli, tmp_path,
                                                                                      case):
    """A decider's result is checked; an exception from a plugin's own code anywhere in the
    run (an instance hook, finalize, a cluster or fabric method, a latency model) is
    attributed to that plugin, on the key or flag that chose it."""
    edits, flags, expected = MACHINERY[case]
    text = SCENARIO.format(engine="fast")
    for old, new in edits:
        text = text.replace(old, new, 1) if old else text + new
    sc = tmp_path / "scenario.yaml"
    sc.write_text(text)
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", sc, *flags, "--results-path", out)
    assert one_error_line(res, out) == "error: " + expected.format(sc=sc)


def test_plugin_module_beside_the_scenario_is_named_in_the_error(tmp_path):
    """The plugin as a user writes it: a module next to the scenario, a fresh process."""
    (tmp_path / "slow_start.py").write_text(
        "from blis_simpy.engine.fast import FastInstance\n\n\n"
        "class SlowStart(FastInstance, name=\"slow-start\"):\n"
        "    def on_step_end(self, now_us, step_us, completed):\n"
        "        self.helper(now_us)\n\n"
        "    def helper(self, now_us):\n"
        "        raise LookupError(f'no step at {now_us}')\n")
    sc = tmp_path / "scenario.yaml"
    sc.write_text("plugins: [slow_start]\n" + SCENARIO.format(engine="slow-start"))
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "blis_simpy", "run", "--scenario", str(sc),
                           "--results-path", str(out)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: {sc}:9: engine.implementation: engine implementation "
                           "'slow-start' (slow_start.SlowStart) failed: helper() raised "
                           "LookupError: no step at 15326\n")
    assert not out.exists()


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize(("name", "cls", "what"), [
    ("bad-duplicate", "Duplicates", "2 requests before, 3 after, it holds 'request_4' twice"),
    ("bad-lose", "Loses", "2 requests before, 1 after, it lost a queued request"),
    ("bad-swap", "Swaps", "2 requests before, 2 after, it holds 'request_4' twice"),
])
def test_scheduler_that_changes_the_queue_is_caught_by_both_engines(cli, tmp_path, engine, name,
                                                                     cls, what):
    out = tmp_path / "results.json"
    # the queue states in the messages: BLIS's synchronous scheduling
    res = cli("run", "--scenario", scenario(tmp_path, engine), "--scheduler", name,
              "--async-scheduling=false", "--results-path", out)
    assert one_error_line(res, out) == (
        f"error: --scheduler: scheduler {name!r} ({MOD}.{cls}) changed the wait queue in "
        f"reorder(): {what}; a scheduler may only reorder the queue")


def test_error_is_located_at_the_scenario_key_that_chose_the_plugin(cli, tmp_path):
    sc = tmp_path / "scenario.yaml"
    sc.write_text(SCENARIO.format(engine="fast").replace(
        "  num_instances: 2\n", "  num_instances: 2\n  routing:\n    policy: bad-range\n"))
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", sc, "--results-path", out)
    assert one_error_line(res, out) == (
        f"error: {sc}:14: cluster.routing.policy: {ROUTERS} 'bad-range' ({MOD}.OutOfRange) "
        "returned instance index 2 from route(), not one of the candidate instances [0, 1]")


def test_priority_plugin_keeping_its_parents_constant_is_still_called(cli, tmp_path):
    """``YoungestFirst`` inherits ``constant = True`` from ConstantPriority but defines
    ``priority``: it is called, so it orders the queue exactly as the built-in inverted-slo
    (youngest first); ConstantPriority itself stays constant."""
    assert YoungestFirst.constant is False and ConstantPriority.constant is True
    sc = scenario(tmp_path)
    runs = {p: cli("run", "--scenario", sc, "--scheduler", "priority-fcfs", "--priority-policy", p,
                   "--format", "json") for p in ("youngest-first", "inverted-slo", "constant")}
    assert all(r.exit_code == 0 for r in runs.values()), [r.stderr for r in runs.values()]
    assert runs["youngest-first"].stdout == runs["inverted-slo"].stdout
    assert runs["youngest-first"].stdout != runs["constant"].stdout


@pytest.mark.parametrize("code", ["3", "0", "'bye'"])
def test_plugin_module_calling_sys_exit_at_import_is_reported(tmp_path, code):
    (tmp_path / "quits.py").write_text(f"import sys\nsys.exit({code})\n")
    sc = tmp_path / "scenario.yaml"
    sc.write_text("plugins: [quits]\n" + SCENARIO.format(engine="fast"))
    proc = subprocess.run([sys.executable, "-m", "blis_simpy", "run", "--scenario", str(sc)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (f"error: {sc}:1: plugins: plugin module 'quits' called "
                           f"sys.exit({eval(code)!r}) while being imported\n")


def test_plugin_whose_params_is_not_a_pydantic_model_fails_at_import(tmp_path):
    """``class Params:`` (a plain class) was 'internal error: AttributeError' at run time."""
    (tmp_path / "plain_params.py").write_text(
        "from blis_simpy.routing import Router, RoutingDecision\n\n\n"
        "class Plain(Router, name=\"plain-params\"):\n"
        "    class Params:\n"
        "        share = 0.5\n\n"
        "    def route(self, req, state):\n"
        "        return RoutingDecision(state.snapshots[0].index)\n")
    sc = tmp_path / "scenario.yaml"
    sc.write_text("plugins: [plain_params]\n" + SCENARIO.format(engine="fast"))
    proc = subprocess.run([sys.executable, "-m", "blis_simpy", "run", "--scenario", str(sc),
                           "--routing-policy", "plain-params"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: {sc}:1: plugins: plugin module 'plain_params' failed to "
                           "import: TypeError: Plain.Params must be a pydantic BaseModel "
                           "subclass, not <class 'plain_params.Plain.Params'>\n")


def test_plugin_params_validator_raising_type_error_is_the_plugins_error(cli, tmp_path):
    """Was 'internal error: TypeError' (pydantic passes a validator's TypeError through)."""
    sc = tmp_path / "scenario.yaml"
    sc.write_text(SCENARIO.format(engine="fast").replace(
        "  num_instances: 2\n",
        "  num_instances: 2\n  routing:\n    policy: bad-params\n    params: {share: 0.2}\n"))
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", sc, "--results-path", out)
    assert one_error_line(res, out) == (
        f"error: {sc}:15: cluster.routing.params: {ROUTERS} 'bad-params' "
        f"({MOD}.ParamsValidatorRaises) failed to validate its parameters: TypeError: share "
        "must be a Fraction")


@pytest.mark.parametrize(("body", "problem"), [
    ("raise RuntimeError('no GPU driver')\n", "failed to load: RuntimeError: no GPU driver"),
    ("import sys\nsys.exit(0)\n", "called sys.exit(0) while loading"),
])
def test_entry_point_plugin_that_fails_to_import_is_one_line(tmp_path, body, problem):
    """A package installed with a ``blis_simpy.plugins`` entry point whose module fails: the
    run stops with one line naming the entry point, exit 2, nothing on stdout."""
    dist = tmp_path / "broken_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[blis_simpy.plugins]\nbroken = broken_mod\n")
    (tmp_path / "broken_mod.py").write_text(body)
    sc = tmp_path / "scenario.yaml"
    sc.write_text(SCENARIO.format(engine="fast"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "blis_simpy", "run", "--scenario", str(sc)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"error: plugin entry point 'broken' (broken_mod) {problem}\n"


def test_entry_point_plugin_is_found_by_a_scenario_without_a_plugins_key(tmp_path):
    """An installed entry point's classes are known to ``validate`` and ``run --scenario``
    although the scenario lists no ``plugins:`` (entry points were loaded only with one,
    so the router was 'unknown' to both)."""
    dist = tmp_path / "good_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: good-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[blis_simpy.plugins]\ngood = good_mod\n")
    (tmp_path / "good_mod.py").write_text(
        "from blis_simpy.routing.base import RoundRobin\n\n\n"
        "class EntryPointRouter(RoundRobin, name='ep-round-robin'):\n    pass\n")
    sc = tmp_path / "scenario.yaml"
    sc.write_text("model: meta-llama/llama-3.1-8b-instruct\nhardware: H100\n"
                  "latency: {model: blackbox}\ncluster:\n  num_instances: 2\n"
                  "  routing: {policy: ep-round-robin}\nworkload: {num_requests: 4}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for args in (["validate", str(sc)], ["run", "--scenario", str(sc), "--format", "json"]):
        proc = subprocess.run([sys.executable, "-m", "blis_simpy", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=env)
        assert (proc.returncode, proc.stderr) == (0, ""), args
    assert json.loads(proc.stdout)["cluster"]["completed_requests"] == 4


def test_a_broken_invariant_in_a_run_with_plugins_names_them(cli, tmp_path):
    """A plugin that breaks the simulator's rules without raising shows up as a simulation
    or invariant error (exit 1); the error names the plugin code the run calls."""
    sc = tmp_path / "scenario.yaml"
    sc.write_text(SCENARIO.format(engine="fast").replace(
        "  num_instances: 2\n", "  num_instances: 2\n  implementation: bad-miscounting-cluster\n"))
    res = cli("run", "--scenario", sc, "--results-path", tmp_path / "r.json")
    assert res.exit_code == 1 and res.stdout == ""
    line, = res.stderr.splitlines()
    assert line.startswith("error: simulation error: control-plane counters inconsistent: ")
    assert line.endswith(f"(this run calls plugin code, check it first: cluster "
                         f"'bad-miscounting-cluster' ({MOD}.Miscounts))")
    assert not (tmp_path / "r.json").exists()


def test_an_internal_error_in_a_run_with_plugins_names_them(cli, tmp_path):
    """Our code failing on what a plugin did, with no plugin frame raising (an engine that
    injects each request twice): a simulation error naming the plugin, not a bare
    'internal error' (exit 1); the traceback is there with --log debug."""
    sc = tmp_path / "scenario.yaml"
    sc.write_text(SCENARIO.format(engine="bad-injects-twice"))
    res = cli("run", "--scenario", sc, "--results-path", tmp_path / "r.json")
    assert res.exit_code == 1 and res.stdout == ""
    line, = res.stderr.splitlines()
    assert line.startswith("error: simulation error: internal error: ")
    assert line.endswith(f"(this run calls plugin code, check it first: engine implementation "
                         f"'bad-injects-twice' ({MOD}.InjectsTwice))")
    assert not (tmp_path / "r.json").exists()
