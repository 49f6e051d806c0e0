"""calibrate compares scheduling delay where the run records it: a tiny converted trace
with ``scheduled_time_us`` and hand-checked figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.calibrate.test_calibrate import HEADER, SCENARIO, _cli, _row
from tests.cli.support import TRACE_COLUMNS


@pytest.fixture
def tiny_sched(tmp_path: Path) -> tuple[Path, Path]:
    """Request 0 arrives at 0 and was scheduled at 400 µs (real delay 0.4 ms); request 7
    arrives at 500 µs and was scheduled at 1500 µs (1.0 ms); request 9 has no scheduling time.
    The columns after the 27 BLIS ones come in an unusual order."""
    (tmp_path / "tiny.header.yaml").write_text(HEADER)
    rows = [_row(0, 0, 16, 3, 2_000, 4_000) + ",400,",
            _row(7, 500, 16, 2, 3_000, 5_000) + ",1500,note",
            _row(9, 20_000_000, 16, 2, 20_003_000, 20_005_000) + ",0,"]
    (tmp_path / "tiny.csv").write_text(
        TRACE_COLUMNS + ",scheduled_time_us,comment\n" + "".join(r + "\n" for r in rows))
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    return tmp_path / "tiny", sc


def test_sched_delay_exact(tiny_sched):
    prefix, sc = tiny_sched
    res = _cli("calibrate", prefix, "--scenario", sc, "--format", "json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["metrics"]["sched"]
    # sim (constant 1000 µs steps, vLLM's async scheduling): request 0 is scheduled at once
    # (0 ms); request 7 arrives at 0.5 ms, during request 0's step [0, 1000); the step at 1000
    # was chosen when that one started, so request 7 is scheduled at 2000 (1.5 ms). Request 9
    # has no real value, so it is left out.
    assert s["n"] == 2
    assert s["real_ms"]["mean"] == pytest.approx(0.7) and s["sim_ms"]["mean"] == pytest.approx(0.75)
    assert s["real_ms"]["p50"] == pytest.approx(0.7) and s["sim_ms"]["p50"] == pytest.approx(0.75)
    assert s["error_pct"]["mean"] == pytest.approx(100 * (0.75 - 0.7) / 0.7)     # +7.14 %
    # MAPE over real delays >= 1 ms only: request 7 (|1.5 - 1.0| / 1.0); request 0's 0.4 ms is out
    assert s["mape_pct"] == pytest.approx(50.0) and s["mape_n"] == 1


def test_sched_delay_row_in_the_table(tiny_sched):
    prefix, sc = tiny_sched
    res = _cli("calibrate", prefix, "--scenario", sc)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    (i,) = [i for i, ln in enumerate(lines) if "sched delay" in ln]
    assert lines[i].split("│")[2:4] == [" real ", " 2 "]
    sim = lines[i + 1]                         # the sim line under it: errors and MAPE
    assert "sim" in sim and "(+7.1%)" in sim and "50.0%" in sim


def test_no_scheduling_time_no_sched_metric(tiny_sched, tmp_path):
    prefix, sc = tiny_sched
    csv = tmp_path / "tiny.csv"
    csv.write_text(csv.read_text().replace(",400,", ",0,").replace(",1500,", ",0,"))
    res = _cli("calibrate", prefix, "--scenario", sc, "--format", "json")
    assert res.exit_code == 0, res.output
    assert set(json.loads(res.stdout)["runs"][0]["metrics"]) == {"ttft", "tpot", "e2e"}
