"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

#: Property tests are derandomised by default so every run draws the same examples: a failure
#: reproduces on the next run and on CI. Example counts stay per test (``@settings(max_examples=)``,
#: else Hypothesis's 100); ``deadline=None`` because a per-example time limit flakes on a busy
#: machine; ``database=None`` so an example saved by an earlier run cannot change what runs.
#: ``HYPOTHESIS_PROFILE=dev`` draws fresh random examples (to look for new failures).
settings.register_profile("ci", derandomize=True, max_examples=100, deadline=None, database=None,
                          print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO = Path(__file__).resolve().parents[1]
SHARED = (REPO / ".." / "shared").resolve()
#: the Go BLIS's recorded outputs, kept in the repository (tests/conformance/cases/README.md)
CONFORMANCE = REPO / "tests" / "conformance" / "cases"


def conformance_case(name: str) -> Path:
    """The folder of one recorded conformance case; fails (never skips) if it is missing."""
    p = CONFORMANCE / name
    assert p.is_dir(), f"conformance case {name} is not in {CONFORMANCE}"
    return p


def shared_or_skip(*parts: str) -> Path:
    """A path under ../shared (real vLLM runs, BLIS reference data); skips if it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not available (the ../shared folder is absent)")
    return p
