"""``validate`` says what ``run`` says: one rule for both (issue 13, "Validation gaps").

A table of the gaps found by fuzzing (keys inside an inline workload spec, a length
distribution's params, scorer params; quoted numbers in the policy bundle and in policy
params), then a Hypothesis fuzzer: random scenarios from a small grammar of valid and
invalid keys and values (5 requests each), each checked by ``validate`` and by ``run``;
both must accept or both refuse (exit 2, one line, no traceback).
"""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from blis_simpy.cli.app import app

MODEL = "meta-llama/llama-3.1-8b-instruct"
BASE = {
    "seed": 7,
    "model": MODEL,
    "latency": {"model": "blackbox", "alpha_coeffs": [100.0, 0.0, 0.0], "beta_coeffs": [1000.0, 2.0, 30.0]},
    "engine": {"total_kv_blocks": 500, "max_num_running_reqs": 8},
    "workload": {"kind": "distribution", "rate": 50.0, "num_requests": 5,
                 "prompt_tokens": {"mean": 40, "stdev": 10, "min": 2, "max": 100},
                 "output_tokens": {"mean": 8, "stdev": 2, "min": 2, "max": 20}},
}
CLIENT = {"id": "c", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
          "input_distribution": {"type": "constant", "params": {"value": 30}},
          "output_distribution": {"type": "exponential", "params": {"mean": 8}}}
SPEC = {"version": "2", "seed": 3, "aggregate_rate": 20.0, "num_requests": 5, "clients": [CLIENT]}


def _invoke(*args) -> tuple[int, str]:
    res = CliRunner().invoke(app, [str(a) for a in args], prog_name="blis-simpy")
    return res.exit_code, res.stderr


def _check_both(path) -> tuple[int, str, int, str]:
    v = _invoke("validate", path)
    r = _invoke("run", "--scenario", path, "--format", "json")     # 5 requests: the files' own cap
    for code, err in (v, r):
        assert code in (0, 2), err
        assert "Traceback" not in err and "internal error" not in err, err
        if code == 2:
            assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return (*v, *r)


def _with(data: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(data)
    cur = out
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return out


def _spec_scenario(spec: dict) -> dict:
    return _with(BASE, ("workload",), {"kind": "spec", "spec": spec})


def _routing(params: dict) -> dict:
    return _with(BASE, ("cluster",), {"routing": {"policy": "weighted", "params": params}})


# (scenario dict, field, words in the problem): each was "ok" in validate, or ignored by both
GAPS = {
    "unknown key in an inline spec client": (
        _spec_scenario(_with(SPEC, ("clients", 0, "bogus"), 1)), "workload.spec.client[0].bogus", "unknown key"),
    "unknown key in an inline spec arrival": (
        _spec_scenario(_with(SPEC, ("clients", 0, "arrival", "bogus"), 1)),
        "workload.spec.client[0].arrival.bogus", "unknown key"),
    "unknown key in a length distribution's params": (
        _spec_scenario(_with(SPEC, ("clients", 0, "output_distribution", "params", "bogus"), 3)),
        "workload.spec.client[0].output_distribution.params.bogus", "unknown key (exponential takes mean)"),
    "spec that cannot be bounded": (
        _with(_spec_scenario(_with(SPEC, ("num_requests",), 0)), ("workload", "num_requests"), 0),
        "workload.spec.num_requests", "requires either num_requests or --horizon"),
    "unknown key in scorer params": (
        _routing({"scorers": [{"name": "prefix-affinity", "weight": 1, "params": {"bogus": 1}}]}),
        "cluster.routing.params.scorers[0].params.bogus", "unknown key"),
    "quoted number in scorer params": (
        _routing({"scorers": [{"name": "prefix-affinity", "weight": 1, "params": {"lru_capacity": "5"}}]}),
        "cluster.routing.params.scorers[0].params.lru_capacity", "valid integer, got '5'"),
    "quoted scorer weight": (
        _routing({"scorers": [{"name": "queue-depth", "weight": "2"}]}),
        "cluster.routing.params.scorers[0].weight", "valid number, got '2'"),
    "quoted number in admission params": (
        _with(BASE, ("cluster",), {"admission": {"policy": "token-bucket",
                                                 "params": {"capacity": "10", "refill_rate": 5}}}),
        "cluster.admission.params.capacity", "valid number, got '10'"),
    "number key in policy params": (
        _routing({1: 2}), "cluster.routing.params.1", "keys should be strings, got 1"),
    # bound by an hour's horizon only: 1e9 req/s is 3.6e12 requests (used to generate until
    # memory ran out); one session of endless rounds 0 us apart is 3.6e9
    "a horizon-bound spec at a huge rate": (
        _with(_with(_spec_scenario(_with(_with(SPEC, ("num_requests",), 0), ("aggregate_rate",), 1e9)),
                    ("workload", "num_requests"), 0), ("horizon_us",), 3_600_000_000),
        "workload.spec.num_requests", "about 3.6e+12 requests, more than the limit of 10,000,000"),
    "a session of endless rounds": (
        _with(_with(_spec_scenario(_with(_with(SPEC, ("num_requests",), 0), ("clients", 0, "reasoning"),
                                         {"multi_turn": {"max_rounds": 2**62, "single_session": True}})),
                    ("workload", "num_requests"), 0), ("horizon_us",), 3_600_000_000),
        "workload.spec.num_requests", "about 3.6e+09 requests, more than the limit"),
}


@pytest.mark.parametrize("case", list(GAPS))
def test_validate_refuses_what_run_refuses(tmp_path, case):
    data, field, words = GAPS[case]
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(data, sort_keys=False))
    vcode, verr, rcode, rerr = _check_both(sc)
    assert (vcode, rcode) == (2, 2)
    assert verr == rerr                      # the same line from both
    assert verr.startswith(f"error: {sc}:") and f": {field}: " in verr and words in verr, verr


