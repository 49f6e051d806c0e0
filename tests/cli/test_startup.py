"""Start-up stays small: ``--help`` and ``--version`` load neither the simulator nor the
heavy libraries (a module check in a fresh interpreter, never a timing; the timings are in
bench/startup.py and docs/performance.md, "Start-up")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: what `import blis_simpy.cli.app`, `--help` and `--version` must not load
HEAVY = ("numpy", "scipy", "httpx", "matplotlib", "simpy", "pydantic", "pydantic_core", "yaml",
         "blis_simpy.cli.runner", "blis_simpy.deploy", "blis_simpy.engine", "blis_simpy.cluster",
         "blis_simpy.kv", "blis_simpy.workload", "blis_simpy.config")

_PROBE = """
import contextlib, io, json, sys
import blis_simpy.cli.app as app
argv = json.loads(sys.argv[1])
out = io.StringIO()
code = None
if argv is not None:
    with contextlib.redirect_stdout(out):
        try:
            app.main(argv)
        except SystemExit as exc:
            code = exc.code
heavy = json.loads(sys.argv[2])
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
import gc
print(json.dumps({"loaded": loaded, "code": code, "out": out.getvalue(),
                  "gc": [gc.get_threshold(), gc.get_freeze_count()]}))
"""


def _probe(argv: list[str] | None, heavy: tuple[str, ...] = HEAVY) -> dict:
    """Run ``blis-simpy ARGV`` (or only the import, for None) in a fresh interpreter; the
    ``heavy`` modules it loaded, its exit code, its stdout, and the collector's thresholds and
    frozen-object count at the end."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argv), json.dumps(heavy)],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    return json.loads(proc.stdout)


def test_importing_the_cli_loads_nothing_heavy():
    assert _probe(None)["loaded"] == []


def test_help_loads_nothing_heavy():
    got = _probe(["--help"])
    assert got["code"] == 0 and "replay" in got["out"] and got["loaded"] == []


#: a simulation command's help lists the policy names registered now (cli/usage.py): the
#: policy registries load (the scheduler/priority registry lives in blis_simpy.engine.scheduling,
#: the coefficient sets read YAML), never the engine, the cluster, the KV cache or the build
REGISTRIES = ("blis_simpy.engine", "blis_simpy.engine.scheduling", "yaml")


def test_a_command_help_loads_no_simulator():
    """typer itself loads pydantic once a sub-command is parsed (it coerces every option,
    even the group's unset --help, through a pydantic TypeAdapter); the policy registries
    for the names in the help; nothing else heavy."""
    got = _probe(["replay", "--help"])
    assert got["code"] == 0 and "--trace-header" in got["out"]
    assert "round-robin" in got["out"]         # the registered routing policies are listed
    assert [m for m in got["loaded"] if m.split(".")[0] not in ("pydantic", "pydantic_core")
            and m not in REGISTRIES and not m.startswith("yaml.")] == []


def test_validate_help_loads_no_registry():
    got = _probe(["validate", "--help"])
    assert got["code"] == 0 and "FILE.yaml" in got["out"]
    assert [m for m in got["loaded"] if m.split(".")[0] not in ("pydantic", "pydantic_core")] == []


def test_version_prints_the_package_version_and_loads_nothing_heavy():
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)[1]
    got = _probe(["--version"])
    assert (got["code"], got["out"], got["loaded"]) == (0, f"blis-simpy {version}\n", [])


def test_the_probe_sees_a_heavy_import():
    """The check itself: a command that simulates does load the simulator."""
    got = _probe(["validate", str(REPO / "scenarios" / "quickstart.yaml")])
    assert got["code"] in (None, 0) and got["out"].startswith("ok: ")
    assert "blis_simpy.cli.runner" in got["loaded"] and "pydantic" in got["loaded"]


#: what a plain replay (no decision trace, no --streaming-metrics) must not load
REPLAY_UNUSED = ("blis_simpy.trace", "ddsketch", "six")

#: the README's example replay (40 requests, blackbox coefficients)
EXAMPLE_REPLAY = ["replay", "--trace-header", str(REPO / "scenarios/traces/example.yaml"),
                  "--trace-data", str(REPO / "scenarios/traces/example.csv"),
                  "--model", "meta-llama/llama-3.1-8b-instruct",
                  "--alpha-coeffs", "232.46,1.75,3357.44", "--beta-coeffs", "5752.7,17.25,5.999",
                  "--total-kv-blocks", "7463", "--format", "json"]


