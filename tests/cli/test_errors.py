"""Bad input: exit status 2, exactly one ``error:`` line on stderr, no traceback, no file."""

from __future__ import annotations

import pytest

from .support import LOCATED, SMALL_SCENARIO, trace_row, write_trace_files


def _assert_one_line_error(res, results_path=None) -> str:
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    if results_path is not None:
        assert not results_path.exists()
        assert not list(results_path.parent.glob(f".{results_path.name}*"))  # no temp file left
    return lines[0]


def _located(line: str) -> dict:
    m = LOCATED.match(line)
    assert m, line
    return m.groupdict()


BLACKBOX = "latency:\n  model: blackbox\n  alpha_coeffs: [1, 0, 0]\n  beta_coeffs: [1, 1, 1]\n"

# (scenario text, expected line, expected field, words expected in the problem)
SCENARIO_CASES = {
    "unknown key": ("engine:\n  block_size: 16\n  bogus_limit: 3\n", 3, "engine.bogus_limit", "unknown key"),
    "wrong type": ("seed: 1\ncluster:\n  num_instances: two\n", 3, "cluster.num_instances", "integer"),
    "negative": ("engine:\n  max_num_running_reqs: -4\n", 2, "engine.max_num_running_reqs", "greater than 0"),
    "nan": ("workload:\n  kind: distribution\n  rate: .nan\n", 3, "workload.rate", "finite"),
    "inf": ("latency:\n  model: blackbox\n  beta_coeffs: [1.0, .inf, 2.0]\n", 3, "latency.beta_coeffs[1]", "finite"),
    "unknown policy": (BLACKBOX + "cluster:\n  routing:\n    policy: nope\n", 7, "cluster.routing.policy",
                       "unknown routing policy 'nope'"),
    "stdev quirk": (BLACKBOX + "workload:\n  prompt_tokens: {mean: 50, stdev: 0, min: 2, max: 100}\n", 6,
                    "workload.prompt_tokens.stdev", "0 is below min 2: the stdev must lie in [min, max] = "
                    "[2, 100] like the mean"),
    "duplicate key": ("seed: 1\nseed: 2\n", 2, "seed", "duplicate"),
    # was accepted (2^70), while --seed refuses what is outside Go's int64
    "seed past int64": ("name: x\nseed: 1180591620717411303424\n", 2, "seed", "less than or equal to 9223372036854775807"),
    "one coefficient list": ("latency:\n  beta_coeffs: [1, 2, 3]\n", 2, "latency.beta_coeffs",
                             "must be given together with latency.alpha_coeffs"),
    # was "FILE: model_config_folder: ..." (a key not in the file, so no line)
    "model unknown to the backend": ("seed: 1\nmodel: acme/nope\nhardware: H100\ntp: 1\nlatency:\n  model: roofline\n",
                                     2, "model", "unknown model acme/nope: roofline needs its architecture, not found"),
    # run used to replace params that are not a mapping by {} (and ran with the defaults)
    "routing params not a mapping": (BLACKBOX + "cluster:\n  routing:\n    policy: least-loaded\n"
                                     "    params: 5\n", 8, "cluster.routing.params", "input should be a mapping, got 5"),
    "admission params not a mapping": (BLACKBOX + "cluster:\n  admission:\n    params: 'oops'\n", 7,
                                       "cluster.admission.params", "input should be a mapping, got 'oops'"),
    # keys YAML does not read as strings (blis_simpy/yaml_input.py; tests/config/test_yaml_input.py)
    "boolean key": ("seed: 1\nengine:\n  on: 3\n", 3, "on", "reads as a boolean in YAML; quote it ('on')"),
    "number key": ("seed: 1\nengine:\n  16: 3\n", 3, "engine.16", "keys should be strings, got 16"),
    # quoted numbers: one strict rule for every file (tests/config/test_validate_agrees.py)
    "quoted number in policy params": (BLACKBOX + "cluster:\n  admission:\n    policy: token-bucket\n"
                                       "    params: {capacity: '10', refill_rate: 5}\n", 8,
                                       "cluster.admission.params.capacity", "valid number, got '10'"),
}


@pytest.mark.parametrize("case", sorted(SCENARIO_CASES))
def test_bad_scenario_key(cli, tmp_path, case):
    text, line, field, words = SCENARIO_CASES[case]
    sc = tmp_path / "bad.yaml"
    sc.write_text(text)
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", sc, "--results-path", out, "--format", "blis")
    got = _located(_assert_one_line_error(res, out))
    assert got["file"] == str(sc)
    assert int(got["line"]) == line
    assert got["field"] == field
    assert words in got["problem"]


