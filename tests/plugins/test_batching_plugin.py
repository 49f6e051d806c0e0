"""A user-written batching policy, selected by ``engine.batching`` from a scenario, changes
batch formation as designed, with no change to the package.

Three requests arrive at 0 (100 prompt tokens, 3 outputs each), no queueing delay, step =
5000 + 10 µs per prefill token + 100 µs per decode token. ``vllm`` admits all three in step
1. ``staggered`` (one admission per step) admits request_0 at 0 (step 1: 6000 µs),
request_1 at 6000 (step 2: request_0 decodes, request_1 prefills: 6100 µs) and request_2
at 12100: scheduling delays 0, 6 and 12.1 ms. With ``max_admissions: 2``, request_0 and
request_1 at 0 (step 1: 7000 µs), request_2 at 7000.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from tests.cli.support import plugin_trace_scenario, trace_row


def _scenario(folder: Path, batching: str, params: str = "{}") -> Path:
    return plugin_trace_scenario(folder, "tests.plugins.staggered",
                                 [trace_row(i, 0, 100, 3) for i in range(3)],
                                 f"  batching: {batching}\n  batching_params: {params}\n")


def _delays_ms(cli, sc: Path, out: Path) -> list[float]:
    res = cli("run", "--scenario", sc, "--results-path", out, "--format", "json")
    assert res.exit_code == 0, res.stderr
    rows = json.loads(out.read_text())["requests"]
    return [r["scheduling_delay_ms"] for r in sorted(rows, key=lambda r: r["requestID"])]


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def test_batching_policy_plugin_from_scenario(cli, tmp_path):
    out = tmp_path / "results.json"
    assert _delays_ms(cli, _scenario(tmp_path, "vllm"), out) == [0.0, 0.0, 0.0]
    assert _delays_ms(cli, _scenario(tmp_path, "staggered"), out) == [0.0, 6.0, 12.1]
    sc = _scenario(tmp_path, "staggered", "{max_admissions: 2}")
    assert _delays_ms(cli, sc, out) == [0.0, 0.0, 7.0]


def test_batching_policy_name_and_params_are_validated(cli, tmp_path):
    res = cli("run", "--scenario", _scenario(tmp_path, "no-such-policy"))
    assert res.exit_code == 2
    assert "engine.batching" in res.stderr and "unknown batching policy 'no-such-policy'" in res.stderr
    res = cli("run", "--scenario", _scenario(tmp_path, "staggered", "{max_admissions: 0}"))
    assert res.exit_code == 2 and "engine.batching_params.max_admissions" in res.stderr
