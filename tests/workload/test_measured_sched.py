"""Scheduling delay of measured runs: a vLLM log's ``scheduled_ts`` → ``RealRequest.sched_ms``
→ TraceV2 ``scheduled_time_us`` → back (blis_simpy.measured), on a tiny hand-made folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.measured.converted import converted_files, load_converted, write_files
from blis_simpy.measured.vllm_bench import load_vllm_bench
from blis_simpy.measured.vllm_log import load_vllm_log

from .test_observed_vllm_log import write_run

SAMPLE = Path(__file__).parent / "data" / "vllm_bench_result.json"


def with_scheduled(run: Path, values) -> Path:
    """Rewrite requests.jsonl with these ``scheduled_ts`` per line (``...`` = key absent)."""
    path = run / "requests.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row, v in zip(rows, values, strict=True):
        row.pop("scheduled_ts")
        if v is not ...:
            row["scheduled_ts"] = v
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


# queued_ts 100.0, 100.25, 100.125; first_token_ts 100.5, 101.0, 100.375 (test_observed_vllm_log.REQS)
def test_sched_ms_trace_column_and_back(tmp_path):
    run = load_vllm_log(with_scheduled(write_run(tmp_path), [100.0625, ..., 100.25]))
    assert [(q.id, q.sched_ms) for q in run.requests] == [
        ("bench-0", 62.5), ("bench-1", None), ("bench-2", 125.0)]
    # rows by arrival: request 0 at 0, 2 at 125 000, 1 at 250 000 µs; scheduled on the same origin
    assert [(r.request_id, r.scheduled_time_us) for r in run.records] == [(0, 62_500), (2, 250_000), (1, 0)]
    out = tmp_path / "tiny"
    write_files(converted_files(run, out))
    csv_lines = (tmp_path / "tiny.csv").read_text().splitlines()
    assert csv_lines[0].endswith(",finish_reason,input_token_ids,scheduled_time_us")
    assert csv_lines[1].endswith(",1 2 3 4,62500") and csv_lines[3].endswith(",1 2 3,0")
    back = load_converted(out)
    assert [(q.id, q.sched_ms) for q in back.requests] == [
        ("request_0", 62.5), ("request_2", 125.0), ("request_1", None)]


def test_no_scheduled_ts_means_unknown_and_no_column(tmp_path):
    run = load_vllm_log(with_scheduled(write_run(tmp_path), [..., None, ...]))    # null = not logged
    assert [q.sched_ms for q in run.requests] == [None, None, None]
    write_files(converted_files(run, tmp_path / "tiny"))
    assert "scheduled_time_us" not in (tmp_path / "tiny.csv").read_text()
    assert [q.sched_ms for q in load_converted(tmp_path / "tiny").requests] == [None, None, None]


def test_scheduled_at_arrival_is_a_zero_delay(tmp_path):
    """write_run logs scheduled_ts = queued_ts: every delay is 0 ms. Request 0 is scheduled at
    the trace's origin, so its scheduled_time_us is 0, which TraceV2 reads as unknown."""
    run = load_vllm_log(write_run(tmp_path))
    assert [q.sched_ms for q in run.requests] == [0.0, 0.0, 0.0]
    write_files(converted_files(run, tmp_path / "tiny"))
    assert [q.sched_ms for q in load_converted(tmp_path / "tiny").requests] == [None, 0.0, 0.0]


@pytest.mark.parametrize("values, line, problem", [
    ([100.0625, "soon", 100.25], 2, "not a finite number"),
    ([100.0625, True, 100.25], 2, "not a finite number"),
    ([100.0625, 100.5, float("nan")], 3, "not a finite number"),
    ([99.9, 100.5, 100.25], 1, "needs queued_ts <= scheduled_ts <= first_token_ts"),
    ([100.0625, 101.0, 100.5], 3, "needs queued_ts <= scheduled_ts <= first_token_ts"),
])
def test_bad_scheduled_ts_is_located(tmp_path, values, line, problem):
    folder = with_scheduled(write_run(tmp_path), values)
    with pytest.raises(ConfigError) as ei:
        load_vllm_log(folder)
    e = ei.value
    assert (e.file, e.line, e.field, e.problem) == (
        str(folder / "requests.jsonl"), line, "scheduled_ts", problem)


def test_vllm_bench_has_no_scheduling_time():
    run = load_vllm_bench(SAMPLE)
    assert run.requests and all(q.sched_ms is None for q in run.requests)
    assert all(r.scheduled_time_us == 0 for r in run.records)
