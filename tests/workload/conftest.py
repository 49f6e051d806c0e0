"""Fixtures of the workload tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from .wl_support import CONFORMANCE


@pytest.fixture
def conformance_dir() -> Path:
    """The shared conformance folder; the test is skipped if it is absent."""
    if not CONFORMANCE.is_dir():
        pytest.skip(f"conformance cases not available at {CONFORMANCE}")
    return CONFORMANCE
