"""An integer of more than 4,300 digits (Python's limit on converting text to int) in any
file a user names is one located line, exit 2, no output file (issue 23, finding 6; it was
``internal error: ValueError: Exceeds the limit (4300 digits)``, exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.support import SMALL_SCENARIO, trace_row, write_trace_files
from tests.workload.iperf_support import write_run as write_iperf_run
from tests.workload.test_observed_vllm_log import write_run

BIG = "9" * 4301
BENCH = Path(__file__).resolve().parents[1] / "workload" / "data" / "vllm_bench_result.json"
TOO_LONG = "an integer of more than 4300 digits"


def _scenario(d: Path):
    sc = d / "sc.yaml"
    sc.write_text(SMALL_SCENARIO.replace("seed: 42", f"seed: {BIG}"))
    return ["validate", sc], f"{sc}:1: seed: {TOO_LONG}"


def _scenario_list_item(d: Path):
    sc = d / "sc.yaml"
    sc.write_text(SMALL_SCENARIO.replace("alpha_coeffs: [10326.268121600151,", f"alpha_coeffs: [{BIG},"))
    return ["validate", sc], f"{sc}:5: {TOO_LONG}"


def _sweep(d: Path):
    (d / "base.yaml").write_text(SMALL_SCENARIO)
    sw = d / "sweep.yaml"
    sw.write_text(f"base: base.yaml\naxes:\n  workload.rate: [10]\nrepeats: {BIG}\n")
    return ["sweep", sw, "--out", d / "out"], f"{sw}:4: repeats: {TOO_LONG}"


def _plan(d: Path):
    plan = d / "plan.yaml"
    plan.write_text(f"model: meta-llama/llama-3.1-8b-instruct\ngpus: [H100]\nmax_gpus: {BIG}\n"
                    "workload: {rate: 10}\nslo: {ttft_p99_ms: 100}\n")
    return ["plan", plan, "--serial", "--out", d / "out.json"], f"{plan}:3: max_gpus: {TOO_LONG}"


def _workload_spec(d: Path):
    spec = d / "w.yaml"
    spec.write_text(f"version: 2\nseed: {BIG}\n")
    return (["run", "--model", "meta-llama/llama-3.1-8b-instruct", "--workload-spec", spec,
             "--results-path", d / "out.json"], f"{spec}:2: seed: {TOO_LONG}")


def _inference_perf(d: Path):
    spec = d / "ip.yaml"
    spec.write_text(f"stages: [{{rate: 6.0, duration: 10}}]\nshared_prefix: {{num_unique_system_prompts: {BIG}}}\n")
    return (["convert", "inference-perf", "--spec", spec, "--output", d / "out.yaml"],
            f"{spec}:2: num_unique_system_prompts: {TOO_LONG}")


def _inference_perf_run(d: Path):
    run = write_iperf_run(d)
    config = run / "results" / "config.yaml"
    config.write_text(config.read_text().replace("num_groups: 1", f"num_groups: {BIG}"))
    return ["calibrate", run], f"{config}:7: num_groups: {TOO_LONG}"


def _vllm_bench(d: Path):
    result = d / "b.json"
    result.write_text(BENCH.read_text().replace("{", f'{{"num_prompts_x": {BIG}, ', 1))
    return (["convert", "vllm-bench", "--result", result, "--output", d / "out"],
            f"{result}:1: not JSON: {TOO_LONG}")


def _vllm_log_rows(d: Path):
    run = write_run(d)
    rows = (run / "requests.jsonl").read_text().splitlines()
    rows[1] = rows[1].replace('"input_toks": 3', f'"input_toks": {BIG}')
    (run / "requests.jsonl").write_text("\n".join(rows) + "\n")
    return (["convert", "vllm-log", "--run", run, "--output", d / "out"],
            f"{run}/requests.jsonl:2: not JSON: {TOO_LONG}")


def _vllm_log_meta(d: Path):
    run = write_run(d)
    meta = run / "meta.json"
    meta.write_text(meta.read_text().replace('"max_num_seqs": 8', f'"max_num_seqs": {BIG}'))
    return (["convert", "vllm-log", "--run", run, "--output", d / "out"],
            f"{meta}:1: not JSON: {TOO_LONG}")


def _report_json(d: Path):
    results = d / "r.json"
    results.write_text(f'{{"completed_requests": 1,\n "requests": [{{"num_decode_tokens": {BIG}}}]}}')
    return (["report", results, "--out", d / "out"],
            f"{results}: INPUT: not JSON: {TOO_LONG}: line 2 column 37 (char 62)")


def _trace_csv(d: Path):
    header, data = write_trace_files(d, [trace_row(0, 0, 10, 5), trace_row(1, 100, BIG, 5)])
    return (["replay", "--model", "meta-llama/llama-3.1-8b-instruct", "--trace-header", header,
             "--trace-data", data, "--results-path", d / "out.json"],
            f"{data}:3: input_tokens: {TOO_LONG}")


CASES = {f.__name__[1:]: f for f in (_scenario, _scenario_list_item, _sweep, _plan, _workload_spec,
                                     _inference_perf, _inference_perf_run, _vllm_bench, _vllm_log_rows, _vllm_log_meta,
                                     _report_json, _trace_csv)}


@pytest.mark.parametrize("kind", list(CASES))
def test_an_integer_too_long_to_convert_is_a_located_line(cli, tmp_path, kind):
    args, expected = CASES[kind](tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    res = cli(*args)
    assert (res.exit_code, res.stdout) == (2, ""), res.stderr
    assert res.stderr == f"error: {expected}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before      # no output written


def test_a_timeline_cell_too_long_is_a_short_line(cli, tmp_path):
    """pyarrow reads a timeline CSV: its refusal quoted the whole 4,301-digit cell."""
    tl = tmp_path / "t.csv"
    tl.write_text("t_us,instance,role,running,waiting,kv_blocks_used,kv_blocks_total,preemptions,"
                  f"kv_transfers_in_flight\n0,instance_0,,0,0,0,10,0,\n{BIG},instance_0,,0,0,0,10,0,\n")
    res = cli("report", tl, "--out", tmp_path / "out")
    assert (res.exit_code, res.stdout) == (2, "")
    line = res.stderr.rstrip("\n")
    assert line.startswith(f"error: {tl}: INPUT: not a readable timeline: ") and line.endswith("...")
    assert "\n" not in line and len(line) < len(str(tl)) + 400
    assert not (tmp_path / "out").exists()
