"""The flag table and how given flags override a scenario (docs/cli.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blis_simpy.cli import flag_rules, flag_values
from blis_simpy.cli import flags as F
from blis_simpy.cli.runner import prepare
from blis_simpy.errors import ConfigError

from .support import QUICKSTART, SMALL_SCENARIO

CATALOG_DATA = Path(__file__).resolve().parents[1] / "catalog" / "data"

# A valid sample text per flag (policy names must be registered ones).
SAMPLES = {
    "--model": ("Qwen/Qwen2.5-7B-Instruct", "qwen/qwen2.5-7b-instruct"),
    "--latency-model": ("blackbox", "blackbox"),
    "--alpha-coeffs": ("1.5,0,2e-3", [1.5, 0.0, 0.002]),
    "--beta-coeffs": ("4,5,6", [4.0, 5.0, 6.0]),
    "--hardware": ("A100-80", "A100-80"),
    "--vllm-version": ("v9", "v9"),
    "--rate": ("2.5", 2.5),
    "--arrival": ("poisson", "poisson"),
    "--prompt-tokens-max": ("4000", 4000),
    "--output-tokens-max": ("4000", 4000),
    "--admission-policy": ("token-bucket", "token-bucket"),
    "--routing-policy": ("least-loaded", "least-loaded"),
    "--trace-level": ("decisions", "decisions"),
    "--summarize-trace": ("true", True),
    "--streaming-metrics": ("true", True),
    "--measured-at": ("client", "client"),
    "--timeline": ("tl.csv", "tl.csv"),
    "--timeline-interval-ms": ("250", 250.0),
    "--fitness-weights": ("p99_ttft:1,throughput:2.5", {"p99_ttft": 1.0, "throughput": 2.5}),
    "--priority-policy": ("slo-based", "slo-based"),
    "--scheduler": ("sjf", "sjf"),
    "--model-config-folder": (str(CATALOG_DATA / "model_configs" / "tiny-model"), str(CATALOG_DATA / "model_configs" / "tiny-model")),
    "--hardware-config": (str(CATALOG_DATA / "hardware_config.json"), str(CATALOG_DATA / "hardware_config.json")),
    "--defaults-filepath": (str(CATALOG_DATA / "blis_defaults.yaml"), str(CATALOG_DATA / "blis_defaults.yaml")),
    "--latency-compat": ("checkout", "checkout"),
    "--kv-offload-threshold": ("0.5", 0.5),
    "--gpu-memory-utilization": ("0.5", 0.5),
    "--kv-capacity-model": ("blis", "blis"),
    "--preemption-model": ("blis", "blis"),
    "--step-model": ("blis", "blis"),
    "--coefficients": (str(CATALOG_DATA / "blackbox-set.yaml"), str(CATALOG_DATA / "blackbox-set.yaml")),
    "--kv-cache-dtype": ("fp8", "fp8"),
    "--enable-expert-parallel": ("true", True),
    "--async-scheduling": ("false", False),
    "--dp": ("2", 2),
    "--pd-decider": ("always", "always"),
    "--pd-contention-mode": ("snapshot", "snapshot"),
    "--prefill-hardware": ("A100-80", "A100-80"),
    "--decode-hardware": ("A100-80", "A100-80"),
    "--prefill-latency-model": ("roofline", "roofline"),
    "--decode-latency-model": ("roofline", "roofline"),
    "--pd-compat": ("checkout", "checkout"),
    "--gateway-policy": ("standard", "standard"),
    "--gateway-order": ("priority", "priority"),
    "--gateway-shed": ("lowest", "lowest"),
    "--gateway-detector": ("concurrency", "concurrency"),
    "--gateway-fair-key": ("slo_class", "slo_class"),
    "--gateway-fair-share": ("a:2,b:1", {"a": 2.0, "b": 1.0}),
    "--rate-schedule": ("day.csv", "day.csv"),
    "--think-time-dist": ("exponential", "exponential"),
    "--autoscaler": ("queue-depth", "queue-depth"),
    "--autoscaler-interval": ("2.5", 2.5),
}
# Flags that are only valid together with others (PD pools need both sizes and instances).
_POOLS = {"--prefill-instances": "1", "--decode-instances": "1", "--num-instances": "4"}
COMPANIONS = {"--prefill-instances": _POOLS, "--decode-instances": _POOLS, "--pd-decider": _POOLS,
              "--pd-contention-mode": _POOLS,
              **dict.fromkeys(("--think-time-dist", "--think-time-ms", "--think-time-sigma"),
                              {"--concurrency": "2"}),
              "--min-instances": {"--max-instances": "4"}, "--initial-instances": {"--max-instances": "4"},
              # a pool's autoscaler bounds: PD pools with no instance outside them, max 4
              **{f"--{pool}-{what}-instances": {"--prefill-instances": "1", "--decode-instances": "1",
                                                "--num-instances": "2",
                                                **({f"--{pool}-max-instances": "4"} if what != "max" else {})}
                 for pool in ("prefill", "decode") for what in ("min", "max", "initial")}}
# Only one member of these families is registered so far: the sample equals quickstart's value.
SAME_AS_QUICKSTART = {"--latency-model"}


def _get(obj, path: str):
    for part in path.split("."):
        if isinstance(obj, dict):                               # a mapping of sections (pools)
            obj = obj.get(part)
        else:
            obj = getattr(obj, part) if obj is not None else None   # an absent section: None
    return obj


@pytest.mark.parametrize("flag", [f for f in F.FLAGS if f.path and not f.path.startswith("workload.h")
                                  and not f.path.startswith("workload.d")], ids=lambda f: f.name)
def test_every_flag_sets_its_scenario_key(flag):
    text, value = SAMPLES.get(flag.name, ("3", 3))
    command = F.RUN if F.RUN in flag.commands else F.REPLAY
    before = _get(prepare(command, {}, str(QUICKSTART)).scenario, flag.path)
    given = {**COMPANIONS.get(flag.name, {}), flag.name: text}
    plan = prepare(command, given, str(QUICKSTART))
    assert _get(plan.scenario, flag.path) == value
    assert flag.name in SAME_AS_QUICKSTART or value != before
    assert plan.origin[flag.path] == flag.name


def test_flag_beats_scenario_key_and_ungiven_flag_leaves_it(small_scenario):
    base = prepare("run", {}, str(small_scenario)).scenario
    assert base.engine.max_num_running_reqs == 16 and base.workload.num_requests == 24
    s = prepare("run", {"--max-num-running-reqs": "9"}, str(small_scenario)).scenario
    assert s.engine.max_num_running_reqs == 9
    assert s.workload.num_requests == 24             # not given: the scenario key stays
    assert s.engine.total_kv_blocks == 2000
    assert s.latency.beta_coeffs == base.latency.beta_coeffs


def test_given_means_given_even_with_the_default_value(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO.replace("seed: 42", "seed: 7"))
    assert prepare("run", {}, str(sc)).scenario.seed == 7
    assert prepare("run", {"--seed": "42"}, str(sc)).scenario.seed == 42   # 42 is BLIS's default


def test_partial_distribution_override_keeps_the_other_keys(small_scenario):
    w = prepare("run", {"--prompt-tokens": "300"}, str(small_scenario)).scenario.workload
    assert (w.prompt_tokens.mean, w.prompt_tokens.stdev, w.prompt_tokens.max) == (300, 80, 600)


def test_flags_only_builds_blis_defaults():
    s = prepare("run", {"--model": "M", "--alpha-coeffs": "1,0,0", "--beta-coeffs": "1,1,1"}).scenario
    assert s.model == "m"
    assert s.latency.model == "blackbox"                    # auto-switch (docs/cli.md)
    w = s.workload
    assert (w.kind, w.rate, w.num_requests, w.prefix_tokens) == ("distribution", 1.0, 100, 0)
    assert (w.prompt_tokens.mean, w.prompt_tokens.stdev, w.prompt_tokens.min, w.prompt_tokens.max) == (512, 256, 2, 7000)
    assert s.engine.max_num_running_reqs == 256 and s.engine.max_num_scheduled_tokens == 2048
    assert s.horizon_us is None and s.seed == 42


def test_blackbox_auto_switch_overrides_the_scenario_backend():
    data = {"latency": {"model": "roofline"}}
    flag_rules.apply_flags(data, {"--alpha-coeffs": "1,2,3", "--beta-coeffs": "4,5,6"}, "run")
    assert data["latency"] == {"model": "blackbox", "alpha_coeffs": [1.0, 2.0, 3.0], "beta_coeffs": [4.0, 5.0, 6.0]}
    data = {"latency": {"model": "roofline"}}
    flag_rules.apply_flags(data, {"--beta-coeffs": "4,5,6", "--alpha-coeffs": "1,2,3", "--latency-model": "blackbox"}, "run")
    assert data["latency"]["model"] == "blackbox"


@pytest.mark.parametrize("given, field", [
    ({"--alpha-coeffs": "1,2,3"}, "--alpha-coeffs"),
    ({"--beta-coeffs": "1,2,3"}, "--beta-coeffs"),
    ({"--latency-model": "roofline", "--alpha-coeffs": "1,2,3", "--beta-coeffs": "1,2,3"}, "--latency-model"),
])
def test_coefficient_pairing(given, field):
    with pytest.raises(ConfigError) as e:
        flag_rules.apply_flags({}, given, "run")
    assert e.value.field == field


def test_one_coefficient_flag_may_replace_a_scenario_list(small_scenario):
    s = prepare("run", {"--beta-coeffs": "1,2,3"}, str(small_scenario)).scenario
    assert s.latency.beta_coeffs == [1.0, 2.0, 3.0]
    assert s.latency.alpha_coeffs == [10326.268121600151, 0.0, 0.0]


def test_errors_follow_blis_processing_order():
    # --max-num-running-reqs (step 7) and --beta-coeffs alone (step 2): step 2 is reported
    with pytest.raises(ConfigError) as e:
        flag_rules.apply_flags({}, {"--max-num-running-reqs": "0", "--beta-coeffs": "1"}, "run")
    assert e.value.field == "--beta-coeffs"
    with pytest.raises(ConfigError) as e:
        flag_rules.apply_flags({}, {"--horizon": "0", "--log": "x", "--num-instances": "0"}, "run")
    assert e.value.field == "--num-instances"


def test_preset_sets_lengths_and_keeps_rate(small_scenario):
    w = prepare("run", {"--workload": "chatbot"}, str(small_scenario)).scenario.workload
    assert (w.prompt_tokens.mean, w.prompt_tokens.stdev, w.prompt_tokens.min, w.prompt_tokens.max) == (256, 100, 2, 800)
    assert (w.output_tokens.mean, w.output_tokens.min, w.output_tokens.max) == (256, 1, 1024)
    assert (w.rate, w.num_requests) == (20.0, 24)


def test_trace_flags_turn_the_workload_into_a_trace(small_scenario, trace_files):
    h, d = trace_files
    s = prepare("replay", {"--trace-header": str(h), "--trace-data": str(d)}, str(small_scenario)).scenario
    assert (s.workload.kind, s.workload.header, s.workload.data) == ("trace", str(h), str(d))


def test_distribution_flags_refuse_a_trace_workload(tmp_path, trace_files):
    sc = tmp_path / "t.yaml"
    sc.write_text(f"workload: {{kind: trace, header: {trace_files[0]}, data: {trace_files[1]}}}\n")
    with pytest.raises(ConfigError) as e:
        prepare("run", {"--rate": "3"}, str(sc))
    assert e.value.field == "--rate"
    s = prepare("run", {"--workload": "distribution", "--rate": "3", "--alpha-coeffs": "1,0,0",
                        "--beta-coeffs": "1,1,1"}, str(sc)).scenario
    assert (s.workload.kind, s.workload.rate) == ("distribution", 3.0)


@pytest.mark.parametrize("text, value", [("42", 42), ("-7", -7), ("+3", 3), ("9223372036854775807", 2**63 - 1)])
def test_integer_parser(text, value):
    assert flag_values.integer(text) == value


@pytest.mark.parametrize("text", ["1.5", "", "x", "9223372036854775808", "1e3"])
def test_integer_parser_rejects(text):
    with pytest.raises(ValueError):
        flag_values.integer(text)


def test_numbers_parser():
    assert flag_values.numbers("1,2.5,-3e-1") == [1.0, 2.5, -0.3]
    with pytest.raises(ValueError):
        flag_values.numbers("1,,2")


def test_flag_for_path_walks_up_to_the_flag_key():
    assert F.flag_for_path("latency.alpha_coeffs[1]").name == "--alpha-coeffs"
    assert F.flag_for_path("workload.prompt_tokens.stdev").name == "--prompt-tokens-stdev"
    assert F.flag_for_path("cluster.routing.params") is None


def test_table_is_consistent():
    names = [f.name for f in F.FLAGS]
    assert len(names) == len(set(names))
    paths = [f.path for f in F.FLAGS if f.path]
    assert len(paths) == len(set(paths))
    assert all(f.name.startswith("--") and set(f.commands) <= {F.RUN, F.REPLAY} for f in F.FLAGS)