SPEC_CLIENT = ("version: \"2\"\nseed: 11\naggregate_rate: 20.0\nnum_requests: 30\nclients:\n"
               "  - id: plain\n    rate_fraction: 1.0\n    arrival: {process: poisson}\n"
               "    input_distribution: {type: constant, params: {value: 40}}\n"
               "    output_distribution: {type: constant, params: {value: 6}}\n")
#: a value that is not a mapping where a section is expected, in every YAML file the user
#: writes: (flag naming the file, file text, line, field, problem)
NOT_A_MAPPING_CASES = {
    "scenario section": ("--scenario", BLACKBOX + "cluster: 5\n", 5, "cluster", ", got 5"),
    "scenario nested section": ("--scenario", BLACKBOX + "cluster:\n  routing: [1]\n", 6,
                                "cluster.routing", ""),
    "policy bundle": ("--policy-config", "routing: 5\n", 1, "routing", ", got 5"),
    "workload spec": ("--workload-spec", SPEC_CLIENT.replace("{process: poisson}", "'x'"), 8,
                      "client[0].arrival", ", got 'x'"),
}


@pytest.mark.parametrize("case", sorted(NOT_A_MAPPING_CASES))
def test_not_a_mapping_names_no_class_of_ours(cli, small_scenario, tmp_path, case):
    """pydantic's own text ("a valid dictionary or instance of BundleRouting") is not shown:
    every model's error says ``input should be a mapping`` (errors.validation_problem)."""
    flag, text, line, field, got = NOT_A_MAPPING_CASES[case]
    f = tmp_path / "file.yaml"
    f.write_text(text)
    args = ["--scenario", f] if flag == "--scenario" else ["--scenario", small_scenario, flag, f]
    res = cli("run", *args, "--format", "json")
    line_text = _assert_one_line_error(res, tmp_path / "none.json")
    assert line_text == f"error: {f}:{line}: {field}: input should be a mapping{got}"


def test_yaml_syntax_error_names_the_line(cli, tmp_path):
    sc = tmp_path / "broken.yaml"
    sc.write_text("seed: 1\nengine:\n  block_size: [16\n")
    line = _assert_one_line_error(cli("validate", sc))
    assert line.startswith(f"error: {sc}:") and "invalid YAML" in line


def test_missing_scenario_file(cli, tmp_path):
    line = _assert_one_line_error(cli("run", "--scenario", tmp_path / "nope.yaml"))
    assert line == f"error: {tmp_path / 'nope.yaml'}: no such file"


def test_flag_overrides_do_not_hide_errors_elsewhere(cli, small_scenario, tmp_path):
    # a flag fixes one key; a bad key elsewhere in the file is still reported with its line
    small_scenario.write_text(SMALL_SCENARIO.replace("max_num_running_reqs: 16", "max_num_running_reqs: 0"))
    res = cli("run", "--scenario", small_scenario, "--max-num-running-reqs", "8", "--format", "json")
    assert res.exit_code == 0, res.stderr
    small_scenario.write_text(SMALL_SCENARIO.replace("total_kv_blocks: 2000", "total_kv_blocks: -1"))
    got = _located(_assert_one_line_error(
        cli("run", "--scenario", small_scenario, "--max-num-running-reqs", "8")))
    assert (got["line"], got["field"]) == ("8", "engine.total_kv_blocks")


