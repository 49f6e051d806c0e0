"""Workload-spec v2 loading and validation (docs/workloads.md)."""

from __future__ import annotations

import textwrap

import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.workload.spec import WorkloadSpecV2, load_workload_spec, validate_spec

GOOD = """\
version: "2"
seed: 9
aggregate_rate: 10.0
num_requests: 100
clients:
  - id: a
    rate_fraction: 1.0
    slo_class: standard
    arrival: {process: gamma, cv: 2.0}
    input_distribution:
      type: gaussian
      params: {mean: 100, std_dev: 10, min: 1, max: 200}
    output_distribution:
      type: empirical
      params:
        10: 0.5
        20: 0.5
"""


def _load(tmp_path, text):
    p = tmp_path / "w.yaml"
    p.write_text(textwrap.dedent(text))
    return p, load_workload_spec(p)


def _fail(tmp_path, text) -> tuple[str, ConfigError]:
    p = tmp_path / "w.yaml"
    p.write_text(textwrap.dedent(text))
    with pytest.raises(ConfigError) as ei:
        load_workload_spec(p)
    assert ei.value.file == str(p)
    return str(p), ei.value


def test_good_spec_loads(tmp_path):
    _, s = _load(tmp_path, GOOD)
    assert s.seed == 9 and s.clients[0].arrival.cv == 2.0
    assert s.clients[0].output_distribution.params == {"10": 0.5, "20": 0.5}


def test_conformance_spec_loads(conformance_dir):
    s = load_workload_spec(conformance_dir / "E31_workload_spec_servegen" / "workload_spec.yaml")
    assert [c.id for c in s.clients] == ["high-volume-batch", "realtime-chat"]
    assert s.clients[0].network.rtt_ms == 2.0


def test_unknown_key_line_and_field(tmp_path):
    path, e = _fail(tmp_path, GOOD.replace("    slo_class: standard\n",
                                           "    slo_class: standard\n    colour: blue\n"))
    assert (e.line, e.field, e.problem) == (9, "client[0].colour", "unknown key")
    assert str(e) == f"{path}:9: client[0].colour: unknown key"


@pytest.mark.parametrize("old, new, line, field, problem", [
    ("rate_fraction: 1.0", "rate_fraction: 0", 7, "client[0].rate_fraction",
     "must be a finite number > 0, got 0.0"),
    ("aggregate_rate: 10.0", "aggregate_rate: -1", 3, "aggregate_rate",
     "must be a finite number > 0 (req/s), got -1.0"),
    ("cv: 2.0", "cv: -2.0", 9, "client[0].arrival.cv", "must be a finite number > 0, got -2.0"),
    ("process: gamma, cv: 2.0", "process: weibull, cv: 11", 9, "client[0].arrival.cv",
     "weibull cv must be in [0.01, 10.4], got 11.0"),
    ("process: gamma", "process: bursty", 9, "client[0].arrival.process", None),
    ("std_dev: 10, ", "", 12, "client[0].input_distribution.params",
     'distribution requires parameter "std_dev"'),
    ("slo_class: standard", "slo_class: gold", 8, "client[0].slo_class", None),
    ("version: \"2\"", "version: \"3\"", 1, "version", None),
    ("num_requests: 100", "num_requests: many", 4, "num_requests", None),
])
def test_semantic_errors_located(tmp_path, old, new, line, field, problem):
    assert old in GOOD
    _, e = _fail(tmp_path, GOOD.replace(old, new))
    assert (e.line, e.field) == (line, field)
    if problem is not None:
        assert e.problem == problem


def test_timeout_and_missing_input(tmp_path):
    _, e = _fail(tmp_path, GOOD.replace("    slo_class: standard\n",
                                        "    slo_class: standard\n    timeout: -5\n"))
    assert (e.field, e.line) == ("client[0].timeout", 9)
    text = GOOD.replace("    input_distribution:\n      type: gaussian\n"
                        "      params: {mean: 100, std_dev: 10, min: 1, max: 200}\n", "")
    _, e = _fail(tmp_path, text)
    assert (e.field, e.line, e.problem) == ("client[0].input_distribution", 6, "required key is missing")


def test_yaml_syntax_and_duplicates(tmp_path):
    _, e = _fail(tmp_path, GOOD.replace("seed: 9", "seed: [9"))
    assert e.problem.startswith("invalid YAML")
    _, e = _fail(tmp_path, GOOD.replace("seed: 9", "seed: 9\nseed: 10"))
    assert (e.line, e.field, e.problem) == (3, "seed", "duplicate key")
    _, e = _fail(tmp_path, "- a\n- b\n")
    assert "mapping" in e.problem


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_workload_spec(tmp_path / "nope.yaml")
    assert ei.value.problem == "no such file" and ei.value.line is None


def test_v1_upgrade(tmp_path, caplog):
    _, s = _load(tmp_path, GOOD.replace('version: "2"\n', "").replace("standard", "realtime"))
    assert s.version == "2" and s.clients[0].slo_class == "critical"
    assert "deprecated" in caplog.text
    _, s = _load(tmp_path, GOOD.replace('version: "2"', "version: 1").replace("standard", "interactive"))
    assert s.clients[0].slo_class == "standard"
    _, s = _load(tmp_path, GOOD.replace('version: "2"', "version: 2"))   # int accepted like Go
    assert s.version == "2"


def test_sources_are_exclusive_and_required():
    with pytest.raises(ConfigError) as ei:
        validate_spec(WorkloadSpecV2(version="2", aggregate_rate=1.0))
    assert ei.value.field == "clients"
    base = WorkloadSpecV2.model_validate({
        "version": "2", "aggregate_rate": 1.0, "servegen_data": {"path": "d"},
        "clients": [{"rate_fraction": 1, "arrival": {"process": "poisson"},
                     "input_distribution": {"type": "constant", "params": {"value": 1}},
                     "output_distribution": {"type": "constant", "params": {"value": 1}}}]})
    with pytest.raises(ConfigError, match="mutually exclusive"):
        validate_spec(base)
