"""Deciders that read the pools (docs/extending.md, "A load-aware decider"): the read-only
:class:`~blis_simpy.disagg.deciders.PoolView`, the built-in ``load-aware`` decider, and a
user's load-aware plugin selected by a scenario file.

The runs: blackbox latency with alpha = 0 and beta = [1000, 0, 0] (every engine step takes
exactly 1000 µs, no queueing delay), synchronous scheduling, one running request per
instance, 1 prefill + 1 decode instance. Three requests of 32 prompt tokens and 3 outputs
arrive at 0, 0 and 100 µs. r0's and r1's decisions (both at 0, before either is routed: the
decision events of a µs precede its prefill routing events) see an empty prefill pool. Split,
r0's prefill sub-request runs in the prefill step [0, 1000) and r1's waits in the queue; so
at r2's decision (100 µs) the prefill pool queues exactly one request.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from blis_simpy.disagg.deciders import (
    Always,
    DisaggregationDecider,
    LoadAware,
    PoolView,
    make_decider,
)
from blis_simpy.request import Request
from blis_simpy.snapshot import InstanceSnapshot, RouterState
from tests.cli.support import trace_row, write_trace_files

PLUGIN = '''
from pydantic import BaseModel, Field

from blis_simpy.disagg.deciders import DisaggregationDecider


class LongPromptWhileIdle(DisaggregationDecider, name="long-prompt-idle"):
    """Split a long prompt only while no prefill instance has a request waiting."""

    class Params(BaseModel):
        min_tokens: int = Field(1024, ge=0)

    def decide(self, req, pools):
        idle = all(s.queue_depth == 0 for s in pools.prefill.snapshots)
        return req.input_len >= self.params.min_tokens and idle
'''


def _req(n_in: int) -> Request:
    return Request(f"r{n_in}", 0, list(range(n_in)), [0] * 4)


def _view(prefill_queues, calls):
    """A PoolView over fake states: prefill instances with these queue depths; ``calls``
    records which pools were read."""
    pools = {"P": [InstanceSnapshot(f"p{i}", i, queue_depth=q) for i, q in enumerate(prefill_queues)],
             "D": [InstanceSnapshot("d0", 9)]}

    def state_of(pool):
        calls.append(pool)
        return RouterState(tuple(pools[pool]), 7)

    return PoolView(7, state_of, "P", "D")


def test_the_view_is_built_on_first_read_and_only_for_the_pool_read():
    calls = []
    view = _view([1, 2], calls)
    assert calls == []
    assert [s.queue_depth for s in view.prefill.snapshots] == [1, 2]
    assert view.prefill is view.prefill and calls == ["P"]        # built once
    assert view.decode.snapshots[0].id == "d0" and calls == ["P", "D"]
    assert view.clock_us == 7 and view.prefill.clock_us == 7


def test_a_decide_with_pools_is_detected_from_its_signature():
    class Reads(DisaggregationDecider, name="test-reads-pools"):
        def decide(self, req, pools):
            return True

    class Blind(DisaggregationDecider, name="test-blind"):
        def decide(self, req):
            return True

    assert Reads.reads_pools and LoadAware.reads_pools
    assert not Blind.reads_pools and not Always.reads_pools


@pytest.mark.parametrize("n_in, queues, split", [
    (1001, [0, 1], True),        # 1 queued < 2
    (1001, [1, 1], False),       # 2 queued, not < 2
    (1000, [0, 0], False),       # not longer than 1000 tokens
    (1001, [], True),            # nothing queued anywhere
])
def test_load_aware_defaults_by_hand(n_in, queues, split):
    decider = make_decider("load-aware", {})
    calls = []
    assert decider.decide(_req(n_in), _view(queues, calls)) is split
    assert calls == ([] if n_in <= 1000 else ["P"])     # a short prompt reads no pool


# --------------------------------------------------------------------------- full runs
@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pool_deciders")
    (d / "pool_decider.py").write_text(PLUGIN)
    write_trace_files(d, [trace_row(0, 0, 32, 3), trace_row(1, 0, 32, 3), trace_row(2, 100, 32, 3)],
                      name="three")
    return d


def _run(folder: Path, tmp_path: Path, name: str, decider: str) -> dict:
    sc = folder / f"{name}.yaml"
    sc.write_text(
        "model: m\nplugins: [pool_decider]\n"
        "latency: {model: blackbox, alpha_coeffs: [0, 0, 0], beta_coeffs: [1000, 0, 0]}\n"
        "engine: {total_kv_blocks: 100, async_scheduling: false, max_num_running_reqs: 1}\n"
        "cluster: {num_instances: 2}\n"
        "disaggregation:\n  prefill_instances: 1\n  decode_instances: 1\n"
        f"  decider: {decider}\n"
        "  transfer: {bandwidth_gbps: 1.0, base_latency_ms: 0, kv_bytes_per_token: 1000}\n"
        "horizon_us: 10000000\nworkload: {kind: trace, header: three.yaml, data: three.csv}\n")
    out = tmp_path / f"{name}.json"
    res = CliRunner().invoke(app, ["run", "--allow-plugins", "--scenario", str(sc),
                                   "--results-path", str(out), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    rows = {r["requestID"]: r for r in json.loads(out.read_text())["requests"]}
    pd = summary["pd"]                              # None: no request was split
    return {"split": 0 if pd is None else pd["disaggregated_count"],
            "ttft_us": {k: round(r["ttft_ms"] * 1000) for k, r in rows.items()}}


def test_a_load_aware_plugin_runs_from_a_scenario_file(folder, tmp_path):
    """r0 and r1 see an empty prefill queue and are split; r2 sees r1 waiting and is served
    whole on the idle decode instance: its prefill step [100, 1100) gives TTFT 1000 µs."""
    got = _run(folder, tmp_path, "plugin", "{policy: long-prompt-idle, params: {min_tokens: 16}}")
    assert got["split"] == 2
    assert got["ttft_us"]["request_2"] == 1000


@pytest.mark.parametrize("params, split", [
    ("{max_local_prefill_tokens: 16, max_prefill_queue: 1}", 2),   # r2 sees 1 queued
    ("{max_local_prefill_tokens: 16, max_prefill_queue: 2}", 3),
    ("{max_local_prefill_tokens: 32, max_prefill_queue: 2}", 0),   # 32 is not > 32
])
def test_the_built_in_load_aware_decider_from_a_scenario(folder, tmp_path, params, split):
    got = _run(folder, tmp_path, "builtin", f"{{policy: load-aware, params: {params}}}")
    assert got["split"] == split
    assert (got["ttft_us"]["request_2"] == 1000) is (split == 2)
