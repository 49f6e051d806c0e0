"""Bad input to convert / calibrate / fit: exit 2, one ``error:`` line naming the file and
field, no traceback, no output file (regressions found by a bad-input review)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.workload.test_observed_vllm_log import write_run

from .support import one_error

BENCH = Path(__file__).resolve().parents[1] / "workload" / "data" / "vllm_bench_result.json"


_one_error = one_error


def _meta(run: Path, change) -> None:
    meta = json.loads((run / "meta.json").read_text())
    change(meta)
    (run / "meta.json").write_text(json.dumps(meta))


def _rows(run: Path, change) -> None:
    path = run / "requests.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    change(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# (what to do to the run folder, the expected error line after "error: <run>/")
LOG_CASES = {
    "deeply nested JSON row": (
        lambda run: (run / "requests.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n"),
        "requests.jsonl:1: not JSON: nested too deeply"),
    "deeply nested meta.json": (
        lambda run: (run / "meta.json").write_text("[" * 100_000 + "]" * 100_000),
        "meta.json: not JSON: nested too deeply"),
    "hardware not an object": (
        lambda run: _meta(run, lambda m: m.__setitem__("hardware", "gpu")),
        "meta.json: hardware: not a JSON object"),
    "absurd max_num_seqs": (
        lambda run: _meta(run, lambda m: m["engine_kwargs"].__setitem__("max_num_seqs", 10**40)),
        "meta.json: engine_kwargs.max_num_seqs: missing or not a positive integer <= 2147483647"),
    # internal errors (exit 1) found by fuzzing: OverflowError rounding 1e308 s to µs,
    # int() of a 5000-digit id, an int32 array of a token ID beyond int32
    "last token 1e308 s": (
        lambda run: _rows(run, lambda rows: rows[1].__setitem__("last_token_ts", 1e308)),
        "requests.jsonl:2: last_token_ts: more than 1e+09 s after the earliest queued_ts"),
    "id of 5000 digits": (
        lambda run: _rows(run, lambda rows: rows[1].__setitem__("request_id", "bench-" + "9" * 5000)),
        "requests.jsonl:2: request_id: the number ending the id is too large for a workload line"),
    "absurd KV blocks": (
        lambda run: _meta(run, lambda m: m["kv_cache"].__setitem__("num_gpu_blocks", 2**40)),
        "meta.json: kv_cache.num_gpu_blocks: not a positive integer <= 2147483647"),
}


@pytest.mark.parametrize("case", list(LOG_CASES))
def test_convert_vllm_log_bad_run(cli, tmp_path, case):
    edit, expected = LOG_CASES[case]
    run = write_run(tmp_path)
    edit(run)
    out = tmp_path / "out"
    line = _one_error(cli("convert", "vllm-log", "--run", run, "--output", out))
    assert line == f"error: {run}/{expected}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm-rtx4090-tiny", "workload-wl.jsonl"]


def test_convert_vllm_log_token_id_beyond_int32(cli, tmp_path):
    """A token ID past int32 was an OverflowError (exit 1) building the trace's int32 array."""
    run = write_run(tmp_path)
    work = tmp_path / "workload-wl.jsonl"
    rows = [json.loads(x) for x in work.read_text().splitlines()]
    rows[1]["input_tok_ids"][0] = 2**31
    work.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _meta(run, lambda m: m.__setitem__("dataset_hash", hashlib.sha256(work.read_bytes()).hexdigest()))
    line = _one_error(cli("convert", "vllm-log", "--run", run, "--output", tmp_path / "out"))
    assert line == f"error: {work}:2: input_tok_ids: missing or not a list of token IDs (integers 0 to 2147483647)"


BENCH_CASES = {
    "output length beyond int32": ({"output_lens": [4, 10**20, 0, 2]}, "output_lens[1]: more than 2147483647 tokens"),
    "send times beyond 1e9 s": ({"start_times": [73412.5, 1e300, 73413.25, 73414.0]},
                                "start_times[1]: send times span more than 1e+09 s"),
    "ttft beyond 1e9 s": ({"ttfts": [0.125, 1e12, 0.0, 0.25]}, "ttfts[1]: more than 1e+09 s"),
    "itls summing beyond 1e9 s": ({"itls": [[1e300, 0.03125, 0.046875], [0.04, 0.04], [], [0.06]]},
                                  "itls[0]: sums to more than 1e+09 s"),
    "model_id not a string": ({"model_id": 5}, "model_id: not a string"),
}


@pytest.mark.parametrize("case", list(BENCH_CASES))
def test_convert_vllm_bench_absurd_values(cli, tmp_path, case):
    changes, expected = BENCH_CASES[case]
    data = json.loads(BENCH.read_text())
    data.update(changes)
    result = tmp_path / "b.json"
    result.write_text(json.dumps(data))
    line = _one_error(cli("convert", "vllm-bench", "--result", result, "--output", tmp_path / "x"))
    assert line == f"error: {result}: {expected}"
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]


