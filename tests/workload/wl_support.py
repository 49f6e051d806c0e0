"""Helpers shared by the workload tests (paths of the recorded conformance cases)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import CONFORMANCE


def conformance_cases() -> list[Path]:
    """Every conformance case folder holding a trace (tests/conformance/cases)."""
    return sorted(p for p in CONFORMANCE.iterdir() if (p / "trace.csv").is_file())
