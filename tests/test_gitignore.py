"""Every file the documented commands write at the repository root is covered by .gitignore
(anchored there), so following the tour (README.md, docs/*.md) leaves `git status` clean.

The outputs are read from the pages themselves: the argument of each output flag and of
each ``> FILE`` redirection in a command, except placeholders (DIR, FILE, PREFIX, ...) and
files the repository holds (inputs such as scenarios/quickstart.yaml)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUTPUT_FLAGS = ("--out", "-o", "--output", "--results-path", "--results", "--timeline", "--plot",
                "--trace-output-decisions", "--report", "--requests-out")
_OUTPUT = re.compile(r"(?:^|\s)(?:(?:" + "|".join(re.escape(f) for f in OUTPUT_FLAGS)
                     + r")\s+(?P<path>[A-Za-z0-9_./-]+)|>\s*(?P<file>[A-Za-z0-9_/-]+\.[a-z]+)\b)")
PLACEHOLDERS = {"DIR", "FILE", "PATH", "PREFIX", "SET", "OUT", "F", "P", "D", "H", "NAME"}
NOT_PATHS = {"pipefail", "parquet"}     # `bash -o pipefail`; `--requests-out parquet` (bench/scale.py)


def documented_outputs() -> set[str]:
    out = set()
    for page in PAGES:
        for line in page.read_text().splitlines():
            for m in _OUTPUT.finditer(line):
                path = (m["path"] or m["file"]).rstrip(".")
                stem = path.split("/")[0].split(".")[0]
                if path in NOT_PATHS or stem in PLACEHOLDERS or path.startswith(("/", "../")):
                    continue
                out.add(path)
    return out


def tracked(paths: list[str]) -> set[str]:
    res = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    return set(res.stdout.split())


def ignored(paths: list[str]) -> set[str]:
    res = subprocess.run(["git", "check-ignore", "--no-index", "--", *paths], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode in (0, 1), res.stderr
    return {p.rstrip("/") for p in res.stdout.split()}


def test_the_pages_name_the_tours_outputs():
    """The reader finds what the issue listed (a reader that finds nothing passes nothing)."""
    found = documented_outputs()
    for path in ("results/plan.json", "plots/", "runs/vllm-rtx4090", "decisions.jsonl", "timeline.csv",
                 "results-run.json", "my-rtx4090.yaml"):
        assert path in found, sorted(found)


def test_every_documented_output_at_the_root_is_ignored():
    outputs = sorted(documented_outputs())
    written = [p for p in outputs if p not in tracked(outputs)]
    missing = [p for p in written if p.rstrip("/") not in ignored(written)]
    assert missing == [], f"documented outputs .gitignore does not cover: {missing}"


def test_sources_are_not_ignored():
    """The patterns are anchored at the root: a scenario or a docs page never matches."""
    paths = ["scenarios/quickstart.yaml", "scenarios/plans/qwen3_14b_h100.yaml", "docs/planning.md",
             "blis_simpy/catalog/data/physics/H100.yaml", "scenarios/traces/example.csv"]
    assert ignored(paths) == set()
