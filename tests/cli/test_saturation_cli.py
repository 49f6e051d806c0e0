"""Saturation in the CLI's outputs (docs/metrics.md, "Saturation"): a row in the summary
table, a key in ``--format json`` and one warning line on stderr, only when it fires; never
in the ``--results-path`` file."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.metrics.test_saturation import scenario, staged


def _write(tmp_path, rate):
    path = tmp_path / f"s{rate}.yaml"
    path.write_text(yaml.safe_dump(scenario(rate)))
    return path


def test_cli_shows_it_only_when_it_fires(cli, tmp_path):
    over = cli("run", "--scenario", _write(tmp_path, 15), "--format", "json",
               "--results-path", tmp_path / "over.json")
    assert over.exit_code == 0, over.output
    doc = json.loads(over.stdout)
    assert doc["saturation"]["saturated"] is True
    assert doc["saturation"]["achieved_over_offered"] == pytest.approx(2 / 3, abs=0.01)
    warn = [ln for ln in over.stderr.splitlines() if "saturated" in ln]
    assert len(warn) == 1 and warn[0].startswith("WARNING blis_simpy.run: saturated: ")
    assert "saturation" not in json.loads((tmp_path / "over.json").read_text())   # BLIS's keys only
    table = cli("run", "--scenario", _write(tmp_path, 15))
    assert "Saturated" in table.stdout and "yes: 9.99 of 14.99 req/s" in table.stdout

    under = cli("run", "--scenario", _write(tmp_path, 7), "--format", "json")
    assert "saturation" not in json.loads(under.stdout) and "saturated" not in under.stderr
    assert "Saturated" not in cli("run", "--scenario", _write(tmp_path, 7)).stdout




def test_cli_names_the_window_of_a_stage_that_fired(cli, tmp_path):
    """The hand-computed deployment (10 req/s) under 7, 15 and 5 req/s stages: only the
    15 req/s stage's window fires (tests/metrics/test_saturation.py)."""
    path = tmp_path / "staged.yaml"
    path.write_text(yaml.safe_dump(staged((7, 20), (15, 20), (5, 40))))
    res = cli("run", "--scenario", path, "--format", "json")
    assert res.exit_code == 0, res.output
    sat = json.loads(res.stdout)["saturation"]
    assert sat["saturated"] is True and sat["whole_window_saturated"] is False
    assert [(w["window_start_s"], w["window_end_s"]) for w in sat["windows"]] == [(20.0, 40.0)]
    warn = [ln for ln in res.stderr.splitlines() if "saturated" in ln]
    assert len(warn) == 1 and warn[0].startswith(
        "WARNING blis_simpy.run: saturated between 20.0 s and 40.0 s of the arrivals: ")
    table = cli("run", "--scenario", path)
    assert "yes between 20.0 and 40.0 s: 9.96 of 14.94 req/s" in table.stdout
    # the same stages below the capacity: nothing shows
    path.write_text(yaml.safe_dump(staged((7, 20), (9, 20), (5, 40))))
    under = cli("run", "--scenario", path, "--format", "json")
    assert "saturation" not in json.loads(under.stdout) and "saturated" not in under.stderr
