"""A scenario's ``plugins:`` modules are code: they are imported only when the user opts in
(``--allow-plugins`` or ``BLIS_SIMPY_ALLOW_PLUGINS=1``), by every command that reads a
scenario, a sweep's points and a plan's base scenario included; ``validate`` without it lists
them and checks the rest. A module beside a sweep's or a plan's base scenario is found as
``run`` finds one beside its scenario (issue 23, findings 6 and 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from blis_simpy.cli.plugin_optin import ENV
from tests.cli.support import SMALL_SCENARIO

#: a plugin module that shows it ran: a line on stdout and a file beside it
LOUD = ("import pathlib\nprint('PLUGIN RAN')\npathlib.Path(__file__).with_suffix('.ran').write_text('x')\n"
        "from blis_simpy.routing.base import RoundRobin\n"
        "class OptinRouter(RoundRobin, name='optin-{tag}'):\n    pass\n")


def _scenario(folder, tag: str, extra: str = ""):
    """``loud_<tag>.py`` and ``scenario.yaml`` (routing through its router) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"loud_{tag}.py").write_text(LOUD.format(tag=tag))
    sc = folder / "scenario.yaml"
    sc.write_text(f"plugins: [loud_{tag}]\n" + SMALL_SCENARIO
                  + f"cluster: {{num_instances: 2, routing: {{policy: optin-{tag}}}}}\n" + extra)
    return sc


def _blis(*args, cwd, allow_env: bool = False):
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if allow_env:
        env[ENV] = "1"
    return subprocess.run([sys.executable, "-m", "blis_simpy", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_validate_lists_the_modules_and_runs_none(tmp_path):
    sc = _scenario(tmp_path, "v")
    proc = _blis("validate", sc, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "PLUGIN RAN" not in proc.stdout and not (tmp_path / "loud_v.ran").exists()
    lines = proc.stdout.splitlines()
    assert lines[1:] == [
        f"plugins not imported: loud_v (--allow-plugins or {ENV}=1 imports and checks them)",
        "  not checked until they are imported: cluster.routing.policy: routing policy 'optin-v'"]
    assert proc.stderr == ""


def test_validate_without_opt_in_still_checks_the_rest(tmp_path):
    sc = _scenario(tmp_path, "w", extra="horizon_us: -5\n")
    proc = _blis("validate", sc, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"error: {sc}:18: horizon_us: input should be greater than 0, got -5\n"
    assert not (tmp_path / "loud_w.ran").exists()


def test_validate_with_opt_in_imports_and_checks(tmp_path):
    sc = _scenario(tmp_path, "x")
    proc = _blis("validate", "--allow-plugins", sc, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "PLUGIN RAN" and "plugins not imported" not in proc.stdout


@pytest.mark.parametrize("how", ["flag", "env"])
def test_run_needs_the_opt_in(tmp_path, how):
    sc = _scenario(tmp_path, "r")
    proc = _blis("run", "--scenario", sc, "--format", "json", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: {sc}:1: plugins: would import the plugin module 'loud_r' (code "
                           f"that runs): pass --allow-plugins or set {ENV}=1 to allow it\n")
    assert not (tmp_path / "loud_r.ran").exists()
    args = ("run", "--allow-plugins") if how == "flag" else ("run",)
    proc = _blis(*args, "--scenario", sc, "--format", "json", cwd=tmp_path, allow_env=how == "env")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("PLUGIN RAN\n")
    assert json.loads(proc.stdout.split("\n", 1)[1])["cluster"]["completed_requests"] == 24


def test_entry_point_plugins_need_no_opt_in(tmp_path):
    """Installed by the user: a ``blis_simpy.plugins`` entry point loads without the opt-in."""
    dist = tmp_path / "optin_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: optin-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[blis_simpy.plugins]\nep = loud_e\n")
    (tmp_path / "loud_e.py").write_text(LOUD.format(tag="e"))
    sc = tmp_path / "scenario.yaml"
    sc.write_text(SMALL_SCENARIO + "cluster: {num_instances: 2, routing: {policy: optin-e}}\n")
    env = {**{k: v for k, v in os.environ.items() if k != ENV}, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "blis_simpy", "run", "--scenario", str(sc),
                           "--format", "json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.split("\n", 1)[1])["cluster"]["completed_requests"] == 24


SWEEP = "base: base/scenario.yaml\naxes:\n  workload.rate: [10, 20]\n"


def test_sweep_needs_the_opt_in_and_finds_the_module_beside_its_base(tmp_path):
    _scenario(tmp_path / "base", "s")
    sw = tmp_path / "sweep.yaml"
    sw.write_text(SWEEP)
    proc = _blis("sweep", sw, "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: {tmp_path}/base/scenario.yaml:1: plugins: would import the plugin "
                           f"module 'loud_s' (code that runs): pass --allow-plugins or set {ENV}=1 to "
                           "allow it (point workload.rate=10)\n")
    assert not (tmp_path / "out").exists() and not (tmp_path / "base" / "loud_s.ran").exists()
    # opted in: the module beside the base scenario is found (it was "cannot import")
    proc = _blis("sweep", sw, "--out", tmp_path / "out", "--workers", "1", "--allow-plugins",
                 "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert (summary["points"], summary["ok"]) == (2, 2)


PLAN = """\
model: meta-llama/llama-3.1-8b-instruct
gpus: [H100]
workload: {scenario: base/scenario.yaml, rate: 10}
slo: {ttft_p99_ms: 100000}
search: {instances: {min: 2, max: 2}, tp: [1], pd: {colocated: true, disaggregated: false}}
"""


def test_plan_needs_the_opt_in_and_finds_the_module_beside_its_base(tmp_path):
    _scenario(tmp_path / "base", "p")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    proc = _blis("plan", plan, "--serial", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: {tmp_path}/base/scenario.yaml:1: plugins: would import the plugin "
                           f"module 'loud_p' (code that runs): pass --allow-plugins or set {ENV}=1 to "
                           "allow it\n")
    proc = _blis("plan", plan, "--serial", "--format", "json", "--allow-plugins", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout[proc.stdout.index("{"):])
    winner = doc["cheapest"]["winner"]
    assert (winner["deployment"]["instances"], winner["meets"], winner["metrics"]["completed_requests"]) \
        == (2, True, 24)
