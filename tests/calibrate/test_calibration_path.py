"""The calibration path for one's own server (docs/accuracy.md, "Calibrating your own
server"): an LLMServingSim run read as it is laid out, converted, calibrated with the shipped
set (in-sample, under either name), then fitted from the physical set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from tests.workload.test_observed_vllm_log import llmservingsim_layout

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _calibrate(run, *extra) -> dict:
    res = _cli("calibrate", run, "--format", "json", "--no-timeline", *extra)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["runs"][0]


def test_convert_then_calibrate_says_in_sample_under_either_name(tmp_path):
    """The shipped RTX 4090 set was fitted on vllm-rtx4090-llama-3.1-8b: calibrating the
    LLMServingSim folder, or the files converted from it under another prefix, is in-sample
    (the converted prefix `runs/vllm-rtx4090` of the README showed -0.0 % with no warning)."""
    example = llmservingsim_layout(tmp_path)
    out = tmp_path / "runs" / "vllm-rtx4090"
    out.parent.mkdir()
    res = _cli("convert", "vllm-log", "--run", example, "--output", out)
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("converted vllm-rtx4090-llama-3.1-8b: 3 rows, arrivals over 0.250 s")
    assert "name: vllm-rtx4090-llama-3.1-8b" in (tmp_path / "runs" / "vllm-rtx4090.scenario.yaml").read_text()
    for run in (example, out):
        doc = _calibrate(run)
        assert doc["in_sample"] is True and doc["coefficients_used"] == "coefficient set 'RTX-4090-fitted'"
        doc = _calibrate(run, "--coefficients", "default")
        assert doc["in_sample"] is False


def test_a_fit_of_converted_files_names_the_logged_run_too(tmp_path):
    example = llmservingsim_layout(tmp_path)
    out = tmp_path / "mine"
    assert _cli("convert", "vllm-log", "--run", example, "--output", out).exit_code == 0
    fitted = tmp_path / "set.yaml"
    res = _cli("fit", out, "--coefficients", "default", "--max-evaluations", "4", "-o", fitted)
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(fitted.read_text())["fit"]["runs"] == ["mine", "vllm-rtx4090-llama-3.1-8b"]
    assert _calibrate(example, "--coefficients", fitted)["in_sample"] is True


def test_the_readmes_fit_starts_from_the_physical_set_not_the_answer():
    """`fit runs/vllm-rtx4090` alone started from the set fitted on that run and returned it
    unchanged; the README's command starts from `--coefficients default` (the uncalibrated,
    physical set), which is not the shipped fitted set: the fit has something to find."""
    readme = (ROOT / "README.md").read_text()
    fits = re.findall(r"^blis-simpy fit (.*)$", readme, flags=re.M)
    assert fits and all("--coefficients default" in f.split("#")[0] for f in fits), fits
    from blis_simpy.latency.coefficient_sets import builtin_set, load_physics_set
    fitted, where = load_physics_set("RTX-4090")              # what `fit` alone started from
    assert where == "built-in set RTX-4090" and "vllm-rtx4090-llama-3.1-8b" in fitted.fit["runs"]
    start, where = load_physics_set("RTX-4090", "default")    # what the README's fit starts from
    assert where == "built-in set default" and start == builtin_set("default")
    moved = [k for k in ("weight_reads", "decode_kv_reads", "step_cpu_us", "request_cpu_us")
             if getattr(start, k) != getattr(fitted, k)]
    assert moved == ["weight_reads", "decode_kv_reads", "step_cpu_us", "request_cpu_us"]


def test_a_converted_vllm_bench_result_does_not_replay_its_failed_request(tmp_path):
    """`calibrate` of a `convert vllm-bench` conversion said `sim 4/3`: the failed request was
    replayed too. It is not replayed (docs/cli.md, "Failed requests are not replayed")."""
    bench = ROOT / "tests" / "workload" / "data" / "vllm_bench_result.json"
    res = _cli("convert", "vllm-bench", "--result", bench, "--output", tmp_path / "bench")
    assert res.exit_code == 0 and "4 rows (1 failed)" in res.stdout, res.output
    doc = _calibrate(tmp_path / "bench", "--model", "meta-llama/llama-3.1-8b-instruct", "--latency-model",
                     "blackbox", "--hardware", "H100", "--tp", "1")
    assert (doc["offered"], doc["completed_real"], doc["completed_sim"], doc["not_replayed"]) == (3, 3, 3, 1)


def test_fit_warns_when_it_starts_at_the_answer(tmp_path):
    """`fit runs/vllm-rtx4090` without --coefficients starts from the shipped set fitted on
    that run and returns it: a warning says so; from `default` there is none."""
    example = llmservingsim_layout(tmp_path)
    warning = ("the start, coefficient set 'RTX-4090-fitted', was fitted on run vllm-rtx4090-llama-3.1-8b "
               "already: the fit starts at its answer and returns it; --coefficients default starts "
               "from the physical set")
    res = _cli("fit", example, "--max-evaluations", "1", "-o", tmp_path / "a.yaml")
    assert res.exit_code == 0, res.output
    assert warning in res.stderr
    res = _cli("fit", example, "--coefficients", "default", "--max-evaluations", "1", "-o", tmp_path / "b.yaml")
    assert res.exit_code == 0, res.output
    assert "starts at its answer" not in res.stderr
