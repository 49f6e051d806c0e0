"""Every command that writes files goes through :mod:`blis_simpy.atomic` (docs/cli.md, "Output
files"): an output that cannot be written is ONE line ``error: PATH: ...``, exit 2, and leaves
no temporary file and no partial output behind — where a command writes several files (a
report's page and figures, calibrate's report and plots, observe's trace pair and results, a
converted trace and its scenario) none of them lands. Each case runs the real CLI on a tiny
input; the unwritable path is either below a regular file (ENOTDIR, unwritable even for root)
or a directory where a file should go (the last file the command writes, so the others would
have been written first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from tests.calibrate.test_calibrate import HEADER as CAL_HEADER
from tests.calibrate.test_calibrate import SCENARIO as CAL_SCENARIO
from tests.cli.support import TRACE_COLUMNS
from tests.observe.sse_server import SSEServer
from tests.planner.test_plan import BASE as PLAN_BASE
from tests.workload.test_observed_vllm_log import write_run

PLAN = """\
model: meta-llama/llama-3.1-8b-instruct
gpus: [A100-80]
workload: {scenario: base.yaml, rate: 5}
slo: {itl_p99_ms: 42, ttft_p99_ms: 300}
search: {instances: {min: 1, max: 1}, tp: [1], runner_ups: 1}
cost: {gpu_hour_usd: {A100-80: 1.5}}
"""
SWEEP = "base: base.yaml\naxes:\n  cluster.num_instances: [1]\nseeds: [1]\n"
OBSERVE = ["--model", "m", "--rate", "20", "--num-requests", "2", "--prompt-tokens", "8",
           "--prompt-tokens-stdev", "8", "--prompt-tokens-min", "8", "--prompt-tokens-max", "8",
           "--output-tokens", "3", "--output-tokens-stdev", "3", "--output-tokens-min", "3",
           "--output-tokens-max", "3"]


def _calibrate_input(src: Path) -> list:
    (src / "tiny.header.yaml").write_text(CAL_HEADER)
    row = "0,c,,,,0,,0,true,16,3,0,0,0,0,0,,0,16,0,0,2000,4000,3,ok,,stop"
    (src / "tiny.csv").write_text(f"{TRACE_COLUMNS}\n{row}\n")
    (src / "s.yaml").write_text(CAL_SCENARIO)
    return [src / "tiny", "--scenario", src / "s.yaml"]


def _plan(src, out, server):
    (src / "base.yaml").write_text(PLAN_BASE)
    (src / "plan.yaml").write_text(PLAN)
    bad = out / "file" / "plan.json"
    return ["plan", src / "plan.yaml", "--serial", "--out", bad], bad


def _calibrate_report(src, out, server):
    bad = out / "file" / "r.json"
    return ["calibrate", *_calibrate_input(src), "--report", bad, "--plot", out / "plots"], bad


def _calibrate_plot(src, out, server):
    """The report and the CDF plot are complete before the scatter plot fails: none lands."""
    (out / "plots" / "tiny-scatter.png").mkdir(parents=True)
    bad = out / "plots" / "tiny-scatter.png"
    return ["calibrate", *_calibrate_input(src), "--report", out / "r.json", "--plot",
            out / "plots"], bad


def _sweep(src, out, server):
    (src / "base.yaml").write_text(PLAN_BASE + "hardware: A100-80\n")
    (src / "sweep.yaml").write_text(SWEEP)
    bad = out / "file" / "ds"
    return ["sweep", src / "sweep.yaml", "--out", bad, "--workers", "1"], bad


def _report(src, out, server):
    """The figure is complete before the page fails: neither lands, no figures/ folder."""
    (src / "plan.json").write_text(json.dumps([
        {"label": "1 x TP1", "gpus": 1, "cost_per_hour_usd": 2.5, "goodput_rps": 5, "meets_slo": True},
        {"label": "2 x TP1", "gpus": 2, "cost_per_hour_usd": 5.0, "goodput_rps": 9, "meets_slo": True}]))
    (out / "rep" / "index.html").mkdir(parents=True)
    return ["report", src / "plan.json", "--out", out / "rep"], out / "rep" / "index.html"


def _observe(src, out, server):
    """The trace pair is complete before --results fails: neither file lands."""
    (out / "r.json").mkdir()
    return (["observe", "--server-url", server.url, *OBSERVE, "--trace-header", out / "t.yaml",
             "--trace-data", out / "t.csv", "--results", out / "r.json"], out / "r.json")


def _convert(src, out, server):
    bad = out / "file" / "x"
    return ["convert", "vllm-log", "--run", write_run(src), "--output", bad], Path(f"{bad}.header.yaml")


def _fit(src, out, server):
    bad = out / "file" / "set.yaml"
    return ["fit", write_run(src), "-o", bad, "--max-evaluations", "1"], bad


CASES = {"plan --out": _plan, "calibrate --report": _calibrate_report,
         "calibrate --plot": _calibrate_plot, "sweep --out": _sweep, "report --out": _report,
         "observe --results": _observe, "convert --output": _convert, "fit -o": _fit}


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


class TestUnwritableOutput:
    @pytest.fixture
    def server(self):
        srv = SSEServer().start()
        yield srv
        srv.stop()

    @pytest.mark.parametrize("case", list(CASES))
    def test_one_line_exit_2_and_nothing_left(self, case, tmp_path, server):
        src, out = tmp_path / "src", tmp_path / "out"
        src.mkdir()
        out.mkdir()
        (out / "file").write_text("a regular file\n")
        args, bad = CASES[case](src, out, server)
        before = _tree(out)
        res = CliRunner().invoke(app, [str(a) for a in args], prog_name="blis-simpy")
        assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: "), res.stderr
        assert ".tmp" not in lines[0]
        assert _tree(out) == before                                  # no output, not even a part
        assert [p for p in _tree(tmp_path) if p.endswith(".tmp")] == []


@pytest.mark.parametrize("case", ["plan --out", "fit -o"])
def test_a_long_search_refuses_its_output_path_before_it_runs(case, tmp_path, monkeypatch):
    """plan and fit run for minutes: an output path in no folder is refused before the first
    simulation (the runner is never called), not after the search."""
    from blis_simpy.cli import runner
    calls = []
    monkeypatch.setattr(runner, "execute", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(
        AssertionError("a simulation ran")))
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (out / "file").write_text("a regular file\n")
    args, bad = CASES[case](src, out, None)
    res = CliRunner().invoke(app, [str(a) for a in args], prog_name="blis-simpy")
    flag = "--out" if case.startswith("plan") else "--output"
    assert (res.exit_code, res.stderr) == (2, f"error: {bad}: {flag}: no such folder for the output file\n")
    assert calls == []
