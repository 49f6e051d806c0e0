"""Shared helpers for the catalog tests: BLIS's reference files (the shipped excerpt, and the full
files when they are beside the checkout) and test files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import DataSource, data_sources

DATA = Path(__file__).resolve().parent / "data"

#: (models rows, distinct (model, GPU, TP, vLLM) keys, deployment defaults, model ids) of each
#: defaults.yaml: BLIS's has 111 rows of which 24 repeat an earlier key, 30 defaults, 31 models;
#: the excerpt keeps 10 rows (one repeat) and the 4 defaults of their models (tests/data/README.md)
COUNTS = {"full": (111, 87, 30, 31), "excerpt": (10, 9, 4, 4)}


@pytest.fixture(scope="session", params=data_sources("reference-data"))
def reference(request) -> DataSource:
    """The folder of BLIS's defaults.yaml and hardware_config.json (tests/data/README.md)."""
    return request.param


@pytest.fixture(scope="session")
def blis_defaults(reference) -> dict:
    """BLIS's defaults.yaml (the excerpt or the full file), parsed."""
    return yaml.safe_load(reference.path("defaults.yaml").read_text())
