"""Shared helpers for the catalog tests: the reference data, when present, and test files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import SHARED

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = SHARED / "reference-data"


@pytest.fixture(scope="session")
def blis_defaults() -> dict:
    """BLIS's defaults.yaml, parsed (tests that compare against it skip without it)."""
    p = REFERENCE / "defaults.yaml"
    if not p.exists():
        pytest.skip(f"{p} not available")
    return yaml.safe_load(p.read_text())
