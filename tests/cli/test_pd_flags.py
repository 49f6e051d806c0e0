"""The PD flags (docs/cli.md, docs/disaggregation.md): each onto its ``disaggregation:`` key, BLIS's
validation, precedence over a scenario file, warnings and one-line errors."""

from __future__ import annotations

import logging

import pytest

from blis_simpy.cli import flags as F
from blis_simpy.cli.runner import prepare
from blis_simpy.errors import ConfigError

QWEN = "qwen/qwen3-14b"
BASE = {"--model": QWEN, "--hardware": "H100", "--tp": "1"}
POOLS = {"--num-instances": "4", "--prefill-instances": "2", "--decode-instances": "2"}
CLI_BASE = ("--model", QWEN, "--hardware", "H100", "--tp", "1", "--num-requests", "4", "--rate", "50",
            "--prompt-tokens", "64", "--prompt-tokens-stdev", "8", "--prompt-tokens-min", "8",
            "--prompt-tokens-max", "128", "--output-tokens", "8", "--output-tokens-stdev", "2",
            "--output-tokens-min", "2", "--output-tokens-max", "16")

PD_FLAGS = [f for f in F.FLAGS if f.panel == F.PD]
# flag -> (text, scenario path, expected value); the path-less ones are set by the PD rule
CASES = {
    "--prefill-instances": ("1", "disaggregation.prefill_instances", 1),
    "--decode-instances": ("1", "disaggregation.decode_instances", 1),
    "--pd-decider": ("prefix-threshold", "disaggregation.decider.policy", "prefix-threshold"),
    "--pd-prefix-threshold": ("100", "disaggregation.decider.params", {"threshold": 100}),
    "--pd-direct-decode-threshold": ("10", "disaggregation.decider.params", {"threshold": 10}),
    "--pd-transfer-bandwidth": ("5", "disaggregation.transfer.bandwidth_gbps", 5.0),
    "--pd-transfer-base-latency": ("0.1", "disaggregation.transfer.base_latency_ms", 0.1),
    "--pd-kv-bytes-per-token": ("163840", "disaggregation.transfer.kv_bytes_per_token", 163840),
    "--pd-transfer-contention": (True, "disaggregation.transfer.contention", "fair-share"),
    "--pd-contention-mode": ("snapshot", "disaggregation.transfer.contention", "snapshot"),
    "--prefill-routing-scorers": ("queue-depth:2", "disaggregation.prefill_pool.routing",
                                  {"policy": "weighted", "params": {"scorers": [{"name": "queue-depth", "weight": 2.0}]}}),
    "--decode-routing-scorers": ("kv-utilization:1", "disaggregation.decode_pool.routing",
                                 {"policy": "weighted", "params": {"scorers": [{"name": "kv-utilization", "weight": 1.0}]}}),
    "--prefill-tp": ("2", "disaggregation.prefill_pool.tp", 2),
    "--decode-tp": ("2", "disaggregation.decode_pool.tp", 2),
    "--prefill-hardware": ("A100-80", "disaggregation.prefill_pool.hardware", "A100-80"),
    "--decode-hardware": ("A100-80", "disaggregation.decode_pool.hardware", "A100-80"),
    "--prefill-latency-model": ("blackbox", "disaggregation.prefill_pool.latency_model", "blackbox"),
    "--decode-latency-model": ("blackbox", "disaggregation.decode_pool.latency_model", "blackbox"),
    "--prefill-max-model-len": ("4096", "disaggregation.prefill_pool.max_model_len", 4096),
    "--decode-max-model-len": ("4096", "disaggregation.decode_pool.max_model_len", 4096),
    "--pd-interference-prefill": ("0.5", "disaggregation.interference.prefill", 0.5),
    "--pd-interference-decode": ("100", "disaggregation.interference.decode", 100.0),
    "--pd-compat": ("checkout", "disaggregation.compat", "checkout"),
}
# the decider a threshold flag needs
NEEDS = {"--pd-prefix-threshold": {"--pd-decider": "prefix-threshold"},
         "--pd-direct-decode-threshold": {"--pd-decider": "direct-to-decode"}}


