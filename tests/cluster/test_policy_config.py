"""``--policy-config`` (strict YAML, docs/control-plane.md), the control-plane flags and their precedence:
explicit flag > non-empty bundle value > scenario file > default."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from blis_simpy.cli.runner import prepare
from blis_simpy.deploy.policy import load_policy_bundle
from blis_simpy.errors import ConfigError
from tests.cli.support import LOCATED, SMALL_SCENARIO, trace_row, write_trace_files


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "small.yaml"
    p.write_text(SMALL_SCENARIO.replace("engine:\n", "cluster:\n  num_instances: 3\nengine:\n"))
    return p


def bundle(tmp_path, text: str, name: str = "policy.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def located(line: str) -> dict:
    m = LOCATED.match(line)
    assert m, line
    return m.groupdict()


# ------------------------------------------------------------------------ strict YAML
@pytest.mark.parametrize("text, line, field, words", [
    ("admission:\n  policy: token-bucket\n  bogus: 1\n", 3, "admission.bogus", "unknown key"),
    ("routing:\n  policy: weighted\nnode_pools: {}\n", 3, "node_pools", "unknown key"),
    ("admission:\n  policy: nope\n", 2, "admission.policy", "unknown admission policy 'nope'"),
    ("scheduler: lifo\n", 1, "scheduler", "unknown scheduler 'lifo'"),
    ("priority:\n  policy: 3\n", 2, "priority.policy", "string"),
    ("admission:\n  token_bucket_capacity: -5\n", 2, "admission.token_bucket_capacity", "greater than or equal to 0"),
    ("admission:\n  token_bucket_refill_rate: .inf\n", 2, "admission.token_bucket_refill_rate", "finite"),
    ("admission:\n  tier_shed_min_priority: 7\n", 2, "admission.tier_shed_min_priority", "less than or equal to 4"),
    ("routing:\n  scorers:\n    - {name: queue-depth, weight: 1}\n    - {name: queue-depth, weight: 2}\n",
     4, "routing.scorers[1]", "duplicate scorer"),
    ("routing:\n  scorers:\n    - {name: queue-depth, weight: 0}\n", 3, "routing.scorers[0]", "finite and > 0"),
    ("routing:\n  scorers:\n    - {name: mystery, weight: 1}\n", 3, "routing.scorers[0]", "unknown scorer"),
    ("routing:\n  scorers:\n    - {name: queue-depth}\n", 3, "routing.scorers[0].weight", "missing"),
])
def test_bundle_is_strict_and_errors_are_located(cli, tmp_path, small, text, line, field, words):
    p = bundle(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_policy_bundle(str(p))
    assert (exc.value.line, exc.value.field) == (line, field)
    res = cli("run", "--scenario", small, "--policy-config", p, "--format", "blis")
    assert res.exit_code == 2 and res.stdout == ""
    got = located(res.stderr.strip())
    assert (got["file"], int(got["line"]), got["field"]) == (str(p), line, field)
    assert words in got["problem"]


def test_bundle_must_exist_and_be_a_mapping(cli, tmp_path, small):
    res = cli("run", "--scenario", small, "--policy-config", tmp_path / "missing.yaml")
    assert res.exit_code == 2
    assert res.stderr.strip().endswith("--policy-config: no such file")
    p = bundle(tmp_path, "- admission\n")
    res = cli("run", "--scenario", small, "--policy-config", p)
    assert res.exit_code == 2 and "must be a mapping" in res.stderr


def test_empty_bundle_changes_nothing(tmp_path, small):
    p = bundle(tmp_path, "")
    s = prepare("run", {"--policy-config": str(p)}, str(small)).scenario
    assert (s.cluster.admission.policy, s.cluster.routing.policy) == ("always-admit", "round-robin")


# ------------------------------------------------------------------------ precedence
FULL = """\
admission:
  policy: token-bucket
  token_bucket_capacity: 5000
  token_bucket_refill_rate: 250.5
routing:
  policy: weighted
  scorers:
    - {name: queue-depth, weight: 2.0}
    - {name: kv-utilization, weight: 1.0}
  tie_break: first
priority:
  policy: slo-based
