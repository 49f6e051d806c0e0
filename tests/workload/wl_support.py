"""Helpers shared by the workload tests (paths of the shared conformance cases)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFORMANCE = (REPO / ".." / "shared" / "conformance").resolve()


def conformance_cases() -> list[Path]:
    """Every conformance case folder holding a trace (empty if /work/shared is absent)."""
    if not CONFORMANCE.is_dir():
        return []
    return sorted(p for p in CONFORMANCE.iterdir() if (p / "trace.csv").is_file())