FLAG_CASES = {
    "zero": (["--max-num-running-reqs", "0"], "--max-num-running-reqs", "must be > 0, got 0"),
    "not an int": (["--num-instances=many"], "--num-instances", "invalid integer 'many'"),
    "nan rate": (["--rate", "nan"], "--rate", "must be > 0"),
    "inf rate": (["--rate", "inf"], "--rate", "must be > 0"),
    "negative coefficient": (["--alpha-coeffs", "1,-2,3", "--beta-coeffs", "1,2,3"], "--alpha-coeffs", ">= 0"),
    "roofline with coefficients": (["--latency-model", "roofline", "--alpha-coeffs", "1,2,3",
                                    "--beta-coeffs", "1,2,3"], "--latency-model", "roofline"),
    "unknown routing": (["--routing-policy", "nope"], "--routing-policy",
                        "unknown routing policy 'nope'; valid: "),
    # BLIS's rule: the stdev, like the mean, within [min, max]; the message says which side
    "stdev quirk": (["--output-tokens-stdev", "0"], "--output-tokens-stdev",
                    "0 is below min 2: the stdev must lie in [min, max] = [2, 120] like the mean (BLIS's "
                    "rule, kept for parity; docs/workloads.md)"),
    "stdev above max": (["--prompt-tokens-stdev", "9000", "--prompt-tokens-max", "8000"],
                        "--prompt-tokens-stdev", "9000 is above max 8000: the stdev must lie in"),
    "mean below min": (["--prompt-tokens", "1", "--prompt-tokens-min", "2"], "--prompt-tokens",
                       "1 is below min 2: the mean must lie in [min, max] = [2, "),
    "min above max": (["--prompt-tokens-min", "900", "--prompt-tokens-max", "800"],
                      "--prompt-tokens-min", "<= max"),
    "unknown preset": (["--workload", "nope"], "--workload", "chatbot"),
    "negative horizon": (["--horizon", "-5"], "--horizon", "must be > 0"),
    # was silently taken as "error"
    "unknown log level": (["--log", "verbose"], "--log", "unknown log level 'verbose'; valid: trace"),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_bad_flag(cli, small_scenario, tmp_path, case):
    args, flag, words = FLAG_CASES[case]
    out = tmp_path / "results.json"
    res = cli("run", "--scenario", small_scenario, "--results-path", out, *args)
    line = _assert_one_line_error(res, out)
    assert line.startswith(f"error: {flag}: "), line
    assert words in line


@pytest.mark.parametrize("flag, other", [("--alpha-coeffs", "--beta-coeffs"), ("--beta-coeffs", "--alpha-coeffs")])
def test_coefficient_flag_alone(cli, flag, other):
    line = _assert_one_line_error(cli("run", "--model", "m", flag, "1,2,3"))
    assert line == f"error: {flag}: must be given together with {other}"


def test_model_is_required_without_a_scenario(cli):
    line = _assert_one_line_error(cli("run", "--num-requests", "3"))
    assert line.startswith("error: --model: ")


def test_default_backend_error_names_the_flag(cli):
    # the default backend (physics) needs a GPU; a model without catalog defaults has none
    line = _assert_one_line_error(cli("run", "--model", "meta-llama/llama-3.1-8b", "--num-requests", "3"))
    assert line.startswith("error: --hardware: ") and "physics" in line and "H100" in line
    # an unknown model is named first (it was "--hardware: ..." then "--tp: ... > 0")
    line = _assert_one_line_error(cli("run", "--model", "qwen/qwen3-15b", "--num-requests", "3"))
    assert line.startswith("error: --model: unknown model qwen/qwen3-15b (did you mean qwen/qwen3-14b")


def test_unknown_flag_is_a_usage_error(cli, small_scenario):
    res = cli("run", "--scenario", small_scenario, "--no-such-flag", "1")
    assert _assert_one_line_error(res).startswith("error: --no-such-flag: no such option")
    # run-only workload flags do not exist on replay
    assert cli("replay", "--rate", "3").exit_code == 2


# ---------------------------------------------------------------------------- traces
def _trace_scenario(tmp_path, header, data) -> object:
    sc = tmp_path / "replay.yaml"
    sc.write_text(SMALL_SCENARIO.split("workload:")[0]
                  + f"workload:\n  kind: trace\n  header: {header}\n  data: {data}\n")
    return sc


def test_missing_trace_file_from_scenario(cli, tmp_path, trace_files):
    header, _ = trace_files
    sc = _trace_scenario(tmp_path, header.name, "missing.csv")
    out = tmp_path / "r.json"
    got = _located(_assert_one_line_error(cli("replay", "--scenario", sc, "--results-path", out), out))
    assert got["file"] == str(sc)
    assert got["line"] == str(SMALL_SCENARIO.split("workload:")[0].count("\n") + 4)
    assert got["field"] == "workload.data"
    assert got["problem"] == f"no such file: {tmp_path / 'missing.csv'}"


def test_missing_trace_file_from_flag(cli, small_scenario, tmp_path, trace_files):
    header, _ = trace_files
    missing = tmp_path / "nope.csv"
    line = _assert_one_line_error(cli("replay", "--scenario", small_scenario, "--trace-header", header,
                                      "--trace-data", missing))
    assert line == f"error: {missing}: --trace-data: no such file"


def test_trace_data_is_a_directory(cli, small_scenario, tmp_path, trace_files):
    header, _ = trace_files
    folder = tmp_path / "traces"
    folder.mkdir()
    line = _assert_one_line_error(cli("replay", "--scenario", small_scenario, "--trace-header", header,
                                      "--trace-data", folder))
    assert line == f"error: {folder}: --trace-data: is a directory, expected a file"


def test_trace_flags_come_in_pairs(cli, small_scenario, trace_files):
    line = _assert_one_line_error(cli("replay", "--scenario", small_scenario, "--trace-header", trace_files[0]))
    assert line.startswith("error: --trace-header: ") and "--trace-data" in line


@pytest.mark.parametrize("bad_row, column", [
    ("5,c,,,,0,,0,false,100", None),                                    # wrong column count
    (trace_row(5, 1000, 100, 10).replace(",100,10,", ",1x0,10,", 1), "input_tokens"),  # not an int
    (trace_row(5, 1000, 2**62, 10), "input_tokens"),                     # above the token cap
    (trace_row(5, 1000, 100, 10) + ",extra", "column-28"),               # a cell the header lacks
    (trace_row(5, 1000, 100, 10).replace(",c,", ',c"d,', 1), "client_id"),  # a bare quote
])
def test_malformed_trace_row(cli, small_scenario, tmp_path, bad_row, column):
    rows = [trace_row(i, 1000 * i, 50, 5) for i in range(3)] + [bad_row]
    header, data = write_trace_files(tmp_path, rows)
    out = tmp_path / "r.json"
    line = _assert_one_line_error(cli("replay", "--scenario", small_scenario, "--trace-header", header,
                                      "--trace-data", data, "--results-path", out), out)
    assert line.startswith(f"error: {data}:5: "), line  # header row is line 1, bad row line 5
    if column is not None:
        assert _located(line)["field"] == column


def test_replay_of_a_distribution_scenario_is_refused(cli, small_scenario):
    line = _assert_one_line_error(cli("replay", "--scenario", small_scenario))
    assert "needs a trace" in line


# ---------------------------------------------------------------------------- failures
@pytest.mark.parametrize("exc, code, text", [
    ("invariant", 1, "error: simulation error: [instance_0] conservation broken"),
    ("bug", 1, "error: internal error: ZeroDivisionError: boom"),
])
def test_simulation_failures_exit_1_without_results(cli, small_scenario, tmp_path, monkeypatch, exc, code, text):
    from blis_simpy.errors import InvariantError
    from blis_simpy.run.simulation import Simulation

    def broken_run(self, progress=None):
        if exc == "invariant":
            raise InvariantError("conservation broken", instance="instance_0")
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(Simulation, "run", broken_run)
    out = tmp_path / "r.json"
    res = cli("run", "--scenario", small_scenario, "--results-path", out)
    assert res.exit_code == code
    assert res.stderr == text + "\n" and res.stdout == ""
    assert not out.exists()


def test_unwritable_results_path(cli, small_scenario, tmp_path):
    out = tmp_path / "no-such-dir" / "r.json"
    res = cli("run", "--scenario", small_scenario, "--results-path", out, "--format", "json")
    line = _assert_one_line_error(res)
    assert line.startswith(f"error: {out}: --results-path: cannot write results")


# ---------------------------------------------------------------------------- absurd sizes
# Every count, size and delay has a documented upper bound (docs/scenarios.md, "Limits"):
# past it a scenario key is refused on its line and a flag by its name (exit 2, one line),
# never a hang, a MemoryError or an int64 overflow in the run.
BIG = 2**70
INT64_MAX = 2**63 - 1
# (scenario key, absurd YAML value, its flag, absurd flag text, words in the problem)
BOUND_CASES = [
    ("engine.block_size", BIG, "--block-size-in-tokens", "1000000", "less than or equal to 1024"),
    ("workload.num_requests", BIG, "--num-requests", str(2**62), "less than or equal to 10000000"),
    ("engine.total_kv_blocks", BIG, "--total-kv-blocks", str(2**62), "less than or equal to 100000000"),
    ("cluster.num_instances", BIG, "--num-instances", str(2**62), "less than or equal to 4096"),
    ("workload.prefix_tokens", BIG, "--prefix-tokens", str(2**62), "less than or equal to 16777216"),
    ("engine.max_num_running_reqs", BIG, "--max-num-running-reqs", str(INT64_MAX), "1048576"),
    ("engine.max_num_scheduled_tokens", BIG, "--max-num-scheduled-tokens", str(INT64_MAX), "16777216"),
    ("engine.long_prefill_token_threshold", BIG, "--long-prefill-token-threshold", str(INT64_MAX), "16777216"),
    ("engine.max_model_len", BIG, "--max-model-len", str(INT64_MAX), "16777216"),
    ("engine.kv_cpu_blocks", BIG, "--kv-cpu-blocks", str(INT64_MAX), "100000000"),
    ("engine.kv_transfer_bandwidth", 1e-300, "--kv-transfer-bandwidth", "1e-300", "greater than or equal to 0.000001"),
    ("engine.kv_transfer_base_latency_us", INT64_MAX, "--kv-transfer-base-latency", str(INT64_MAX), "3600000000"),
    ("cluster.admission_latency_us", BIG, "--admission-latency", str(INT64_MAX), "3600000000"),
    ("cluster.routing_latency_us", BIG, "--routing-latency", str(INT64_MAX), "3600000000"),
    ("cluster.snapshot_refresh_interval_us", BIG, "--snapshot-refresh-interval", str(INT64_MAX), "3600000000"),
    ("trace.counterfactual_k", BIG, "--counterfactual-k", str(INT64_MAX), "less than or equal to 4096"),
    ("tp", 1024, "--tp", "1024", "less than or equal to 256"),
    ("workload.arrival_cv", 1e-300, "--arrival-cv", "1e-300", "greater than or equal to 0.001"),
    ("disaggregation.transfer.bandwidth_gbps", 1e308, "--pd-transfer-bandwidth", "1e308", "less than or equal to 1000000"),
    ("disaggregation.transfer.bandwidth_gbps", 1e-308, "--pd-transfer-bandwidth", "1e-308", "greater than or equal to 0.001"),
    ("disaggregation.transfer.base_latency_ms", 1e308, "--pd-transfer-base-latency", "1e308", "less than or equal to 3600000"),
    ("disaggregation.transfer.kv_bytes_per_token", BIG, "--pd-kv-bytes-per-token", str(INT64_MAX), "1073741824"),
    ("disaggregation.prefill_instances", BIG, "--prefill-instances", str(INT64_MAX), "less than or equal to 4096"),
    ("disaggregation.decode_pool.tp", 1024, "--decode-tp", "1024", "less than or equal to 256"),
    ("disaggregation.prefill_pool.max_model_len", BIG, "--prefill-max-model-len", str(INT64_MAX), "16777216"),
]


def _with_key(text: str, key: str, value) -> str:
    import yaml
    data = yaml.safe_load(text)
    cur = data
    *parents, last = key.split(".")
    for p in parents:
        cur = cur.setdefault(p, {})
    cur[last] = value
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize("key, value, flag, text, words", BOUND_CASES, ids=lambda v: str(v)[:40])
def test_absurd_size_in_a_scenario_key(cli, tmp_path, key, value, flag, text, words):
    sc = tmp_path / "big.yaml"
    sc.write_text(_with_key(SMALL_SCENARIO, key, value))
    out = tmp_path / "r.json"
    got = _located(_assert_one_line_error(cli("run", "--scenario", sc, "--results-path", out), out))
    assert got["file"] == str(sc) and got["field"] == key
    assert sc.read_text().splitlines()[int(got["line"]) - 1].strip().startswith(key.split(".")[-1] + ":")
    assert words in got["problem"]


@pytest.mark.parametrize("key, value, flag, text, words", BOUND_CASES, ids=lambda v: str(v)[:40])
def test_absurd_size_in_a_flag(cli, small_scenario, tmp_path, key, value, flag, text, words):
    out = tmp_path / "r.json"
    line = _assert_one_line_error(cli("run", "--scenario", small_scenario, "--results-path", out,
                                      flag, text), out)
    assert line.startswith(f"error: {flag}: ") and words in line


def test_engine_ranks_are_bounded_in_all(cli, small_scenario):
    line = _assert_one_line_error(cli("run", "--scenario", small_scenario, "--num-instances", "4000",
                                      "--dp", "2"))
    assert line == ("error: --num-instances: 4000 instances x dp 2 = 8000 engine ranks; at most "
                    "4096 can be simulated")


# ---------------------------------------------------------------------------- the step cap
# A step or per-token overhead longer than one hour of simulated time (engine.limits.MAX_STEP_US)
# is refused before the run, on the coefficients (docs/scenarios.md, "Limits").
STEP_CAP_CASES = {
    # beta0 alone pushed simulated time past int64 (the fast engine overflowed, exit 1)
    "beta0 1e17": ("1e17,0,0", "0,0,0", "--beta-coeffs", "longest step these coefficients can time is 1e+17 us"),
    # 2048 tokens x 2e6 us: the budget, not the running cap, bounds prefill tokens
    "beta1 x budget": ("1,2e6,0", "0,0,0", "--beta-coeffs", "4.096e+09 us"),
    "alpha2": ("1,0,0", "0,0,1e19", "--alpha-coeffs", "per-output-token overhead is 9223372036854775807 us"),
}


@pytest.mark.parametrize("implementation", ["fast", "reference"])
@pytest.mark.parametrize("case", sorted(STEP_CAP_CASES))
def test_coefficients_past_the_step_cap(cli, tmp_path, case, implementation):
    beta, alpha, flag, words = STEP_CAP_CASES[case]
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO.replace("  max_num_running_reqs: 16\n",
                                         f"  max_num_running_reqs: 16\n  implementation: {implementation}\n"))
    out = tmp_path / "r.json"
    line = _assert_one_line_error(cli("run", "--scenario", sc, "--results-path", out,
                                      "--beta-coeffs", beta, "--alpha-coeffs", alpha), out)
    assert line.startswith(f"error: {flag}: ") and words in line and "3600000000 us (one hour)" in line


