"""Every test here runs scenarios that name plugin modules: they opt in as a user would, with
the environment variable (docs/extending.md, "Loading plugins"); subprocesses inherit it.
tests/cli/test_plugin_optin.py checks what happens without it."""

from __future__ import annotations

import pytest

from blis_simpy.cli.plugin_optin import ENV


@pytest.fixture(autouse=True)
def _allow_plugins(monkeypatch):
    monkeypatch.setenv(ENV, "1")
