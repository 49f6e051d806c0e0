"""``run --workload-spec`` and scenario workloads of ``kind: spec`` (docs/workloads.md): seed,
horizon and num-requests precedence, error locations, closed-loop sessions end to end,
trace export of follow-ups, and the multi-turn chat example scenario."""

from __future__ import annotations

import json
import logging

import pytest

from blis_simpy.cli.runner import build_workload, execute, prepare
from blis_simpy.errors import ConfigError
from blis_simpy.workload import generate_workload, load_workload_spec, read_trace_records

from .support import REPO

SPEC = """\
version: "2"
seed: 11
aggregate_rate: 20.0
num_requests: 30
horizon: 4000000
clients:
  - id: plain
    rate_fraction: 1.0
    arrival: {process: poisson}
    input_distribution: {type: constant, params: {value: 40}}
    output_distribution: {type: constant, params: {value: 6}}
  - id: chat
    rate_fraction: 0.5
    arrival: {process: poisson}
    input_distribution: {type: constant, params: {value: 30}}
    output_distribution: {type: constant, params: {value: 5}}
    reasoning:
      multi_turn: {max_rounds: 3, think_time_us: 20000, context_growth: accumulate}
"""

BLACKBOX = {"--model": "meta-llama/llama-3.1-8b-instruct", "--latency-model": "blackbox",
            "--alpha-coeffs": "1000,0,0", "--beta-coeffs": "3000,5,50", "--total-kv-blocks": "5000"}


@pytest.fixture
def spec_file(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC)
    return p


def _sig(reqs):
    return [(r.id, r.arrival_us, r.client_id, r.input_len) for r in reqs]


def test_precedence_seed_horizon_num_requests(spec_file):
    spec = load_workload_spec(spec_file)
    reqs, horizon, sessions, seed = build_workload(prepare("run", {**BLACKBOX, "--workload-spec": str(spec_file)}))
    want = generate_workload(spec)
    assert _sig(reqs) == _sig(want.requests) and horizon == 4_000_000 and seed == 11
    assert [b.session_id for b in sessions.sessions.values()] == [b.session_id for b in want.blueprints]
    given = {**BLACKBOX, "--workload-spec": str(spec_file), "--seed": "5", "--horizon": "123456789",
             "--num-requests": "9"}
    reqs, horizon, _, seed = build_workload(prepare("run", given))
    assert _sig(reqs) == _sig(generate_workload(spec, seed=5, horizon=123_456_789, max_requests=9).requests)
    assert (horizon, seed) == (123_456_789, 5) and len(reqs) <= 9


def test_distribution_flags_are_ignored_with_a_warning(spec_file, caplog):
    with caplog.at_level(logging.WARNING):
        plan = prepare("run", {**BLACKBOX, "--workload-spec": str(spec_file), "--rate": "99",
                               "--prompt-tokens": "7", "--workload": "chatbot"})
    assert "--rate, --prompt-tokens ignored" in caplog.text and "--workload is ignored" in caplog.text
    assert plan.scenario.workload.kind == "spec" and plan.scenario.workload.path == str(spec_file)


def test_scenario_inline_spec_and_scenario_seed_counts_as_given(tmp_path):
    import yaml
    body = {"seed": 3, "model": "m", "latency": {"model": "blackbox", "alpha_coeffs": [1000, 0, 0],
                                                 "beta_coeffs": [3000, 5, 50]},
            "engine": {"total_kv_blocks": 5000}, "workload": {"kind": "spec", "spec": yaml.safe_load(SPEC),
                                                               "num_requests": 12}}
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(body))
    reqs, horizon, sessions, seed = build_workload(prepare("run", {}, str(sc)))
    spec = load_workload_spec(_write(tmp_path, SPEC))
    assert seed == 3 and _sig(reqs) == _sig(generate_workload(spec, seed=3, max_requests=12).requests)
    del body["seed"]
    sc.write_text(yaml.safe_dump(body))
    assert build_workload(prepare("run", {}, str(sc)))[3] == 11          # the spec's seed