def test_decode_coefficients_below_the_cap_are_accepted(cli, small_scenario):
    # 2e7 us per decode token x at most 16 running requests = 3.2e8 us < one hour: a valid
    # (slow) deployment; prefill tokens cost nothing here
    res = cli("run", "--scenario", small_scenario, "--beta-coeffs", "1,0,2e7", "--alpha-coeffs", "0,0,0",
              "--num-requests", "1", "--format", "json")
    assert res.exit_code == 0, res.stderr


def test_step_cap_in_a_scenario_names_the_line(cli, tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO.replace("beta_coeffs: [6472.007648778123,", "beta_coeffs: [1.0e+17,"))
    got = _located(_assert_one_line_error(cli("run", "--scenario", sc)))
    assert (got["line"], got["field"]) == ("6", "latency.beta_coeffs")


# ---------------------------------------------------------------------------- impossible deployments
# A model that does not fit its GPUs, or a TP that cannot split its attention heads, is refused
# (exit 2, one line saying by how much) under both KV capacity models; BLIS's formula once
# warned and ran with 1,000,000 KV blocks (docs/kv-capacity.md).
DEPLOYMENT_CASES = [
    (["--model", "deepseek-ai/deepseek-v3", "--tp", "8", "--kv-capacity-model", "blis"], "--hardware",
     "KV capacity: deepseek-ai/deepseek-v3 on 8 x H100: the model does not fit: short by 93.31 GiB"),
    (["--model", "deepseek-ai/deepseek-v3", "--tp", "8", "--kv-capacity-model", "vllm"], "--hardware",
     "KV capacity: deepseek-ai/deepseek-v3 does not fit on H100 at TP 8: short by 8.54 GiB per GPU"),
    (["--model", "qwen/qwen3-14b", "--tp", "128", "--kv-capacity-model", "blis"], "--tp",
     "qwen/qwen3-14b has 40 attention heads: TP 128 does not divide them"),
    (["--model", "qwen/qwen3-14b", "--tp", "16", "--total-kv-blocks", "1000"], "--tp",
     "qwen/qwen3-14b has 40 attention heads: TP 16 does not divide them"),
]


@pytest.mark.parametrize("backend", ["roofline", "physics"])
@pytest.mark.parametrize("args, flag, words", DEPLOYMENT_CASES, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None)
def test_an_impossible_deployment_is_refused(cli, tmp_path, backend, args, flag, words):
    out = tmp_path / "r.json"
    line = _assert_one_line_error(cli("run", "--latency-model", backend, "--hardware", "H100",
                                      "--num-requests", "1", "--results-path", out, *args), out)
    assert line.startswith(f"error: {flag}: {words}"), line
