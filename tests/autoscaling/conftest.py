"""The CLI tests' fixtures (an in-process runner, a small scenario)."""

from tests.cli.conftest import cli, small_scenario  # noqa: F401  (fixtures)