def _write(tmp_path, text, name="w.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_error_locations(tmp_path, spec_file):
    bad = SPEC.replace("rate_fraction: 0.5", "rate_fraction: -1")
    sc = _write(tmp_path, "model: m\nlatency: {model: blackbox, alpha_coeffs: [1, 0, 0], beta_coeffs: [1, 1, 1]}\n"
                          "workload:\n  kind: spec\n  spec:\n" + "".join("    " + ln + "\n" for ln in bad.splitlines()),
                "inline.yaml")
    with pytest.raises(ConfigError) as ei:
        build_workload(prepare("run", {}, str(sc)))
    e = ei.value
    assert (e.file, e.field) == (str(sc), "workload.spec.client[1].rate_fraction")
    assert sc.read_text().splitlines()[e.line - 1].strip() == "rate_fraction: -1"
    f = _write(tmp_path, bad, "bad.yaml")
    with pytest.raises(ConfigError) as ei:
        build_workload(prepare("run", {**BLACKBOX, "--workload-spec": str(f)}))
    assert (ei.value.file, ei.value.field) == (str(f), "client[1].rate_fraction")
    assert f.read_text().splitlines()[ei.value.line - 1].strip() == "rate_fraction: -1"
    with pytest.raises(ConfigError) as ei:
        build_workload(prepare("run", {**BLACKBOX, "--workload-spec": str(tmp_path / "nope.yaml")}))
    assert (ei.value.field, ei.value.problem) == ("--workload-spec", "no such file")
    unbounded = _write(tmp_path, SPEC.replace("num_requests: 30", "num_requests: 0")
                       .replace("horizon: 4000000", "horizon: 0"), "unb.yaml")
    with pytest.raises(ConfigError, match="num_requests or --horizon") as ei:
        build_workload(prepare("run", {**BLACKBOX, "--workload-spec": str(unbounded)}))
    assert ei.value.file == str(unbounded)
    # the request cap (docs/scenarios.md "Limits") holds for a spec's num_requests too: 1e9
    # used to generate until memory ran out
    huge = _write(tmp_path, SPEC.replace("num_requests: 30", "num_requests: 10000001"), "huge.yaml")
    with pytest.raises(ConfigError, match="less than or equal to 10000000, got 10000001") as ei:
        build_workload(prepare("run", {**BLACKBOX, "--workload-spec": str(huge)}))
    assert (ei.value.file, ei.value.field) == (str(huge), "num_requests")


def test_run_closed_loop_sessions_end_to_end_and_trace_export(cli, spec_file, tmp_path):
    args = ["run"] + [x for kv in BLACKBOX.items() for x in kv] + ["--workload-spec", spec_file]
    out = execute(prepare("run", {k: str(v) for k, v in zip(args[1::2], args[2::2], strict=True)}))
    c = out.result.sessions
    n_chat = sum(1 for r in out.requests if r.client_id == "chat")
    assert c.sessions == n_chat > 0 and c.active == 0 and c.ended() == c.sessions
    assert c.followups == len(out.sessions.followups) > 0
    cluster = out.report.cluster
    assert cluster.completed_requests == len(out.requests) + c.followups
    prefix = tmp_path / "tr"
    res = cli(*args, "--format", "json", "--trace-output", prefix)
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["cluster"]["completed_requests"] == cluster.completed_requests
    rows = read_trace_records(f"{prefix}.csv")
    assert len(rows) == len(out.requests) + c.followups
    assert [r.arrival_time_us for r in rows] == sorted(r.arrival_time_us for r in rows)
    assert {r.round_index for r in rows if r.session_id} == {0, 1, 2}
    assert (tmp_path / "tr.yaml").read_text().count("workload_seed: 11") == 1


def test_multiturn_chat_example(cli):
    path = REPO / "scenarios" / "multiturn_chat.yaml"
    res = cli("validate", path)
    assert res.exit_code == 0 and "workload spec (inline)" in res.stdout
    out = execute(prepare("run", {}, str(path)))
    c = out.result.sessions
    assert c.sessions == len(out.requests) > 20 and c.followups > 2 * c.sessions
    assert c.completed > 0 and c.ended() == c.sessions and c.active == 0
