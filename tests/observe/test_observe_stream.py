"""``observe`` of a generated workload streams (docs/performance.md, "Very long runs"): the
sender takes each request from the workload when its turn comes, and drops the prompts it
sent once a trace could not carry them. Against the live SSE server of sse_server.py; every
time assertion is causal (see test_observe.py)."""

from __future__ import annotations

import time
from pathlib import Path

from typer.testing import CliRunner

import blis_simpy.observe as observe_pkg
from blis_simpy.cli.app import app
from blis_simpy.observe import ObserveConfig, observe
from blis_simpy.observe import client as client_mod
from blis_simpy.observe import records as records_mod
from blis_simpy.observe.records import carries_token_ids, trace_records
from blis_simpy.request import Request
from blis_simpy.workload import read_trace
from blis_simpy.workload.generated_stream import GeneratedRequestStream

from .test_observe_cli import DIST


class Pulled:
    """A workload that records when (perf_counter_ns) each request was taken from it."""

    def __init__(self, requests):
        self.requests = requests
        self.pulled_ns: list[int] = []

    def __len__(self):
        return len(self.requests)

    def __iter__(self):
        for r in self.requests:
            self.pulled_ns.append(time.perf_counter_ns())
            yield r


def _reqs(arrivals_us, n_prompt=5):
    return [Request(f"r{i}", a, list(range(1 + i, 1 + i + n_prompt)), [7, 7]) for i, a in
            enumerate(arrivals_us)]


def test_requests_are_taken_when_their_turn_comes(server):
    arrivals = [0, 150_000, 300_000, 450_000]
    work = Pulled(_reqs(arrivals))
    run = observe(work, ObserveConfig(server.url, "m", timeout_s=30.0))
    assert [o.status for o in run.observations] == ["ok"] * 4
    # request k is drawn only once request k-1's arrival time has come (one ahead at most)
    assert len(work.pulled_ns) == 4
    for k in range(1, 4):
        assert (work.pulled_ns[k] - run.t0_ns) // 1000 >= arrivals[k - 1]


def test_sent_prompts_are_dropped_once_a_trace_cannot_carry_them(server, monkeypatch):
    reqs = _reqs([0, 0, 0])                       # 3 x 5 prompt tokens
    run = observe(reqs, ObserveConfig(server.url, "m", timeout_s=30.0))
    assert all(o.request.tokens is not None for o in run.observations)
    assert carries_token_ids(run.observations, "completions")
    ids = [list(r.input_token_ids) for r in trace_records(run.observations, streaming=True,
                                                          token_ids=True)]
    assert sorted(ids) == [[1, 2, 3, 4, 5], [2, 3, 4, 5, 6], [3, 4, 5, 6, 7]]
    for module in (client_mod, records_mod):      # 15 IDs pass a cap of 12
        monkeypatch.setattr(module, "MAX_TOKEN_IDS_PER_FILE", 12)
    reqs = _reqs([0, 0, 0])
    run = observe(reqs, ObserveConfig(server.url, "m", timeout_s=30.0))
    assert all(r.tokens is None for r in reqs)
    assert not carries_token_ids(run.observations, "completions")
    rows = trace_records(run.observations, streaming=True)
    assert sorted(x.input_tokens for x in rows) == [5, 5, 5]
    chat = _reqs([0])                             # a chat trace never carries IDs: at once
    observe(chat, ObserveConfig(server.url, "m", api_format="chat", timeout_s=30.0))
    assert chat[0].tokens is None and chat[0].input_len == 5


def test_the_cli_streams_a_generated_workload(server, tmp_path: Path, monkeypatch):
    seen = []

    def spy(requests, *a, **k):
        seen.append(requests)
        return observe(requests, *a, **k)

    monkeypatch.setattr(observe_pkg, "observe", spy)
    h, d = tmp_path / "o.yaml", tmp_path / "o.csv"
    r = CliRunner().invoke(app, ["observe", "--server-url", server.url, "--model", "m", *DIST,
                                 "--trace-header", str(h), "--trace-data", str(d)])
    assert r.exit_code == 0, r.stderr
    assert isinstance(seen[0], GeneratedRequestStream) and len(seen[0]) == 4
    assert [x.input_tokens for x in read_trace(h, d).records] == [8] * 4
