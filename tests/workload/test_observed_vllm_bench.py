"""Reading a ``vllm bench serve`` result (blis_simpy.measured.vllm_bench) on the hand-made
sample of tests/workload/data (its README gives the times)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.measured.vllm_bench import load_vllm_bench

SAMPLE = Path(__file__).parent / "data" / "vllm_bench_result.json"


def _variant(tmp_path: Path, **changes) -> Path:
    data = json.loads(SAMPLE.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    p = tmp_path / "result.json"
    p.write_text(json.dumps(data))
    return p


def test_sample_rows_exact():
    run = load_vllm_bench(SAMPLE)
    got = [(r.request_id, r.arrival_time_us, r.send_time_us, r.first_chunk_time_us, r.last_chunk_time_us,
            r.num_chunks, r.input_tokens, r.output_tokens, r.status, r.streaming) for r in run.records]
    assert got == [
        (0, 0, 0, 125_000, 234_375, 4, 512, 4, "ok", True),             # 0.125 + 3 ITLs (0.109375)
        (1, 500_000, 500_000, 562_500, 640_625, 3, 128, 3, "ok", True),  # 0.0625 + 0.078125
        (2, 750_000, 750_000, 0, 0, 0, 500, 0, "error", True),
        (3, 1_500_000, 1_500_000, 1_750_000, 1_812_500, 2, 256, 2, "ok", True)]
    assert run.records[2].error_message == ("Bad Request: This model's maximum context length is 131072 "
                                            "tokens. Traceback (most recent call last):")
    assert all(r.input_token_ids is None and r.model == "" for r in run.records)
    assert (run.header.mode, run.header.created_at, run.header.server.model) == (
        "real", "20250614-101530", "meta-llama/Llama-3.1-8B-Instruct")
    assert [(q.id, q.ttft_ms, q.e2e_ms, q.tpot_ms) for q in run.requests] == [
        ("request_0", 125.0, 234.375, 109.375 / 3), ("request_1", 62.5, 140.625, 39.0625),
        ("request_3", 250.0, 312.5, 62.5)]
    assert run.settings is None and run.notes == ["1 of 4 requests failed (status error)"]


def test_without_start_times_sends_are_evenly_spaced_at_the_rate(tmp_path):
    run = load_vllm_bench(_variant(tmp_path, start_times=None, max_concurrency=16))
    assert [r.send_time_us for r in run.records] == [0, 500_000, 1_000_000, 1_500_000]  # 2 req/s
    assert run.notes[0].startswith("no start_times: sends assumed evenly spaced at request_rate 2/s")
    assert run.notes[1].startswith("max_concurrency 16: real sends also waited")
    inf = load_vllm_bench(_variant(tmp_path, start_times=None, request_rate="inf"))
    assert [r.send_time_us for r in inf.records] == [0, 0, 0, 0]


@pytest.mark.parametrize("changes, field, problem", [
    ({"itls": [[0.1], [0.1], []]}, "itls", "3 entries, expected 4 (one per request, as input_lens)"),
    ({"ttfts": [0.1, -0.5, 0.0, 0.2]}, "ttfts[1]", "not a finite number >= 0 (s)"),
    ({"itls": [[0.1], [0.1, "x"], [], [0.1]]}, "itls[1][1]", "not a finite number >= 0 (s)"),
    ({"output_lens": [4, 3, 0, 2.5]}, "output_lens[3]", "not an integer >= 0"),
    ({"errors": ["", 3, "", ""]}, "errors[1]", "not a string"),
    ({"request_rate": 0}, "request_rate", "not a number > 0 or inf"),
    ({"input_lens": None}, "input_lens", "missing or not a list (was the run saved with --save-detailed?)"),
])
def test_malformed_result_names_file_and_field(tmp_path, changes, field, problem):
    p = _variant(tmp_path, **changes)
    with pytest.raises(ConfigError) as ei:
        load_vllm_bench(p)
    assert (ei.value.file, ei.value.field, ei.value.problem) == (str(p), field, problem)


def test_not_json_names_the_line(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('{\n"input_lens": [1,\n')
    with pytest.raises(ConfigError) as ei:
        load_vllm_bench(p)
    assert (ei.value.file, ei.value.line) == (str(p), 3)