def test_quoted_number_refused_in_the_policy_bundle_as_in_a_scenario(tmp_path):
    """One rule (strict): a quoted number is a string in --policy-config as in a scenario."""
    pc = tmp_path / "p.yaml"
    pc.write_text("admission:\n  policy: token-bucket\n  token_bucket_capacity: \"10\"\n")
    code, err = _invoke("run", "--model", MODEL, "--num-requests", "5", "--policy-config", pc)
    assert code == 2
    assert err == f"error: {pc}:3: admission.token_bucket_capacity: input should be a valid number, got '10'\n"
    pc.write_text("admission:\n  policy: token-bucket\n  token_bucket_capacity: 10\n")   # unquoted: fine
    assert _invoke("run", "--model", MODEL, "--num-requests", "5", "--policy-config", pc)[0] == 0


def test_the_valid_base_and_spec_run():
    assert yaml.safe_load(yaml.safe_dump(BASE)) == BASE


# ---------------------------------------------------------------------------- the fuzzer
#: (key path, candidate values): valid and invalid values side by side
EDITS = [
    (("engine", "block_size"), [16, 32, 0, -1, "16", 2 ** 70, 1.5]),
    (("engine", "total_kv_blocks"), [500, 3, 0, "500"]),
    (("engine", "max_num_running_reqs"), [8, 0, True]),
    (("engine", "scheduler"), ["fcfs", "sjf", "nope", 3]),
    (("engine", "bogus"), [1]),
    (("cluster",), [{"num_instances": 2}, {"num_instances": 0}, {"num_instances": "2"},
                    {"routing": {"policy": "least-loaded"}}, {"routing": {"policy": "nope"}},
                    {"routing": {"policy": "weighted", "params": {"scorers": "queue-depth:1"}}},
                    {"routing": {"policy": "weighted", "params": {"scorers": [{"name": "queue-depth", "weight": 1,
                                                                               "params": {"x": 1}}]}}},
                    {"routing": {"policy": "weighted", "params": {"scorers": [{"name": "nope", "weight": 1}]}}},
                    {"routing": {"policy": "round-robin", "params": 5}},
                    {"admission": {"policy": "token-bucket", "params": {"capacity": 10, "refill_rate": 5}}},
                    {"admission": {"policy": "token-bucket", "params": {"capacity": "10"}}},
                    {"admission": {"policy": "token-bucket", "params": {"capacity": -1}}},
                    {"admission": {"policy": "always-admit", "params": {"bogus": 1}}}]),
    (("workload", "rate"), [50.0, 0, -3, "5", float("nan")]),
    (("workload", "prompt_tokens", "stdev"), [10, 500, -1]),
    (("workload", "bogus"), [1]),
    (("seed",), [1, "x", -5]),
    (("horizon_us",), [10_000_000, 0, -1, "10"]),
    (("bogus_top",), [1]),
]
SPEC_EDITS = [
    (("clients", 0, "arrival"), [{"process": "poisson"}, {"process": "gamma", "cv": 2.0}, {"process": "nope"},
                                 {"process": "poisson", "x": 1}, {"process": "weibull", "cv": 50.0}]),
    (("clients", 0, "input_distribution"), [
        {"type": "constant", "params": {"value": 30}}, {"type": "gaussian", "params": {"mean": 30}},
        {"type": "gaussian", "params": {"mean": 30, "std_dev": 5, "min": 1, "max": 60}},
        {"type": "constant", "params": {"value": 30, "extra": 1}}, {"type": "nope", "params": {}},
        {"type": "empirical", "params": {10: 0.5, 20: 0.5}}, {"type": "constant", "params": {"value": "30"}},
        {"type": "constant", "params": {"value": 2**62}}, {"type": "exponential", "params": {"mean": 1e8}},
        {"type": "gaussian", "params": {"mean": 1e8, "std_dev": 5, "min": 1, "max": 2e8}},
        {"type": "empirical", "params": {10: 0.5, 2**32: 0.5}}]),
    (("clients", 0, "prefix_length"), [16, 2**24, 2**24 + 1]),
    (("clients", 0, "rate_fraction"), [1.0, 0, -1, "1"]),
    (("clients", 0, "slo_class"), ["standard", "nope"]),
    (("clients", 0, "mystery"), [1]),
    (("aggregate_rate",), [20.0, 0, "20"]),
    (("version",), ["2", "3", 2]),
    (("num_requests",), [5, 0, -1]),
]


