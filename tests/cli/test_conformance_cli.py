"""Two conformance cases driven through the real command line, compared byte for byte.

They check the whole CLI wiring (flag table → scenario → trace replay → report → ``--format
blis`` and the replay ``--results-path`` array) against what the original BLIS printed.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import conformance_case


@pytest.mark.parametrize("case", ["A01_golden1", "C19_cluster_rr"])
def test_blis_stdout_and_results_match(cli, tmp_path, monkeypatch, case):
    src = conformance_case(case)
    work = tmp_path / case
    work.mkdir()
    for f in src.iterdir():  # contents only: the recorded case stays untouched
        if f.is_file():
            (work / f.name).write_bytes(f.read_bytes())
    meta = json.loads((work / "case.json").read_text())
    assert meta["command"] == "replay" and not meta.get("extra_args")
    monkeypatch.chdir(work)
    # BLIS schedules synchronously (our default is vLLM's async scheduling, docs/engine.md)
    res = cli(*meta["args"], "--async-scheduling=false", "--step-model", "blis", "--format", "blis", "--log", "error")
    assert res.exit_code == 0, res.stderr
    assert res.stdout == (work / "stdout.txt").read_text()
    got = json.loads((work / "results.json").read_text())
    want = sorted(json.loads((src / "expected.json").read_text())["results"], key=lambda r: r["request_id"])
    assert [(r["request_id"], r["ttft_us"], r["e2e_us"]) for r in got] == \
           [(r["request_id"], r["ttft_us"], r["e2e_us"]) for r in want]
