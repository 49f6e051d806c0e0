"""Fixtures for the CLI tests: a small scenario, tiny TraceV2 files, an in-process runner."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app

from .support import SMALL_SCENARIO, trace_row, write_trace_files


@pytest.fixture
def small_scenario(tmp_path: Path) -> Path:
    p = tmp_path / "small.yaml"
    p.write_text(SMALL_SCENARIO)
    return p


@pytest.fixture
def trace_files(tmp_path: Path) -> tuple[Path, Path]:
    rows = [trace_row(i, 20_000 * i, 100 + 10 * i, 20 + i) for i in range(12)]
    return write_trace_files(tmp_path, rows)


@pytest.fixture
def cli():
    """Invoke the app in-process; returns the typer/click Result (stdout, stderr separate).

    ``--log`` reconfigures the ``blis_simpy`` logger; its level, propagation and handlers are
    restored afterwards so a later test's ``caplog`` still sees warnings.
    """
    runner = CliRunner()
    log = logging.getLogger("blis_simpy")
    saved = (log.level, log.propagate, log.handlers[:])

    def invoke(*args):
        return runner.invoke(app, [str(a) for a in args], prog_name="blis-simpy")

    yield invoke
    log.setLevel(saved[0])
    log.propagate = saved[1]
    log.handlers[:] = saved[2]