def _edit(data: dict, path: tuple, value) -> None:
    cur = data
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value


@st.composite
def scenarios(draw) -> dict:
    data = copy.deepcopy(BASE)
    if draw(st.booleans()):
        spec = copy.deepcopy(SPEC)
        for i in draw(st.lists(st.integers(0, len(SPEC_EDITS) - 1), max_size=2, unique=True)):
            path, values = SPEC_EDITS[i]
            _edit(spec, path, draw(st.sampled_from(values)))
        data["workload"] = {"kind": "spec", "spec": spec}
    for i in draw(st.lists(st.integers(0, len(EDITS) - 1), max_size=2, unique=True)):
        path, values = EDITS[i]
        if path[0] == "workload" and data["workload"].get("kind") == "spec":
            continue
        _edit(data, path, draw(st.sampled_from(values)))
    return data


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=scenarios())
def test_fuzz_validate_and_run_agree(tmp_path, data):
    sc = tmp_path / "fuzz.yaml"
    sc.write_text(yaml.safe_dump(data, sort_keys=False))
    vcode, verr, rcode, rerr = _check_both(sc)
    assert vcode == rcode, (data, verr, rerr)
    if vcode == 2:
        assert verr == rerr, (data, verr, rerr)


# ------------------------------------------------------- token counts in a workload spec
#: 2^24: the cap of a scenario's token keys, a trace's token counts and a spec's lengths
CAP = 16_777_216
MM_CLIENT = {"id": "m", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
             "multimodal": {"text_distribution": {"type": "constant", "params": {"value": 10}},
                            "image_distribution": {"type": "constant", "params": {"value": 5}},
                            "image_count_distribution": {"type": "constant", "params": {"value": 2}}},
             "output_distribution": {"type": "constant", "params": {"value": 4}}}
