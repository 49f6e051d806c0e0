"""Scenario configuration: pydantic models, YAML loading with file:line errors."""
