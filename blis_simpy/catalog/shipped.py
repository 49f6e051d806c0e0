"""The YAML files shipped in ``catalog/data/`` (``gpus.yaml``, ``models.yaml``,
``coefficients.yaml``): ours, read-only, trusted.

They are parsed with libyaml's C safe loader when PyYAML has it: the same values as
``yaml.safe_load`` (tests/catalog/test_shipped.py compares them file by file), about seven
times faster, and the pure-Python parse of these three files was most of a small run's
configuration time (~60 ms of a 300-request replay; docs/performance.md, "Start-up").
Without libyaml the pure-Python safe loader reads them. Files a user gives go through
the capped reader of :mod:`blis_simpy.yaml_input` instead.
"""

from __future__ import annotations

from importlib import resources

import yaml

#: libyaml's safe loader when PyYAML was built with it, else the pure-Python one
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_shipped(name: str) -> object:
    """``catalog/data/<name>`` parsed as YAML (``name``: e.g. ``gpus.yaml``)."""
    text = resources.files("blis_simpy.catalog").joinpath(f"data/{name}").read_text("utf-8")
    return yaml.load(text, Loader=SAFE_LOADER)


__all__ = ["SAFE_LOADER", "read_shipped"]