GAUSS = {"mean": 30, "std_dev": 5, "min": 1, "max": 60}
PARETO = {"alpha": 2, "xm": 50, "mu": 3, "sigma": 0.5, "mix_weight": 0.3}


def _dist_case(dist: str, params: dict, key: str, value) -> tuple[dict, tuple, str]:
    """SPEC with client 0's input length ``dist(params)``, ``params[key] = value``."""
    p = {**params, key: value}
    return (_with(SPEC, ("clients", 0, "input_distribution"), {"type": dist, "params": p}),
            ("clients", 0, "input_distribution", "params", key),
            f"client[0].input_distribution.params.{key}")


#: every token-count parameter of every length type, and every other token count of a spec:
#: (spec, YAML key path, field of the error)
TOKEN_CASES = {
    **{f"constant.value={v}": _dist_case("constant", {}, "value", v) for v in (2**62, 2**32, 1e8, CAP + 1)},
    **{f"gaussian.{k}": _dist_case("gaussian", GAUSS, k, 2**62) for k in GAUSS},
    "exponential.mean": _dist_case("exponential", {}, "mean", 2**62),
    "exponential.mean=cap+1": _dist_case("exponential", {}, "mean", CAP + 1),
    "pareto_lognormal.xm": _dist_case("pareto_lognormal", PARETO, "xm", 1e8),
    "pareto_lognormal.mu": _dist_case("pareto_lognormal", PARETO, "mu", 17),
    "empirical key": (_with(SPEC, ("clients", 0, "input_distribution"),
                            {"type": "empirical", "params": {10: 0.5, CAP + 1: 0.5}}),
                      ("clients", 0, "input_distribution", "params", CAP + 1),
                      f"client[0].input_distribution.params.{CAP + 1}"),
    "output length": (_with(SPEC, ("clients", 0, "output_distribution"),
                            {"type": "gaussian", "params": {**GAUSS, "max": 1e8}}),
                      ("clients", 0, "output_distribution", "params", "max"),
                      "client[0].output_distribution.params.max"),
    "prefix_length": (_with(SPEC, ("clients", 0, "prefix_length"), 2**62),
                      ("clients", 0, "prefix_length"), "client[0].prefix_length"),
    "multimodal image size": (
        _with(_with(SPEC, ("clients",), [MM_CLIENT]),
              ("clients", 0, "multimodal", "image_distribution", "params", "value"), 2**32),
        ("clients", 0, "multimodal", "image_distribution", "params", "value"),
        "client[0].multimodal.image_distribution.params.value"),
    "cohort input": (
        _with(_with(SPEC, ("cohorts",), [{"id": "k", "population": 2, "rate_fraction": 1.0,
                                          "arrival": {"process": "poisson"},
                                          "input_distribution": {"type": "constant", "params": {"value": 30}},
                                          "output_distribution": {"type": "constant", "params": {"value": 4}}}]),
              ("cohorts", 0, "input_distribution", "params", "value"), 2**62),
        ("cohorts", 0, "input_distribution", "params", "value"),
        "cohort[0].input_distribution.params.value"),
    "inference_perf question_len": (
        {"version": "2", "num_requests": 5, "inference_perf": {
            "stages": [{"rate": 10.0, "duration": 1.0}],
            "shared_prefix": {"num_unique_system_prompts": 1, "num_users_per_system_prompt": 1,
                              "question_len": 2**62, "output_len": 4}}},
        ("inference_perf", "shared_prefix", "question_len"), "inference_perf.shared_prefix.question_len"),
}


def _key_line(path, keys: tuple) -> int:
    """1-based line of the key at ``keys`` in the YAML file (PyYAML's own node marks)."""
    node = yaml.compose(path.read_text())
    line = 0
    for k in keys:
        if isinstance(k, int) and node.id == "sequence":
            node = node.value[k]
            continue
        key_node, node = next((kn, vn) for kn, vn in node.value if kn.value == str(k))
        line = key_node.start_mark.line + 1
    return line


