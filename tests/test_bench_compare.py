"""bench/compare.py at a tiny scale, as a real subprocess (no timing assertions)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "compare.py"

_spec = importlib.util.spec_from_file_location("bench_compare", SCRIPT)
cmp = importlib.util.module_from_spec(_spec)
sys.modules["bench_compare"] = cmp          # dataclasses look their module up there
_spec.loader.exec_module(cmp)


def _run(extra_env: dict[str, str], *args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "BLIS_BIN"} | extra_env
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def _rows(lines: list[str]) -> dict[str, list[str]]:
    header = lines[1].split()
    assert header[:6] == ["workload", "requests", "completed", "wall", "s", "req/s"]
    return {line.split()[0]: line.split() for line in lines[2:]}


def test_ours_only_table_every_request_completed():
    lines = _run({}, "--only", "run-10k,replay", "--scale", "0.002")
    assert lines[0].startswith("BLIS_BIN not set: ours only")
    rows = _rows(lines)
    assert list(rows) == ["run-10k", "replay"]
    for name, want in (("run-10k", 20), ("replay", 200)):
        _, requests, done, wall, rate, cpu, per_cpu, rss = rows[name]
        assert int(requests) == want and int(done) == want
        assert float(wall) > 0 and float(rate) > 0 and float(rss) > 0
        # the printed CPU time has 3 significant digits (<= 0.5 % off), req/CPU s is rounded to 1
        assert 0 < float(cpu) and abs(int(per_cpu) - want / float(cpu)) <= 0.006 * want / float(cpu) + 0.5


def test_ab_against_a_second_binary_reports_identical_metrics(tmp_path):
    # a stand-in "Go binary": our own CLI with BLIS's semantics (the switches compare.py gives
    # ours against a Go binary), so the blocks must be identical
    fake = tmp_path / "blis"
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m blis_simpy "$@" {" ".join(cmp.OURS_PARITY)}\n')
    fake.chmod(0o755)
    lines = _run({"BLIS_BIN": str(fake)}, "--only", "pd-2p2d,replay", "--scale", "0.001",
                 "--repeats", "2")
    assert lines[0] == f"A/B against BLIS_BIN={fake}, 2 pair(s) per workload, medians"
    rows = _rows(lines)
    assert list(rows) == ["replay", "pd-2p2d"]
    for name, want in (("replay", 100), ("pd-2p2d", 20)):
        row = rows[name]
        assert int(row[1]) == want and int(row[2]) == want
        assert float(row[5]) > 0 and float(row[8]) > 0 and float(row[10]) > 0
        assert float(row[9]) > 0 and float(row[11]) > 0 and float(row[12]) > 0
        assert row[13] == "yes"


def test_identical_names_what_differs():
    a = {"completed_requests": 3, "e2e_mean_ms": 1.5, "requests": [{"requestID": "r0"}]}
    b = {"completed_requests": 3, "e2e_mean_ms": 1.25, "requests": []}
    assert cmp.identical("run", a, b) == "no (e2e_mean_ms)"
    assert cmp.identical("run", a, dict(a, requests=[])) == "yes"   # rows are not compared
    assert cmp.identical("run", {"x": 1}, {"x": 1.0}) == "yes"
    rows = [{"request_id": 0, "ttft_us": 5}, {"request_id": 1, "ttft_us": 7}]
    assert cmp.identical("replay", rows, rows[:1]) == "no (1 rows differ)"
    assert cmp.identical("replay", rows, [rows[0], {"request_id": 1, "ttft_us": 8}]) == \
        "no (1 rows differ)"


def test_seconds_keep_three_significant_digits_below_half_a_second():
    """The edge that made the table flaky: a child using under ~0.5 s of CPU was printed with
    two decimals (0.004 s as 0.00; 0.4149 s as 0.41, 1.2 % off the rate beside it)."""
    assert [cmp.seconds(x) for x in (0.004, 0.0041234, 0.09996, 0.1, 0.4149, 0.5, 0.999, 1.0, 12.3456,
                                     1234.5678, 0.0)] == [
        "0.00400", "0.00412", "0.1000", "0.100", "0.415", "0.500", "0.999", "1.00", "12.35",
        "1234.57", "0.00"]
    for k in range(-40, 40):                      # 1.2e-4 s .. 1e4 s, ten points a decade
        x = 1.2345678 * 10 ** (k / 10)
        assert abs(float(cmp.seconds(x)) - x) <= 0.005 * x, x