def _get(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj.model_dump() if hasattr(obj, "model_dump") else obj


@pytest.fixture
def logs():
    records: list[logging.LogRecord] = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record)

    h, logger = H(logging.DEBUG), logging.getLogger("blis_simpy")
    old = logger.level
    logger.addHandler(h)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(h)
    logger.setLevel(old)


def test_the_pd_flag_surface_is_blis_and_ours_and_replay_takes_it_too():
    names = {f.name for f in PD_FLAGS}
    assert names == set(CASES)
    replay = {f.name for f in F.flags_for(F.REPLAY)}
    assert names <= replay and names <= {f.name for f in F.flags_for(F.RUN)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_pd_flag_sets_its_key(name):
    text, path, value = CASES[name]
    given = {**BASE, **POOLS, **NEEDS.get(name, {}), name: text}
    if name in ("--prefill-instances", "--decode-instances"):
        given["--prefill-instances"] = given["--decode-instances"] = "1"
    plan = prepare("run", given)
    assert _get(plan.scenario, path) == value
    origin = path if path in plan.origin else path + ".threshold"
    assert plan.origin[origin] == name


def test_flags_beat_the_scenario_and_ungiven_flags_leave_it(tmp_path):
    sc = tmp_path / "pd.yaml"
    sc.write_text(f"""\
model: {QWEN}
hardware: H100
tp: 1
latency: {{model: roofline}}
cluster: {{num_instances: 3}}
disaggregation:
  prefill_instances: 1
  decode_instances: 1
  decider: {{policy: prefix-threshold, params: {{threshold: 100}}}}
  transfer: {{bandwidth_gbps: 10.0, kv_bytes_per_token: 4096}}
  decode_pool: {{tp: 2}}
  compat: checkout
""")
    s = prepare("run", {}, str(sc)).scenario.disaggregation
    assert (s.transfer.bandwidth_gbps, s.decider.params, s.decode_pool.tp) == (10.0, {"threshold": 100}, 2)
    s = prepare("run", {"--pd-transfer-bandwidth": "3", "--pd-prefix-threshold": "42",
                        "--decode-tp": "4"}, str(sc)).scenario.disaggregation
    assert (s.transfer.bandwidth_gbps, s.decider.params, s.decode_pool.tp) == (3.0, {"threshold": 42}, 4)
    assert (s.transfer.kv_bytes_per_token, s.compat, s.prefill_instances) == (4096, "checkout", 1)
    s = prepare("run", {"--pd-decider": "always"}, str(sc)).scenario.disaggregation
    assert (s.decider.policy, s.decider.params) == ("always", {})    # another decider: params dropped
    s = prepare("run", {"--pd-transfer-contention": True}, str(sc)).scenario.disaggregation
    assert s.transfer.contention == "snapshot"                        # the scenario's compat: checkout


def test_transfer_contention_bool_maps_by_compat_and_must_agree_with_the_mode():
    run = lambda **kw: prepare("run", {**BASE, **POOLS, **kw}).scenario.disaggregation.transfer  # noqa: E731
    assert run(**{"--pd-transfer-contention": True}).contention == "fair-share"
    assert run(**{"--pd-transfer-contention": True, "--pd-compat": "checkout"}).contention == "snapshot"
    assert run(**{"--pd-transfer-contention": False}).contention == "none"
    assert run().contention is None                                  # resolved later (fair-share / none)
    assert run(**{"--pd-transfer-contention": True, "--pd-contention-mode": "fair-share"}).contention == "fair-share"
    with pytest.raises(ConfigError) as e:
        run(**{"--pd-transfer-contention": True, "--pd-contention-mode": "none"})
    assert e.value.field == "--pd-transfer-contention"


def test_thresholds_with_another_decider_are_ignored_with_a_warning(logs):
    plan = prepare("run", {**BASE, **POOLS, "--pd-decider": "always", "--pd-prefix-threshold": "10",
                           "--pd-direct-decode-threshold": "5"})
    assert plan.scenario.disaggregation.decider.params == {}
    msgs = [r.getMessage() for r in logs if r.levelno == logging.WARNING]
    assert "--pd-prefix-threshold is ignored: the decider is always, not prefix-threshold" in msgs
    assert "--pd-direct-decode-threshold is ignored: the decider is always, not direct-to-decode" in msgs


def test_empty_pool_scorers_mean_not_given():
    plan = prepare("run", {**BASE, **POOLS, "--prefill-routing-scorers": ""})
    assert plan.scenario.disaggregation.prefill_pool.routing is None


# ---------------------------------------------------------------------------- one-line errors
@pytest.mark.parametrize("args, line", [
    (("--num-instances", "4", "--prefill-instances", "3", "--decode-instances", "2"),
     "error: --prefill-instances: Invalid PD pool topology: prefill-instances (3) + decode-instances (2) "
     "= 5 exceeds num-instances (4)"),
    (("--num-instances", "4", "--decode-instances", "2"),
     "error: --decode-instances: Invalid PD pool topology: prefill-instances (0) and decode-instances (2) "
     "must both be > 0 (or both 0 to disable disaggregation)"),
    (("--prefill-instances", "-1"), "error: --prefill-instances: must be >= 0, got -1"),
    (("--pd-decider", "always"),
     "error: --pd-decider: decider 'always' needs PD pools: set --prefill-instances and "
     "--decode-instances (both > 0), or use --pd-decider never"),
    (("--pd-transfer-contention",),
     "error: --pd-transfer-contention: transfer contention (fair-share) needs PD pools: set "
     "--prefill-instances and --decode-instances (both > 0)"),
    (("--pd-interference-prefill", "101"), "error: --pd-interference-prefill: must be finite in [0, 100], got 101.0"),
    (("--pd-interference-decode", "nan"), "error: --pd-interference-decode: must be finite in [0, 100], got nan"),
    (("--prefill-tp", "0"), "error: --prefill-tp: must be > 0, got 0"),
    (("--decode-max-model-len", "0"), "error: --decode-max-model-len: must be > 0, got 0"),
    (("--pd-transfer-bandwidth", "0"), "error: --pd-transfer-bandwidth: must be > 0, got 0.0"),
    (("--pd-transfer-base-latency", "-1"), "error: --pd-transfer-base-latency: must be >= 0, got -1.0"),
    (("--pd-kv-bytes-per-token", "0"), "error: --pd-kv-bytes-per-token: must be > 0, got 0"),
    (("--pd-compat", "go"), "error: --pd-compat: must be one of fixed, checkout, got 'go'"),
    (("--pd-contention-mode", "fifo"),
     "error: --pd-contention-mode: must be one of none, snapshot, fair-share, got 'fifo'"),
    (("--num-instances", "2", "--prefill-instances", "1", "--decode-instances", "1", "--decode-hardware", "H9000"),
     None),
])
def test_bad_pd_input_is_one_error_line(cli, args, line):
    res = cli("run", *CLI_BASE, *args)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and res.stdout == ""
    if line is None:
        assert lines[0].startswith("error: --decode-hardware: unknown GPU 'H9000'")
    else:
        assert lines[0] == line


def test_unknown_decider_lists_the_valid_ones(cli):
    res = cli("run", *CLI_BASE, "--pd-decider", "sometimes")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: --pd-decider: unknown disaggregation decider 'sometimes'; valid:")
    assert "prefix-threshold" in res.stderr and "direct-to-decode" in res.stderr


def test_ignored_threshold_warning_reaches_stderr_and_the_run_succeeds(cli):
    res = cli("run", *CLI_BASE, "--pd-direct-decode-threshold", "5", "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert "--pd-direct-decode-threshold is ignored: the decider is never, not direct-to-decode" in res.stderr


def test_replay_accepts_the_pd_flags(trace_files):
    header, data = trace_files
    plan = prepare("replay", {**BASE, **POOLS, "--pd-decider": "always", "--pd-transfer-contention": True,
                              "--pd-kv-bytes-per-token": "163840", "--pd-compat": "checkout",
                              "--trace-header": str(header), "--trace-data": str(data)})
    d = plan.scenario.disaggregation
    assert (d.enabled, d.decider.policy, d.transfer.contention, d.transfer.kv_bytes_per_token, d.compat) == \
        (True, "always", "snapshot", 163840, "checkout")