scheduler: priority-fcfs
"""


def test_bundle_values_reach_the_scenario(tmp_path, small):
    plan = prepare("run", {"--policy-config": str(bundle(tmp_path, FULL))}, str(small))
    s = plan.scenario
    assert s.cluster.admission.policy == "token-bucket"
    assert s.cluster.admission.params == {"capacity": 5000.0, "refill_rate": 250.5}
    assert s.cluster.routing.policy == "weighted"
    assert s.cluster.routing.params == {"scorers": [{"name": "queue-depth", "weight": 2.0},
                                                    {"name": "kv-utilization", "weight": 1.0}],
                                        "tie_break": "first"}
    assert (s.engine.priority_policy, s.engine.scheduler) == ("slo-based", "priority-fcfs")
    assert plan.origin["cluster.routing.params.scorers"] == "--policy-config"


def test_given_flags_win_over_the_bundle(tmp_path, small):
    p = str(bundle(tmp_path, FULL))
    s = prepare("run", {"--policy-config": p, "--token-bucket-capacity": "77",
                        "--routing-scorers": "load-balance:1", "--routing-tie-break": "random",
                        "--scheduler": "sjf", "--priority-policy": "constant"}, str(small)).scenario
    assert s.cluster.admission.params == {"capacity": 77.0, "refill_rate": 250.5}
    assert s.cluster.routing.params == {"scorers": [{"name": "load-balance", "weight": 1.0}],
                                        "tie_break": "random"}
    assert (s.engine.priority_policy, s.engine.scheduler) == ("constant", "sjf")
    s = prepare("run", {"--policy-config": p, "--routing-policy": "least-loaded",
                        "--admission-policy": "always-admit"}, str(small)).scenario
    # the bundle's weighted scorers do not apply to least-loaded; its tie_break does
    assert s.cluster.routing.policy == "least-loaded"
    assert s.cluster.routing.params == {"tie_break": "first"}
    assert s.cluster.admission.params == {}
    s = prepare("run", {"--policy-config": p, "--routing-scorers": ""}, str(small)).scenario
    assert s.cluster.routing.params["scorers"][0]["name"] == "queue-depth"   # "" = not given


def test_bundle_wins_over_the_scenario_file_and_same_policy_keeps_its_params(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO + "cluster:\n  routing:\n    policy: weighted\n"
                  "    params: {scorers: 'load-balance:1', tie_break: first}\n"
                  "  admission:\n    policy: tier-shed\n    params: {threshold: 4}\n")
    s = prepare("run", {}, str(sc)).scenario
    assert s.cluster.routing.params == {"scorers": "load-balance:1", "tie_break": "first"}
    p = bundle(tmp_path, "routing:\n  scorers: [{name: queue-depth, weight: 1}]\n"
                         "admission:\n  tier_shed_min_priority: 2\n")
    s = prepare("run", {"--policy-config": str(p)}, str(sc)).scenario
    assert s.cluster.routing.params == {"scorers": [{"name": "queue-depth", "weight": 1.0}],
                                        "tie_break": "first"}
    assert s.cluster.admission.params == {"threshold": 4, "min_priority": 2}
    s = prepare("run", {"--tier-shed-threshold": "9", "--routing-policy": "round-robin"}, str(sc)).scenario
    assert s.cluster.admission.params == {"threshold": 9}
    assert s.cluster.routing.params == {}                  # another policy: scenario params dropped


def test_token_bucket_values_must_be_positive_only_for_token_bucket(cli, tmp_path, small):
    s = prepare("run", {"--token-bucket-capacity": "0"}, str(small)).scenario   # always-admit
    assert s.cluster.admission.params == {}
    res = cli("run", "--scenario", small, "--admission-policy", "token-bucket",
              "--token-bucket-capacity", "0")
    assert res.exit_code == 2
    assert res.stderr.strip() == "error: --token-bucket-capacity: must be finite and > 0, got 0"
    p = bundle(tmp_path, "admission:\n  policy: token-bucket\n  token_bucket_refill_rate: 0\n")
    res = cli("run", "--scenario", small, "--policy-config", p)
    got = located(res.stderr.strip())
    assert (int(got["line"]), got["field"]) == (3, "admission.token_bucket_refill_rate")
    assert "must be finite and > 0" in got["problem"]


def test_tier_shed_flags_and_validation(cli, small):
    s = prepare("run", {"--admission-policy": "tier-shed", "--tier-shed-threshold": "12",
                        "--tier-shed-min-priority": "4"}, str(small)).scenario
    assert s.cluster.admission.params == {"threshold": 12, "min_priority": 4}
    res = cli("run", "--scenario", small, "--admission-policy", "tier-shed", "--tier-shed-min-priority", "5")
    assert res.stderr.strip() == "error: --tier-shed-min-priority: must be in [0, 4], got 5"
    res = cli("run", "--scenario", small, "--admission-policy", "tier-shed",
              "--tier-shed-min-priority", "0", "--format", "json")
    assert res.exit_code == 0 and "behaves like always-admit" in res.stderr


@pytest.mark.parametrize("args, words", [
    (["--routing-scorers", "queue-depth:1,nope:2"], "--routing-scorers: unknown scorer 'nope'"),
    (["--routing-tie-break", "last"], "--routing-tie-break: must be one of random, first"),
    (["--trace-level", "all"], "--trace-level: must be one of none, decisions"),
    (["--counterfactual-k", "-1"], "--counterfactual-k: must be >= 0"),
    (["--snapshot-refresh-interval", "-5"], "--snapshot-refresh-interval: must be >= 0"),
    (["--fitness-weights", "p99_ttft:1,speed:2"], "--fitness-weights: unknown fitness key 'speed'; valid keys: mean_e2e"),
    (["--fitness-weights", "p99_ttft:-1"], "finite and >= 0"),
    (["--admission-policy", "open-door"], "unknown admission policy 'open-door'"),
])
def test_bad_control_plane_flags(cli, small, args, words):
    res = cli("run", "--scenario", small, *args)
    assert res.exit_code == 2 and res.stdout == ""
    assert words in res.stderr, res.stderr


def test_scorers_flag_with_another_policy_warns(cli, small):
    res = cli("run", "--scenario", small, "--routing-scorers", "queue-depth:1", "--format", "json")
    assert res.exit_code == 0
    assert "--routing-scorers has no effect with routing policy 'round-robin'" in res.stderr


# ------------------------------------------------------------------------ output sections
def test_trace_summary_and_fitness_sections(cli, small):
    base = ["run", "--scenario", small, "--routing-policy", "least-loaded", "--format", "blis"]
    res = cli(*base, "--trace-level", "decisions", "--summarize-trace", "--counterfactual-k", "2",
              "--fitness-weights", "throughput:1,p99_e2e:0.5")
    assert res.exit_code == 0, res.stderr
    out = res.stdout
    assert "=== Trace Summary ===\nTotal Decisions: 24\n  Admitted: 24\n  Rejected: 0\nUnique Targets: 3\n" in out
    assert "Mean Regret: 0.000000\nMax Regret: 0.000000\n" in out
    assert out.index("=== Fitness Evaluation ===") < out.index("=== Trace Summary ===")
    fit = out.split("=== Fitness Evaluation ===\n")[1].splitlines()
    assert fit[0].startswith("Score: ") and fit[1].startswith("  p99_e2e: ") and fit[2].startswith("  throughput: ")
    quiet = cli(*base, "--trace-level", "decisions", "--summarize-trace=false")
    assert "Trace Summary" not in quiet.stdout
    # --summarize-trace implies the decision trace (docs/divergences.md #18; BLIS warns and
    # prints nothing): the summary is printed, with its counterfactuals
    implied = cli(*base, "--summarize-trace", "--counterfactual-k", "3")
    assert implied.exit_code == 0, implied.stderr
    assert "=== Trace Summary ===\nTotal Decisions: 24\n" in implied.stdout
    assert "has no effect" not in implied.stderr
    warned = cli(*base, "--counterfactual-k", "3")           # no trace at all: k is unused
    assert "Trace Summary" not in warned.stdout
    assert "counterfactual k = 3 has no effect" in warned.stderr


def test_replay_ignores_fitness_flag(cli, tmp_path):
    header, data = write_trace_files(tmp_path, [trace_row(i, 10_000 * i, 64, 8) for i in range(6)])
    res = cli("replay", "--model", "m", "--latency-model", "blackbox", "--alpha-coeffs", "100,0,0",
              "--beta-coeffs", "1000,1,1", "--trace-header", header, "--trace-data", data,
              "--fitness-weights", "throughput:1", "--format", "blis")
    assert res.exit_code == 0, res.stderr
    assert "Fitness" not in res.stdout and "--fitness-weights is ignored by replay" in res.stderr


def test_tier_shed_from_cli_prints_shed_counts(cli, tmp_path):
    rows = [trace_row(i, 1_000 * i, 64, 200).replace(",c,,,", ",c,," + ("sheddable" if i % 2 else "critical") + ",")
            for i in range(20)]
    header, data = write_trace_files(tmp_path, rows)
    res = cli("replay", "--model", "m", "--latency-model", "blackbox", "--alpha-coeffs", "100,0,0",
              "--beta-coeffs", "1000,1,1", "--trace-header", header, "--trace-data", data,
              "--num-instances", "2", "--admission-policy", "tier-shed", "--tier-shed-threshold", "4",
              "--format", "json")
    assert res.exit_code == 0, res.stderr
    anomalies = json.loads(res.stdout)["anomaly_counters"]
    shed = anomalies["shed_by_tier"]
    assert set(shed) == {"sheddable"} and shed["sheddable"] > 0
    assert anomalies["rejected_requests_admission"] == shed["sheddable"]
