"""Usage errors print one line (``error: --flag: problem``, exit 2), help reads well at 80
columns and lists the registered policy names, shell completion is there."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from blis_simpy.cli import flags as F
from blis_simpy.cli.flag_values import families

from .support import REPO

# (arguments, the exact stderr line); the ``see`` hint names the command's own help
USAGE_CASES = {
    "unknown flag": (["run", "--no-such-flag", "1"],
                     "error: --no-such-flag: no such option; see 'blis-simpy run --help'"),
    "near miss": (["run", "--rat", "3"],
                  "error: --rat: no such option (did you mean --rate or --format?); "
                  "see 'blis-simpy run --help'"),
    "run-only flag on replay": (["replay", "--rate", "3"],
                                "error: --rate: no such option; see 'blis-simpy replay --help'"),
    "bad --format": (["run", "--format", "xml"], "error: --format: 'xml' is not one of 'table', 'json', 'blis'"),
    "flag without value": (["run", "--num-requests"], "error: --num-requests: needs a value"),
    "missing argument": (["validate"], "error: FILE.yaml: missing; see 'blis-simpy validate --help'"),
    "extra argument": (["validate", "a.yaml", "b.yaml"],
                       "error: b.yaml: unexpected argument; see 'blis-simpy validate --help'"),
    "group flag": (["--bogus"], "error: --bogus: no such option; see 'blis-simpy --help'"),
    "unknown command": (["frob"], "error: frob: no such command; commands: run, replay, validate, "
                                  "catalog, sweep, plan, report, calibrate, fit, observe, convert"),
    "bad argument choice": (["catalog", "nope"],
                            "error: what: 'nope' is not one of 'all', 'gpus', 'models', 'coefficients', "
                            "'capacity'"),
    "sub-command flag": (["catalog", "--bogus"],
                         "error: --bogus: no such option; see 'blis-simpy catalog --help'"),
}


@pytest.mark.parametrize("case", sorted(USAGE_CASES))
def test_usage_error_is_one_line(cli, case):
    args, line = USAGE_CASES[case]
    res = cli(*args)
    assert (res.exit_code, res.stdout, res.stderr) == (2, "", line + "\n")


def test_usage_error_from_the_installed_command():
    """The real console script, in a subprocess: one line on stderr, exit 2."""
    exe = os.path.join(os.path.dirname(sys.executable), "blis-simpy")
    proc = subprocess.run([exe, "run", "--format", "xml"], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", "error: --format: 'xml' is not one of 'table', 'json', 'blis'\n")


def test_no_arguments_still_prints_the_help(cli):
    res = cli()
    assert res.exit_code == 2
    assert "Usage: blis-simpy" in res.stdout and "replay" in res.stdout and res.stderr == ""


def _help(*args: str, columns: int) -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "blis-simpy")
    env = dict(os.environ, COLUMNS=str(columns))
    proc = subprocess.run([exe, *args, "--help"], capture_output=True, text=True, cwd=REPO,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("command", ["run", "replay", "catalog", "sweep"])
def test_help_fits_80_columns(command):
    text = _help(command, columns=80)
    assert [ln for ln in text.splitlines() if len(ln) > 80] == []
    assert "╭" not in text                   # plain layout, no boxes squeezing the descriptions
    if command == "run":
        # grouped as the wide help's panels; a flag's name is never cut
        for section in ("Output:", "Simulation:", "Workload (run):", "Prefill/decode disaggregation:"):
            assert f"\n{section}\n" in text
        assert "--streaming-metrics / --no-streaming-metrics" in text
        assert "round-robin" in text and "round-\n" not in text   # not broken at a hyphen


@pytest.mark.parametrize("command", ["run", "replay"])
def test_help_at_80_columns_breaks_no_word(command):
    """A line breaks between words or after a comma, never inside a word: every piece of
    every flag's help (``kv-utilization:2)``, ``round-robin``) is whole on one line."""
    lines = [ln.strip() for ln in _help(command, columns=80).splitlines()]
    for flag in F.FLAGS:
        if command in flag.commands:
            for piece in re.findall(r"[^\s,]+,?", flag.help):
                assert any(piece in ln for ln in lines), (flag.name, piece)


def test_choice_flags_list_the_registered_names():
    text = " ".join(_help("run", columns=80).split())
    for flag, family in (("--latency-model", "latency"), ("--routing-policy", "routing"),
                         ("--scheduler", "scheduler"), ("--priority-policy", "priority"),
                         ("--admission-policy", "admission"), ("--pd-decider", "decider")):
        reg = families()[family]
        # the help runs in a fresh process: only the built-in classes are registered there
        # (tests in this process may have registered plugins of their own)
        names = [n for n in reg.names() if reg.lookup(n).__module__.startswith("blis_simpy.")]
        assert f"{flag} NAME" in text
        assert f"one of: {', '.join(names)}, or a plugin's name" in text, flag
    # a fixed set of values is shown as the choices
    assert "--arrival <constant|poisson|gamma>" in text
    assert "--kv-capacity-model <vllm|blis>" in text
    assert "--log <trace|debug|info|warn|error|fatal|panic>" in text
    assert "--trace-level <none|decisions>" in text
    assert "--routing-tie-break <random|first>" in text
    # every flag with a fixed set of values (a one_of rule) shows them, never TEXT
    for flag in F.FLAGS:
        if getattr(flag.rule, "choices", None) and "run" in flag.commands:
            assert f"{flag.name} <{'|'.join(flag.rule.choices)}>" in text, flag.name


@pytest.mark.parametrize("command", ["sweep", "plan"])
def test_a_same_named_flag_of_another_command_keeps_its_own_help(command):
    """sweep's and plan's ``--scheduler`` is a Dask scheduler address, not run's wait-queue
    scheduler: its help is not replaced by the policy flag's (it was, by option name)."""
    text = " ".join(_help(command, columns=200).split())
    assert "Dask scheduler (tcp://host:8786)" in text
    assert "wait-queue scheduler" not in text and "priority-fcfs" not in text


def test_a_plugin_name_is_still_accepted(cli, small_scenario, tmp_path, monkeypatch):
    """The names are not a click choice: a router a scenario's ``plugins:`` registers is
    accepted by --routing-policy (checked by the flag table once the plugin is loaded)."""
    (tmp_path / "my_router_mod.py").write_text(
        "from blis_simpy.routing.base import RoundRobin\n"
        "class MyRouter(RoundRobin, name='usage-test-router'):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    small_scenario.write_text(small_scenario.read_text() + "plugins: [my_router_mod]\n")
    res = cli("run", "--allow-plugins", "--scenario", small_scenario, "--routing-policy", "usage-test-router",
              "--format", "json")
    assert res.exit_code == 0, res.stderr


def test_shell_completion(cli, monkeypatch):
    # typer finds the shell among the parent processes (shellingham); pytest's parent need
    # not be one, so the detection is pinned to bash here
    import typer._completion_shared as shared
    monkeypatch.setattr(shared.shellingham, "detect_shell", lambda: ("bash", "/bin/bash"))
    res = cli("--show-completion")
    assert res.exit_code == 0 and "_blis_simpy_completion" in res.stdout
    exe = os.path.join(os.path.dirname(sys.executable), "blis-simpy")
    env = dict(os.environ, _BLIS_SIMPY_COMPLETE="complete_bash", COMP_WORDS="blis-simpy run --routing-p",
               COMP_CWORD="2")
    proc = subprocess.run([exe], capture_output=True, text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stdout.split()) == (0, ["--routing-policy"])
