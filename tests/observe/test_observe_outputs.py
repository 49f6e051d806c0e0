"""``observe``'s files written as the requests finish (observe/outputs.py): the same bytes as
the whole-run writers for the same timings, the observations released once recorded, and a
failing output that stops the sending. Hand-made observations have exact µs times; the rest
runs against the live SSE server of sse_server.py (causal assertions only, test_observe.py)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from blis_simpy.atomic import Batch
from blis_simpy.cli.observe_cmd import make_trace_header
from blis_simpy.errors import ConfigError
from blis_simpy.observe import ObserveConfig, observe
from blis_simpy.observe import records as records_mod
from blis_simpy.observe.outputs import ObserveOutputs
from blis_simpy.observe.records import (
    Observation,
    carries_token_ids,
    results_document,
    summarize,
    trace_records,
    write_json,
)
from blis_simpy.request import Request
from blis_simpy.workload.tracev2_write import write_trace_files

from .sse_server import HTTP_500

RUN = {"server_url": "http://x", "started_at": "2026-01-01T00:00:00+00:00"}


def _obs(i: int, send_us: int, chunks_us: list[int], status: str = "ok", prompt=(5, 6, 7)):
    o = Observation(Request(f"r{i}", send_us, list(prompt), [1, 1]), send_us, send_us)
    for t in chunks_us:
        o.add_chunk(t)
    o.status = status
    o.usage_prompt_tokens, o.usage_completion_tokens = len(prompt), len(chunks_us)
    o.end_us = chunks_us[-1] if chunks_us else send_us
    return o


def _header():
    return make_trace_header(ObserveConfig("http://x", "m"), started_at="2026-01-01T00:00:00+00:00",
                             warmup=1, seed=42, spec_path="", rtt_ms=None)


def _both(tmp: Path, observations, *, api_format="completions", warmup=1):
    """(streamed files, whole-run files) of ``observations``, as bytes."""
    files = ObserveOutputs(Batch(), trace_paths=(tmp / "s.yaml", tmp / "s.csv"), results=tmp / "s.json",
                           streaming=True, api_format=api_format, warmup_requests=warmup)
    for o in observations:
        files.add(o)
    summary = files.finish(header=_header(), run=RUN)
    files.batch.commit()
    ids = carries_token_ids(observations, api_format)
    write_trace_files(tmp / "w.yaml", tmp / "w.csv", _header(),
                      trace_records(observations, streaming=True, token_ids=ids))
    write_json(tmp / "w.json", results_document(observations, warmup_requests=warmup, run=RUN))
    assert summary == summarize(observations, warmup)
    return ([(tmp / f"s.{e}").read_bytes() for e in ("yaml", "csv", "json")],
            [(tmp / f"w.{e}").read_bytes() for e in ("yaml", "csv", "json")])


def test_hand_made_observations_give_the_whole_run_bytes_and_exact_summary(tmp_path):
    obs = [_obs(0, 0, [1_000, 1_500]), _obs(1, 100, [2_100, 2_400, 2_900]),
           _obs(2, 200, [], status="error"), _obs(3, 300, [1_300])]
    streamed, whole = _both(tmp_path, obs)
    assert streamed == whole
    res = json.loads(streamed[2])
    s = res["summary"]                     # after the warm-up r0: r1 and r3 are ok
    assert (s["requests"], s["ok"], s["errors"]) == (4, 2, 1)
    assert s["ttft_ms"] == {"count": 2, "mean": 1.5, "p50": 1.5, "p90": 1.9, "p99": 1.99}
    assert s["itl_ms"]["count"] == 2 and s["itl_ms"]["mean"] == 0.4      # 300 and 500 µs
    assert s["e2e_ms"]["p50"] == 1.9       # (2,800 + 1,000) / 2 µs
    assert s["duration_s"] == 2_800 / 1e6  # first send 100 µs .. last chunk 2,900 µs
    assert [r["request_id"] for r in res["requests"]] == [0, 1, 2, 3]
    assert streamed[1].splitlines()[0].endswith(b",input_token_ids")
    assert streamed[1].splitlines()[2].endswith(b",5 6 7")
    # no request at all: an empty list, an empty trace
    streamed, whole = _both(tmp_path, [])
    assert streamed == whole and b'"requests": []' in streamed[2]


def test_past_the_token_id_cap_the_held_rows_go_out_without_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(records_mod, "MAX_TOKEN_IDS_PER_FILE", 7)   # 3 + 3 IDs fit, 9 do not
    obs = [_obs(i, 10 * i, [100 + 10 * i]) for i in range(4)]
    streamed, whole = _both(tmp_path, obs)
    assert streamed == whole and b"input_token_ids" not in streamed[1]
    chat = [_obs(i, 10 * i, [100 + 10 * i]) for i in range(2)]
    streamed, whole = _both(tmp_path, chat, api_format="chat", warmup=0)
    assert streamed == whole and b"input_token_ids" not in streamed[1]


def test_a_live_run_streams_the_bytes_the_whole_run_writers_give(server, tmp_path):
    reqs = [Request(f"r{i}", 1_000 * i, [100 + i, 5, 6], [7] * (2 + i % 3)) for i in range(6)]
    reqs[2] = Request("r2", 2_000, [HTTP_500, 1], [7, 7])
    kept: list[Observation] = []
    files = ObserveOutputs(Batch(), trace_paths=(tmp_path / "s.yaml", tmp_path / "s.csv"),
                           results=tmp_path / "s.json", streaming=True, api_format="completions",
                           warmup_requests=1)

    def record(o):
        kept.append(o)
        files.add(o)
    run = observe(reqs, ObserveConfig(server.url, "m", timeout_s=30.0, max_concurrency=3),
                  record=record)
    assert run.observations == [] and [o.request.id for o in kept] == [r.id for r in reqs]
    files.finish(header=_header(), run=RUN)
    files.batch.commit()
    assert files.first_failure is kept[2]
    _, whole = _both(tmp_path, kept)
    assert [(tmp_path / f"s.{e}").read_bytes() for e in ("yaml", "csv", "json")] == whole


def _alive() -> int:
    """How many Observation objects exist (the garbage collector tracks each: it holds a list)."""
    return sum(type(x) is Observation for x in gc.get_objects())


def test_recorded_observations_are_released(server):
    """What ``record`` was given is freed once recorded: while 12 observations are recorded
    no more exist than the requests in flight, and none outlives the run; without ``record``
    the run keeps all 12 (what this count would catch)."""
    reqs = lambda: [Request(f"r{i}", 0, [100 + i, 5], [7, 7]) for i in range(12)]  # noqa: E731
    before = _alive()
    seen: list[int] = []
    run = observe(reqs(), ObserveConfig(server.url, "m", timeout_s=30.0, max_concurrency=2),
                  record=lambda o: seen.append(_alive() - before))
    assert len(seen) == 12 and run.observations == []
    assert max(seen) <= 3                  # the recorded one and those in flight, never 12
    assert _alive() == before
    kept = observe(reqs(), ObserveConfig(server.url, "m", timeout_s=30.0, max_concurrency=2))
    assert len(kept.observations) == 12 and _alive() == before + 12


def test_an_output_that_fails_stops_the_sending(server):
    reqs = [Request(f"r{i}", 0, [100 + i, 5], [7, 7]) for i in range(5)]

    def record(o):
        raise OSError(28, "No space left on device", "out.csv")
    with pytest.raises(OSError, match="No space left"):
        observe(reqs, ObserveConfig(server.url, "m", timeout_s=30.0, max_concurrency=1),
                record=record)
    assert len(server.received) == 1           # the first answer's record stopped the rest


def test_an_aborted_run_leaves_no_file_and_one_path_for_two_outputs_is_refused_at_once(tmp_path):
    files = ObserveOutputs(Batch(), trace_paths=(tmp_path / "t.yaml", tmp_path / "t.csv"),
                           results=tmp_path / "r.json", streaming=True, api_format="completions",
                           warmup_requests=0)
    files.add(_obs(0, 0, [1_000]))
    assert len(list(tmp_path.iterdir())) == 3           # the three staged .tmp files
    files.abort()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="each output needs its own file"):
        ObserveOutputs(Batch(), trace_paths=(tmp_path / "t.yaml", tmp_path / "t.csv"),
                       results=tmp_path / "t.csv", streaming=True, api_format="chat",
                       warmup_requests=0)
    assert list(tmp_path.iterdir()) == []
