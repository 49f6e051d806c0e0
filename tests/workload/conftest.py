"""Fixtures of the workload tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from .wl_support import CONFORMANCE


@pytest.fixture
def conformance_dir() -> Path:
    """The recorded conformance cases (tests/conformance/cases)."""
    assert CONFORMANCE.is_dir(), CONFORMANCE
    return CONFORMANCE
