"""Sweep points and their config hashes.

A point is ``{"command": "run" | "replay", "scenario": <scenario dict>}`` plus, for a sweep,
its ``seed``, its axis values and its hashes. The **config hash** identifies what a point
runs: the SHA-256 of the canonical JSON (sorted keys, no spaces) of the command and the
*resolved* scenario — the validated scenario with every key left at its default dropped, so
``rate: 10`` and ``rate: 10.0`` (or a key written at its default value) hash the same. The
seed is part of the scenario, so each seed of a configuration is its own point; the
**config key** is the same hash with the seed left out (the points that differ only by
seed, averaged by :func:`blis_simpy.planner.dataset.summarize`).
"""

from __future__ import annotations

import hashlib
import json

from blis_simpy.config.loader import Source, validate


def canonical_json(obj) -> str:
    """Sorted keys, no spaces, no NaN: the same object always gives the same text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True)


def resolved(scenario) -> dict:
    """The resolved form of a scenario (a :class:`~blis_simpy.config.scenario.Scenario` or a
    raw dict, validated here without the cross-key checks): keys at their default dropped."""
    if isinstance(scenario, dict):
        scenario = validate(scenario, Source(None), semantic=False)
    return scenario.model_dump(mode="json", exclude_defaults=True)


def _sha(obj) -> str:
    return hashlib.sha256(canonical_json(obj).encode("ascii")).hexdigest()


def config_hash(command: str, resolved_scenario: dict) -> str:
    """SHA-256 (hex) of the command and the resolved scenario, seed included."""
    return _sha({"command": command, "scenario": resolved_scenario})


def config_key(command: str, resolved_scenario: dict) -> str:
    """:func:`config_hash` without the seed: the same for every seed of one configuration."""
    return _sha({"command": command,
                 "scenario": {k: v for k, v in resolved_scenario.items() if k != "seed"}})