def test_a_plain_replay_loads_neither_the_decision_trace_nor_ddsketch():
    got = _probe(EXAMPLE_REPLAY, REPLAY_UNUSED + ("blis_simpy.cli.runner",))
    assert got["code"] in (None, 0) and json.loads(got["out"])["cluster"]["completed_requests"] > 0
    assert got["loaded"] == ["blis_simpy.cli.runner"]     # the probe sees what did load


def test_traced_and_streaming_runs_load_what_they_use():
    got = _probe(EXAMPLE_REPLAY + ["--trace-level", "decisions", "--streaming-metrics"],
                 REPLAY_UNUSED)
    assert got["code"] in (None, 0)
    assert {"blis_simpy.trace", "ddsketch"} <= set(got["loaded"])


def test_the_start_up_gc_pause_ends_once_the_scenario_is_prepared():
    """main() raises the collector's generation-0 threshold for the start-up; prepare()
    freezes what start-up made and restores the default thresholds (cli/startup_gc.py)."""
    import gc
    default = list(gc.get_threshold())
    got = _probe(EXAMPLE_REPLAY, ())
    assert got["code"] in (None, 0)
    assert got["gc"][0] == default and got["gc"][1] > 10_000
    got = _probe(["--version"], ())        # no scenario: the pause is still on at exit
    assert got["gc"][0][0] > default[0] and got["gc"][1] == 0


def test_observe_ends_the_start_up_pause_before_it_sends():
    """observe never reaches runner.prepare(): it ends the pause itself once its workload is
    built, so the sending runs with the default thresholds (not a generation-0 pass every
    100,000 objects in the middle of its timings) and a frozen start-up."""
    import gc

    from tests.observe.sse_server import SSEServer

    srv = SSEServer().start()
    try:
        got = _probe(["observe", "--server-url", srv.url, "--model", "Org/Model-8B",
                      "--rate", "20", "--num-requests", "2", "--prompt-tokens", "8",
                      "--prompt-tokens-stdev", "8", "--prompt-tokens-min", "8",
                      "--prompt-tokens-max", "8", "--output-tokens", "2",
                      "--output-tokens-stdev", "2", "--output-tokens-min", "2",
                      "--output-tokens-max", "2"], ())
    finally:
        srv.stop()
    assert got["code"] in (None, 0) and "2 ok" in got["out"], got
    assert got["gc"][0] == list(gc.get_threshold()) and got["gc"][1] > 10_000


def test_a_sub_command_line_builds_only_that_command():
    """main() hands typer a copy of the app holding just the named sub-command (typer would
    build the click objects of all eleven); anything else gets the whole app, unchanged."""
    from blis_simpy.cli.app import _app_for, app

    every = [c.name for c in app.registered_commands]
    assert _app_for(["replay", "--help"]).registered_commands[0].name == "replay"
    solo = _app_for(["replay", "--trace-header", "x"])
    assert [c.name for c in solo.registered_commands] == ["replay"] and solo.registered_groups == []
    solo = _app_for(["convert", "preset"])
    assert solo.registered_commands == [] and [g.name for g in solo.registered_groups] == ["convert"]
    for args in ([], ["--help"], ["--version"], ["runn"], ["--show-completion"]):
        assert _app_for(args) is app, args
    assert [c.name for c in app.registered_commands] == every and len(every) == 10


@pytest.mark.parametrize("args", [["run", "--help"], ["replay", "--help"], ["convert", "--help"],
                                  ["catalog", "--help"], ["run", "--bogus"], ["validate"],
                                  ["convert", "nope"]])
def test_a_sub_command_runs_as_in_the_whole_app(args, capsys, monkeypatch):
    """Help, usage errors and exit codes of the one-command app are the whole app's."""
    import gc
    import os

    from blis_simpy.cli import startup_gc
    from blis_simpy.cli.app import _app_for, app, main

    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)   # typer's __call__ replaces it
    thresholds, saved = gc.get_threshold(), startup_gc._saved
    got = []
    for run in (lambda: main(args), lambda: app(args=args, prog_name="blis-simpy")):
        try:
            with pytest.raises(SystemExit) as stop:
                run()
        finally:    # main() paused the collector and no scenario was prepared to end it
            startup_gc._saved = saved
            gc.set_threshold(*thresholds)
        out = capsys.readouterr()
        got.append((stop.value.code, out.out, out.err))
    assert _app_for(args) is not app
    assert got[0] == got[1] and got[0][1] + got[0][2]