IP_SECTION = "stages: [{rate: 6.0, duration: 10}]\nshared_prefix: {%s}\n"
IP_CASES = {
    "too many system prompts": (
        IP_SECTION % "num_unique_system_prompts: 100000000, num_users_per_system_prompt: 1",
        ":2: shared_prefix.num_unique_system_prompts: input should be less than or equal to 100000"),
    "too many clients in all": (
        IP_SECTION % "num_unique_system_prompts: 1000, num_users_per_system_prompt: 1000",
        ":2: shared_prefix: 1000000 clients (system prompts x users), at most 100000"),
    "too many stages": (
        "stages: [" + ", ".join(["{rate: 1, duration: 1}"] * 10_001) + "]\nshared_prefix: {num_unique_system_prompts: "
        "1, num_users_per_system_prompt: 1}\n",
        ":1: stages: list should have at most 10000 items"),
    # found by CLI fuzzing: these overflowed expanding (OverflowError, an internal error, exit 1)
    # or asked for 10^9 clients
    "absurd stage duration": (
        "stages: [{rate: 2, duration: 1}, {rate: 2, duration: 1e308}]\nshared_prefix: "
        "{num_unique_system_prompts: 1, num_users_per_system_prompt: 1}\n",
        ":1: stages[1].duration: input should be less than or equal to 100000000, got 1e+308"),
    "absurd stage rate, multi-turn": (
        IP_SECTION.replace("6.0", "1e308") % "num_unique_system_prompts: 1, num_users_per_system_prompt: 1, "
        "enable_multi_turn_chat: true",
        ":1: stages[0].rate: input should be less than or equal to 1000000000, got 1e+308"),
    "tiny stage rate, multi-turn": (
        IP_SECTION.replace("6.0", "1e-300") % "num_unique_system_prompts: 1, num_users_per_system_prompt: 1, "
        "enable_multi_turn_chat: true",
        ":1: stages[0].rate: input should be greater than or equal to 0.000001, got 1e-300"),
    "too many clients over the stages": (
        "stages: [" + ", ".join(["{rate: 1, duration: 1}"] * 10_000) + "]\nshared_prefix: {num_unique_system_prompts: "
        "100, num_users_per_system_prompt: 1000}\n",
        ":2: shared_prefix: 1000000000 clients (10000 stages x 100000 system prompts x users), at most 100000"),
    "deeply nested YAML": ("a: " + "[" * 50_000 + "]" * 50_000 + "\n", ":1: nested too deeply (more than 64 levels)"),
    "file over 16 MiB": ("# " + "x" * (16 << 20) + "\n", ": larger than 16777216 bytes"),
}


@pytest.mark.parametrize("case", list(IP_CASES))
def test_convert_inference_perf_caps(cli, tmp_path, case):
    text, expected = IP_CASES[case]
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    line = _one_error(cli("convert", "inference-perf", "--spec", spec, "--output", tmp_path / "o.yaml"))
    assert line.startswith(f"error: {spec}{expected}"), line
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]


def test_calibrate_plot_and_report_paths_are_checked_first(cli, tmp_path):
    run = write_run(tmp_path)
    (tmp_path / "p").write_text("")
    assert _one_error(cli("calibrate", run, "--plot", tmp_path / "p")) == \
        f"error: {tmp_path}/p: --plot: exists and is not a folder"
    (tmp_path / "r.json").mkdir()
    assert _one_error(cli("calibrate", run, "--report", tmp_path / "r.json")) == \
        f"error: {tmp_path}/r.json: --report: is a directory, expected a file path"


def test_calibrate_bench_result_with_model_flags(cli, tmp_path):
    """docs/cli.md: a vllm bench result takes --scenario or --model/--hardware/--tp."""
    res = cli("calibrate", BENCH, "--format", "json", "--model", "meta-llama/llama-3.1-8b-instruct",
              "--hardware", "H100", "--tp", "1")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)["runs"][0]
    assert (doc["model"], doc["hardware"], doc["tp"]) == ("meta-llama/llama-3.1-8b-instruct", "H100", 1)
    assert (doc["offered"], doc["completed_real"]) == (3, 3)


def test_fit_output_is_a_directory(cli, tmp_path):
    run = write_run(tmp_path)
    (tmp_path / "f.yaml").mkdir()
    assert _one_error(cli("fit", run, "-o", tmp_path / "f.yaml", "--max-evaluations", "1")) == \
        f"error: {tmp_path}/f.yaml: --output: is a directory, expected a file path"


def test_absurd_kv_block_count_is_refused_not_a_memory_error():
    """1e11 KV blocks was a MemoryError (exit 1) while building the cache."""
    from typer.testing import CliRunner

    from blis_simpy.cli.app import app
    res = CliRunner().invoke(app, ["run", "--model", "meta-llama/llama-3.1-8b-instruct", "--alpha-coeffs",
                                   "1,1,1", "--beta-coeffs", "1,1,1", "--total-kv-blocks", "100000000000",
                                   "--num-requests", "5"])
    assert res.exit_code == 2
    assert res.stderr.startswith("error: --total-kv-blocks:") and res.stderr.count("\n") == 1
    assert "100000000" in res.stderr


@pytest.mark.parametrize("prefix", ["", "/", "..", "x/.."])
@pytest.mark.parametrize("kind", ["vllm-bench", "vllm-log"])
def test_convert_output_prefix_without_a_name(cli, tmp_path, monkeypatch, kind, prefix):
    """An --output PREFIX naming a directory was a ValueError from Path.with_name (exit 1,
    'internal error'); it is refused before anything is read or written."""
    monkeypatch.chdir(tmp_path)
    run = write_run(tmp_path)
    src = ["--result", BENCH] if kind == "vllm-bench" else ["--run", run]
    line = _one_error(cli("convert", kind, *src, "--output", prefix))
    assert line.startswith("error: --output: '") and "is not a file PREFIX (it names a directory)" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm-rtx4090-tiny", "workload-wl.jsonl"]


@pytest.mark.parametrize("name", [".csv", ".header.yaml", ".scenario.yaml"])
def test_calibrate_converted_file_without_a_prefix(cli, tmp_path, name):
    """`calibrate DIR/.csv` was Path.with_name('') -> ValueError (exit 1)."""
    (tmp_path / name).write_text("")
    line = _one_error(cli("calibrate", tmp_path / name))
    assert line.startswith(f"error: {tmp_path / name}: not a vLLM run folder"), line
