"""A gateway policy written by a user, chosen by ``cluster.gateway.policy`` in a scenario file,
orders the queue as designed (docs/extending.md); its bad parameters are a located error.

Four requests (100 prompt tokens, 3 outputs) arrive at 0, 10, 20 and 30 µs on one instance that
takes one at a time (step = 5000 + 10 µs per prefill token + 100 µs per decode token): request 0
is sent on at 0; the other three wait. ``newest-first`` sends 3, 2, 1; ``newest: false`` the
arrival order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from tests.cli.support import LOCATED, plugin_trace_scenario, trace_row


def _scenario(folder: Path, params: str) -> Path:
    return plugin_trace_scenario(
        folder, "tests.plugins.newest_gateway", [trace_row(i, 10 * i, 100, 3) for i in range(4)],
        "cluster:\n  gateway:\n    policy: newest-first\n    detector: concurrency\n"
        f"    max_concurrency: 1\n    params: {params}\n", tail="horizon_us: 10000000\n")


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def _completion_order(cli, sc: Path, out: Path) -> list[str]:
    res = cli("run", "--scenario", sc, "--results-path", out, "--format", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["gateway"]["dispatched"] == 4 and doc["request_accounting"]["shed_gateway"] == 0
    rows = json.loads(out.read_text())["requests"]
    done = sorted(rows, key=lambda r: r["arrived_at"] * 1e6 + r["e2e_ms"] * 1e3)
    return [r["requestID"] for r in done]


def test_gateway_policy_plugin_from_scenario(cli, tmp_path):
    out = tmp_path / "results.json"
    newest = _completion_order(cli, _scenario(tmp_path, "{newest: true}"), out)
    oldest = _completion_order(cli, _scenario(tmp_path, "{newest: false}"), out)
    assert [r[-1] for r in newest] == ["0", "3", "2", "1"]
    assert [r[-1] for r in oldest] == ["0", "1", "2", "3"]


def test_gateway_plugin_bad_params_are_located(cli, tmp_path):
    res = cli("run", "--scenario", _scenario(tmp_path, "{newest: 3}"))
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    m = LOCATED.match(lines[0])
    assert m and m["field"] == "cluster.gateway.params.newest" and m["line"] == "14", lines[0]
