"""A plugin that misbehaves while the simulation runs is reported as THAT plugin's error:
exit 2, one line naming the scenario key (or flag) that chose it, its family, registered name
and class, and what it returned — never "internal error", never a silently wrong result.

The plugins are defined here and registered by subclassing (importing this module registers
them), so the in-process CLI finds them by name.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from blis_simpy.admission.base import AdmissionPolicy
from blis_simpy.cli.app import app
from blis_simpy.engine.scheduling import ConstantPriority, PriorityPolicy, Scheduler
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


class SchedulerRaises(Scheduler, name="bad-reorder-raises"):
    def reorder(self, queue, now_us):
        raise ValueError("no order")


class TextPriority(PriorityPolicy, name="bad-priority"):
    def priority(self, req, now_us):
        return "high"


class YoungestFirst(ConstantPriority, name="youngest-first"):
    """Leaves ``constant = True`` of its parent, but defines ``priority``: it must be called."""

    def priority(self, req, now_us):
        return float(req.arrival_us)


class AdmitsNone(AdmissionPolicy, name="bad-admit"):
    def admit(self, req, state):
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


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize(("name", "cls", "what"), [
    ("bad-duplicate", "Duplicates", "2 requests before, 3 after, it holds 'request_4' twice"),
    ("bad-lose", "Loses", "2 requests before, 1 after, it lost a queued request"),
    ("bad-swap", "Swaps", "2 requests before, 2 after, it holds 'request_4' twice"),
])
def test_scheduler_that_changes_the_queue_is_caught_by_both_engines(cli, tmp_path, engine, name,
                                                                     cls, what):
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", scenario(tmp_path, engine), "--scheduler", name,
              "--results-path", out)
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