@pytest.mark.parametrize("source", ["inline", "file"])
@pytest.mark.parametrize("case", list(TOKEN_CASES))
def test_spec_token_counts_are_capped_alike_in_validate_and_run(tmp_path, case, source):
    """A token count above 2^24 anywhere in a workload spec (each length type's parameters,
    the empirical keys, prefix lengths, multimodal, cohorts, inference-perf) is one located
    line from ``validate`` and from ``run`` (it was "ok", then a MemoryError / internal error)."""
    spec, keys, field = TOKEN_CASES[case]
    sc = tmp_path / "s.yaml"
    if source == "inline":
        sc.write_text(yaml.safe_dump(_spec_scenario(spec), sort_keys=False))
        where, keys, field = sc, ("workload", "spec", *keys), f"workload.spec.{field}"
    else:
        where = tmp_path / "ws.yaml"
        where.write_text(yaml.safe_dump(spec, sort_keys=False))
        sc.write_text(yaml.safe_dump(_with(BASE, ("workload",), {"kind": "spec", "path": "ws.yaml"}),
                                     sort_keys=False))
    vcode, verr, rcode, rerr = _check_both(sc)
    assert (vcode, rcode) == (2, 2)
    assert verr == rerr
    assert verr.startswith(f"error: {where}:{_key_line(where, keys)}: {field}: "), verr
    assert str(CAP) in verr or "ln 16777216" in verr, verr


def test_a_spec_at_the_cap_is_valid(tmp_path):
    """The cap itself is allowed (validate only: a 2^24-token prompt is valid input)."""
    spec = _with(SPEC, ("clients", 0, "input_distribution"), {"type": "constant", "params": {"value": CAP}})
    spec = _with(spec, ("clients", 0, "prefix_length"), CAP)
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(_spec_scenario(spec), sort_keys=False))
    assert _invoke("validate", sc)[0] == 0


def _horizon_bound(client: dict, rate: float, horizon_us: int = 3_600_000_000) -> dict:
    spec = {**SPEC, "num_requests": 0, "aggregate_rate": rate, "clients": [client]}
    return _with(_with(_spec_scenario(spec), ("workload", "num_requests"), 0), ("horizon_us",), horizon_us)


# a workload bound by its horizon alone: (client, aggregate rate req/s) -> expected requests
LATE = {**CLIENT, "lifecycle": {"windows": [{"start_us": 3_598_000_000, "end_us": 3_600_000_000}]}}
BOUND_CASES = {
    # 2,700 req/s for an hour: 9.72M expected, under the 10M limit (validated, not run)
    "just under the limit": (CLIENT, 2_700.0, None),
    # a 2 s burst at 5,000 req/s at the end of the hour: 10,000 requests (the window counts,
    # not the span up to it), 1.8e7 arrivals drawn on the way
    "a short late window": (LATE, 5_000.0, None),
    # the same at 50,000 req/s: 100,000 requests, but 1.8e8 arrivals drawn and skipped
    "a short late window at a huge rate": (LATE, 50_000.0, "draws about 1.8e+08 arrivals"),
    # 1 session a second for an hour, each up to 5,000 rounds 1 ms apart: 1.8e7
    "sessions x rounds": ({**CLIENT, "reasoning": {"multi_turn": {"max_rounds": 5_000, "think_time_us": 1_000}}},
                          1.0, "about 1.8e+07 requests"),
    # 3,000 req/s for an hour: 1.08e7
    "just over the limit": (CLIENT, 3_000.0, "about 1.08e+07 requests"),
}


@pytest.mark.parametrize("case", list(BOUND_CASES))
def test_horizon_bound_workloads_are_sized_before_generating(tmp_path, case):
    client, rate, words = BOUND_CASES[case]
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(_horizon_bound(client, rate), sort_keys=False))
    code, err = _invoke("validate", sc)
    if words is None:
        assert code == 0, err
    else:
        assert code == 2 and len(err.splitlines()) == 1, err
        assert ": workload.spec.num_requests: " in err and words in err, err
