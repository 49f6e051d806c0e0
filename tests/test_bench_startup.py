"""bench/startup.py at one run per case, as a real subprocess (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "startup.py"


def _table(*args: str) -> dict[str, list[str]]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1", "--requests", "20", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["case", "median", "wall", "ms"]
    return {ln[:24].strip(): ln[24:].split() for ln in lines[1:]}


def test_every_case_ran_and_has_three_figures():
    rows = _table()
    assert list(rows) == ["python -c pass", "blis-simpy --help", "blis-simpy --version", "replay w1",
                          "replay w20"]
    for name, figures in rows.items():
        assert len(figures) == 3 and all(f.isdigit() for f in figures), (name, figures)


def test_a_case_that_fails_is_reported_in_its_row(tmp_path: Path):
    """A --source checkout whose CLI knows only --help: the other cases say how they failed."""
    pkg = tmp_path / "blis_simpy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        "import sys\n"
        "if sys.argv[1:] != ['--help']:\n"
        "    sys.exit('error: no such option')\n")
    rows = _table("--source", str(tmp_path))
    assert rows["blis-simpy --help"][0].isdigit()
    for name in ("blis-simpy --version", "replay w1", "replay w20"):
        assert rows[name] == ["failed", "(status", "1):", "error:", "no", "such", "option"], rows[name]


def test_a_source_without_the_package_is_refused(tmp_path: Path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1", "--source", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 1 and "no blis_simpy package there" in proc.stderr
