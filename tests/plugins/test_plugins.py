"""A user-written router plugin loaded from a scenario's ``plugins:`` list changes routing
as designed, with no change to the package."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from tests.cli.support import trace_row, write_trace_files

HERE = Path(__file__).resolve().parent

# r0 is large (100 KV blocks), r1..r3 small (11 blocks each); all still run when the next
# arrives. least-kv: r0 -> instance_0, then every small one to the emptier instance_1.
ROWS = [trace_row(0, 0, 1600, 300)] + [trace_row(i, 100_000 * i, 160, 300) for i in (1, 2, 3)]
LEAST_KV = ["instance_0", "instance_1", "instance_1", "instance_1"]
ROUND_ROBIN = ["instance_0", "instance_1", "instance_0", "instance_1"]


def write_scenario(folder: Path, plugin_module: str, policy: str = "least-kv", params: str = "{}") -> Path:
    header, data = write_trace_files(folder, ROWS)
    sc = folder / "scenario.yaml"
    sc.write_text(f"""\
model: m
plugins: [{plugin_module}]
latency:
  model: blackbox
  alpha_coeffs: [1000.0, 0.0, 0.0]
  beta_coeffs: [5000.0, 10.0, 100.0]
engine:
  total_kv_blocks: 2000
cluster:
  num_instances: 2
  routing:
    policy: {policy}
    params: {params}
workload:
  kind: trace
  header: {header.name}
  data: {data.name}
""")
    return sc


def handled_by(results: Path) -> list[str]:
    rows = json.loads(results.read_text())["requests"]
    return [r["handled_by"] for r in sorted(rows, key=lambda r: int(r["requestID"].split("_")[1]))]


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def test_plugin_router_from_scenario_changes_routing(cli, tmp_path):
    sc = write_scenario(tmp_path, "tests.plugins.least_kv")
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", sc, "--results-path", out, "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert handled_by(out) == LEAST_KV
    res = cli("run", "--scenario", sc, "--routing-policy", "round-robin", "--results-path", out,
              "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert handled_by(out) == ROUND_ROBIN


def test_plugin_params_are_validated_and_used(cli, tmp_path):
    sc = write_scenario(tmp_path, "tests.plugins.least_kv", params="{max_queue: -1}")
    res = cli("run", "--scenario", sc, "--format", "json")
    assert res.exit_code == 2
    assert "cluster.routing.params.max_queue" in res.stderr and str(sc) in res.stderr
    sc = write_scenario(tmp_path, "tests.plugins.least_kv", params="{colour: blue}")
    res = cli("run", "--scenario", sc, "--format", "json")
    assert res.exit_code == 2 and "cluster.routing.params.colour" in res.stderr


def test_plugin_decisions_are_traced_with_regret(cli, tmp_path):
    sc = write_scenario(tmp_path, "tests.plugins.least_kv")
    res = cli("run", "--scenario", sc, "--trace-level", "decisions", "--summarize-trace",
              "--counterfactual-k", "2", "--format", "blis")
    assert res.exit_code == 0, res.stderr
    assert "Target Distribution:\n  instance_0: 1\n  instance_1: 3\n" in res.stdout
    assert "Mean Regret: 0.000000" in res.stdout        # it always picks its own best score


def test_plugin_scorer_in_weighted_routing(cli, tmp_path):
    sc = write_scenario(tmp_path, "tests.plugins.least_kv", policy="weighted",
                        params="{scorers: 'free-blocks:1', tie_break: first}")
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", sc, "--results-path", out, "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert handled_by(out) == LEAST_KV
    res = cli("run", "--scenario", sc, "--routing-scorers", "free-blocks:1,queue-depth:1",
              "--results-path", out, "--format", "json")
    assert res.exit_code == 0, res.stderr


def test_plugin_next_to_the_scenario_in_a_fresh_process(tmp_path):
    """A user's module beside the scenario, run with the installed CLI from another folder."""
    shutil.copy(HERE / "least_kv.py", tmp_path / "my_routers.py")
    sc = write_scenario(tmp_path, "my_routers")
    out = tmp_path / "results.json"
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-m", "blis_simpy", "run", "--scenario", str(sc),
                           "--results-path", str(out), "--format", "json"],
                          cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert handled_by(out) == LEAST_KV


def test_missing_plugin_module_is_a_located_error(cli, tmp_path):
    sc = write_scenario(tmp_path, "no_such_plugin_module")
    res = cli("run", "--scenario", sc)
    assert res.exit_code == 2
    assert res.stderr.startswith(f"error: {sc}:2: plugins: cannot import plugin module 'no_such_plugin_module'")
