"""Scenario YAML loading: values, paths, and located errors (FILE:LINE: field: problem)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blis_simpy.config.loader import Source, dotted, load_scenario, read_yaml, summary, undotted
from blis_simpy.errors import ConfigError

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


def _write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _error(tmp_path: Path, text: str) -> ConfigError:
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_scenario(str(p))
    assert e.value.file == str(p)
    return e.value


def test_quickstart_loads():
    s = load_scenario(str(QUICKSTART))
    assert s.name == "quickstart"
    assert s.latency.model == "blackbox"
    assert s.engine.total_kv_blocks == 29205
    assert (s.workload.kind, s.workload.num_requests) == ("distribution", 300)
    assert "300 requests at 8 req/s" in summary(s)


def test_empty_file_is_all_defaults(tmp_path):
    s = load_scenario(str(_write(tmp_path, "# nothing\n")))
    assert s.seed == 42 and s.workload.kind == "distribution" and s.workload.num_requests == 100


def test_the_latency_backend_defaults_as_on_the_command_line(tmp_path):
    # no latency key: physics, as `blis-simpy run --model M` without a backend flag
    assert load_scenario(str(_write(tmp_path, "# nothing\n"))).latency.model == "physics"
    # both coefficient lists and no backend: blackbox (as --alpha-coeffs with --beta-coeffs)
    both = "latency:\n  alpha_coeffs: [1, 2, 3]\n  beta_coeffs: [4, 5, 6]\n"
    assert load_scenario(str(_write(tmp_path, both))).latency.model == "blackbox"
    # one list alone, without a backend: refused on that list, as --beta-coeffs alone is
    with pytest.raises(ConfigError) as e:
        load_scenario(str(_write(tmp_path, "latency:\n  beta_coeffs: [4, 5, 6]\n")))
    assert e.value.one_line().endswith("s.yaml:2: latency.beta_coeffs: must be given together with "
                                       "latency.alpha_coeffs (both select blackbox), or name "
                                       "latency.model")
    # with a backend named, the lists are that backend's
    assert load_scenario(str(_write(tmp_path, "latency:\n  model: blackbox\n  beta_coeffs: [4, 5, 6]\n"))
                         ).latency.model == "blackbox"
    named = both + "  model: roofline\n"
    assert load_scenario(str(_write(tmp_path, named))).latency.model == "roofline"


def test_yaml_12_floats_and_model_lower_case(tmp_path):
    s = load_scenario(str(_write(tmp_path, "model: Org/Model-X\nworkload:\n  rate: 1e1\n")))
    assert s.workload.rate == 10.0
    assert s.model == "org/model-x"


def test_workload_kind_defaults_to_distribution(tmp_path):
    s = load_scenario(str(_write(tmp_path, "workload:\n  rate: 3.5\n")))
    assert (s.workload.kind, s.workload.rate) == ("distribution", 3.5)


def test_trace_paths_resolve_against_the_scenario_directory(tmp_path):
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    p = _write(sub, f"workload:\n  kind: trace\n  header: ../t.yaml\n  data: {tmp_path}/abs.csv\n")
    s = load_scenario(str(p))
    assert s.workload.header == str(tmp_path / "a" / "t.yaml")
    assert s.workload.data == f"{tmp_path}/abs.csv"


@pytest.mark.parametrize("text, line, field, words", [
    ("seed: 1\nengine:\n  block_size: 16\n  blok_size: 8\n", 4, "engine.blok_size", "unknown key"),
    ("tpx: 2\n", 1, "tpx", "unknown key"),
    ("engine:\n  max_num_running_reqs: lots\n", 2, "engine.max_num_running_reqs", "valid integer"),
    ("engine:\n  max_num_running_reqs: 2.5\n", 2, "engine.max_num_running_reqs", "integer"),
    ("cluster:\n  admission_latency_us: -1\n", 2, "cluster.admission_latency_us", "greater than or equal to 0"),
    ("workload:\n  rate: -3\n", 2, "workload.rate", "greater than 0"),
    ("workload:\n  rate: .nan\n", 2, "workload.rate", "finite"),
    ("latency:\n  alpha_coeffs:\n    - 1\n    - -.inf\n", 4, "latency.alpha_coeffs[1]", "finite"),
    ("workload:\n  kind: trace\n  header: h.yaml\n", 1, "workload.data", "required key is missing"),
    ("workload:\n  kind: poisson\n", 2, "workload.kind", "does not match"),
    ("workload:\n  output_tokens: {mean: 10, stdev: 5, min: 20, max: 30}\n", 2,
     "workload.output_tokens.mean", "[min, max]"),
    ("workload:\n  num_requests: 0\n", 2, "workload.num_requests", "horizon"),
    ("plugins: [1]\n", 1, "plugins[0]", "string"),
    ("a: 1\na: 2\n", 2, "a", "duplicate key"),
    # the API server's costs and where latencies are taken (docs/frontend.md)
    ("frontend:\n  request_us: 10\n  tokenize_us: 3\n", 3, "frontend.tokenize_us", "unknown key"),
    ("frontend:\n  network_us: -5\n", 2, "frontend.network_us", "greater than or equal to 0"),
    ("frontend:\n  output_token_us: .nan\n", 2, "frontend.output_token_us", "finite"),
    ("frontend:\n  step_output_us: '200'\n", 2, "frontend.step_output_us", "valid number"),
    ("frontend: 3\n", 1, "frontend", "input should be a mapping"),
    ("metrics:\n  measured_at: proxy\n", 2, "metrics.measured_at", "'server' or 'client'"),
])
def test_located_errors(tmp_path, text, line, field, words):
    e = _error(tmp_path, text)
    assert (e.line, e.field) == (line, field), str(e)
    assert words in e.problem
    assert str(e) == f"{e.file}:{line}: {field}: {e.problem}"


def test_num_requests_zero_is_fine_with_a_horizon(tmp_path):
    s = load_scenario(str(_write(tmp_path, "horizon_us: 1000000\nworkload:\n  num_requests: 0\n")))
    assert s.horizon == 1_000_000


def test_syntax_error_line(tmp_path):
    e = _error(tmp_path, "seed: 1\nengine:\n  block_size: 16\n bad indent: 2\n")
    assert e.line == 4 and e.problem.startswith("invalid YAML")


def test_not_a_mapping(tmp_path):
    e = _error(tmp_path, "- 1\n- 2\n")
    assert e.line == 1 and "mapping" in e.problem


def test_missing_and_directory(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_scenario(str(tmp_path / "missing.yaml"))
    assert str(e.value) == f"{tmp_path / 'missing.yaml'}: no such file"
    with pytest.raises(ConfigError) as e:
        load_scenario(str(tmp_path))
    assert "directory" in e.value.problem


def test_source_lines_map_every_key_path(tmp_path):
    _, src = read_yaml(str(_write(tmp_path, "a:\n  b:\n    - x\n    - {c: 1}\nd: 2\n")))
    assert src.lines[("a",)] == 1 and src.lines[("a", "b")] == 2
    assert src.lines[("a", "b", 0)] == 3 and src.lines[("a", "b", 1, "c")] == 4
    assert src.line(("a", "b", 1, "missing")) == 4          # nearest written ancestor
    assert Source().line(("a",)) is None


def test_dotted_round_trip():
    loc = ("latency", "alpha_coeffs", 2)
    assert dotted(loc) == "latency.alpha_coeffs[2]"
    assert undotted(dotted(loc)) == loc


@pytest.mark.parametrize("text, field, problem", [
    ("seed: 1\nengine:\n  block_size: 16\n  blok_size: 8\n", "engine.blok_size",
     "unknown key (did you mean block_size?)"),
    ("hardwre: H100\n", "hardwre", "unknown key (did you mean hardware or hardware_config?)"),
    ("workload:\n  kind: distribution\n  arival: poisson\n", "workload.arival",
     "unknown key (did you mean arrival or arrival_cv?)"),
    # through a discriminated union, three levels deep
    ("workload:\n  kind: trace\n  header: h.yaml\n  data: d.csv\n  dat: x\n", "workload.dat",
     "unknown key (did you mean data?)"),
    ("disaggregation:\n  decider:\n    polcy: always\n", "disaggregation.decider.polcy",
     "unknown key (did you mean policy?)"),
    ("zzzz: 1\n", "zzzz", "unknown key"),
])
def test_an_unknown_key_names_the_closest_known_keys(tmp_path, text, field, problem):
    """YAML typos got no did-you-mean where flags did: the one place unknown-key errors are
    worded (errors.validation_problem) now completes them against the schema at that depth."""
    e = _error(tmp_path, text)
    assert (e.field, e.problem) == (field, problem), str(e)
