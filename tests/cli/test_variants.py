"""Scenario variants (``variants:``): merged overrides, strict located validation, flags over
variants, identical workloads, the three output formats, ``--results-path``, ``validate``
and scenarios/pd_comparison.yaml."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from blis_simpy.cli import variants as V
from blis_simpy.cli.runner import prepare
from blis_simpy.errors import SimulationError

from .support import LOCATED, REPO, trace_row, write_trace_files

PD_COMPARISON = REPO / "scenarios" / "pd_comparison.yaml"

BASE = """\
name: tiny-pd
model: qwen/qwen3-14b
hardware: H100
latency: {model: roofline}
cluster: {num_instances: 4}
workload:
  rate: 40.0
  num_requests: 24
  prompt_tokens: {mean: 600, stdev: 200, min: 100, max: 1200}
  output_tokens: {mean: 20, stdev: 8, min: 2, max: 40}
"""
VARIANTS = """\
variants:
  - name: co-located
    overrides: {}
  - name: 2P2D
    description: half and half
    overrides:
      disaggregation:
        prefill_instances: 2
        decode_instances: 2
        decider: {policy: always}
  - name: 1P1D
    overrides:
      engine: {max_num_running_reqs: 8}
      disaggregation: {prefill_instances: 1, decode_instances: 1, decider: {policy: always}}
"""
NAMES = ["co-located", "2P2D", "1P1D"]


def _ok(res):
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr)
    return res


@pytest.fixture
def scenario(tmp_path):
    p = tmp_path / "v.yaml"
    p.write_text(BASE + VARIANTS)
    return p


def _blis_chunks(text: str) -> dict[str, str]:
    parts = re.split(r"^=== Variant: (.+) ===\n", text, flags=re.M)
    assert parts[0] == ""
    return dict(zip(parts[1::2], parts[2::2], strict=True))


# ---------------------------------------------------------------------------- merging
def test_merge_patch_is_rfc7386_and_copies():
    base = {"a": {"b": 1, "c": [1, 2], "d": {"e": 1}}, "f": 2}
    patch = {"a": {"b": None, "c": [3], "d": {"g": 2}}, "f": {"h": 1}, "n": None}
    merged = V.merge_patch(base, patch)
    assert merged == {"a": {"c": [3], "d": {"e": 1, "g": 2}}, "f": {"h": 1}}
    assert base == {"a": {"b": 1, "c": [1, 2], "d": {"e": 1}}, "f": 2}   # untouched
    merged["a"]["d"]["e"] = 99
    assert base["a"]["d"]["e"] == 1                                       # no shared mappings


def test_null_override_restores_the_default(tmp_path):
    p = tmp_path / "n.yaml"
    p.write_text(BASE.replace("cluster: {num_instances: 4}",
                              "cluster: {num_instances: 4, routing: {policy: least-loaded}}")
                 + "variants:\n  - name: rr\n    overrides: {cluster: {routing: null}}\n")
    (vp,) = V.variant_invocations(prepare("run", {}, str(p)), {})
    assert vp.invocation.scenario.cluster.routing.policy == "round-robin"
    assert vp.invocation.scenario.cluster.num_instances == 4


# ---------------------------------------------------------------------------- runs
def test_every_variant_serves_the_identical_workload(cli, scenario, tmp_path):
    out = tmp_path / "r.json"
    _ok(cli("run", "--scenario", scenario, "--format", "json", "--results-path", out))
    results = json.loads(out.read_text())
    assert list(results) == NAMES
    rows = {name: [(r["requestID"], r["arrived_at"], r["num_prefill_tokens"], r["num_decode_tokens"])
                   for r in res["requests"]] for name, res in results.items()}
    assert len(rows["co-located"]) == 24
    assert rows["2P2D"] == rows["co-located"] == rows["1P1D"]
    assert {res["injected_requests"] for res in results.values()} == {24}


def test_workload_mismatch_is_an_error():
    def fake(inv):
        return SimpleNamespace(requests=[SimpleNamespace(id="r", arrival_us=inv, input_len=1,
                                                         output_len=1, prefix_group="", prefix_length=0)])
    vps = [SimpleNamespace(name=n, index=i, invocation=i, file_src=None) for i, n in enumerate("ab")]
    with pytest.raises(SimulationError, match="variant 'b' served other requests than 'a'"):
        V.execute(vps, fake)


def test_json_document_lists_every_variant_report(cli, scenario):
    doc = json.loads(_ok(cli("run", "--scenario", scenario, "--format", "json")).stdout)
    assert list(doc) == ["command", "scenario", "comparison", "variants"]
    assert doc["command"] == "run" and doc["scenario"] == "tiny-pd"
    assert [v["variant"] for v in doc["variants"]] == NAMES
    assert [c["variant"] for c in doc["comparison"]] == NAMES
    co, pd, small = doc["variants"]
    assert co["pd"] is None and pd["pd"] is not None and small["pd"] is not None
    assert pd["description"] == "half and half"
    assert pd["overrides"]["disaggregation"]["decider"] == {"policy": "always"}
    assert pd["pd"]["disaggregated_count"] == 24
    assert [c["deployment"] for c in doc["comparison"]] == ["4 co-located", "2P + 2D", "1P + 1D + 2 idle"]
    assert doc["comparison"][0]["transfer_mean_ms"] is None
    assert doc["comparison"][1]["transfer_mean_ms"] > 0
    for c, v in zip(doc["comparison"], doc["variants"], strict=True):   # same numbers as the reports
        assert c["completed"] == v["cluster"]["completed_requests"] == 24
        assert c["ttft_p99_ms"] == v["cluster"]["ttft_p99_ms"]
        assert c["itl_mean_ms"] == v["cluster"]["itl_mean_ms"]
        assert c["ttft_p50_ms"] == v["cluster"]["ttft_p50_ms"] > 0


def test_blis_output_equals_the_equivalent_plain_runs(cli, scenario, tmp_path):
    chunks = _blis_chunks(_ok(cli("run", "--scenario", scenario, "--format", "blis")).stdout)
    assert list(chunks) == NAMES
    plain = tmp_path / "plain.yaml"
    plain.write_text(BASE)
    alone = {
        "co-located": (),
        "2P2D": ("--prefill-instances", "2", "--decode-instances", "2", "--pd-decider", "always"),
        "1P1D": ("--prefill-instances", "1", "--decode-instances", "1", "--pd-decider", "always",
                 "--max-num-running-reqs", "8"),
    }
    for name, flags in alone.items():
        ref = _ok(cli("run", "--scenario", plain, "--format", "blis", *flags)).stdout
        assert chunks[name] == ref, name
    assert "=== PD Metrics ===" in chunks["2P2D"] and "=== PD Metrics ===" not in chunks["co-located"]


def test_table_output_compares_and_shows_pd_sections(cli, scenario):
    out = _ok(cli("run", "--scenario", scenario)).stdout
    assert out.startswith("run: tiny-pd: 24 requests, the same for each of 3 variants")
    assert "Variants (times in ms)" in out and "Counters" in out
    for name in NAMES:
        assert re.search(rf"^ {re.escape(name)} ", out, re.M), name
    assert "Prefill/decode disaggregation: 2P2D" in out
    assert "Prefill/decode disaggregation: 1P1D" in out
    assert "Prefill/decode disaggregation: co-located" not in out
    assert "co-located: no PD section" in out


@pytest.mark.parametrize("fmt", ["table", "json", "blis"])
def test_output_is_deterministic(cli, scenario, fmt):
    a = _ok(cli("run", "--scenario", scenario, "--format", fmt)).stdout
    b = _ok(cli("run", "--scenario", scenario, "--format", fmt)).stdout
    assert a == b


# ---------------------------------------------------------------------------- flags
def test_flags_override_every_variant(scenario):
    given = {"--num-instances": "5", "--max-num-running-reqs": "6"}
    vps = V.variant_invocations(prepare("run", given, str(scenario)), given)
    assert [vp.name for vp in vps] == NAMES
    for vp in vps:
        s = vp.invocation.scenario
        assert s.cluster.num_instances == 5
        assert s.engine.max_num_running_reqs == 6          # beats the 1P1D override too
        assert vp.invocation.origin["engine.max_num_running_reqs"] == "--max-num-running-reqs"
    assert [vp.invocation.scenario.disaggregation.prefill_instances for vp in vps] == [0, 2, 1]


def test_flag_conflicting_with_a_variant_names_the_variant(cli, tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(BASE + "disaggregation: {prefill_instances: 2, decode_instances: 2, decider: {policy: always}}\n"
                 "variants:\n  - {name: pd, overrides: {}}\n  - {name: co, overrides: {disaggregation: null}}\n")
    res = cli("run", "--scenario", p, "--pd-contention-mode", "snapshot")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.startswith("error: --pd-contention-mode: transfer contention (snapshot) needs PD pools")
    assert res.stderr.rstrip().endswith("(variant 'co')")
    # the base and the pd variant accept the flag; dropping the co variant makes it run
    p.write_text(p.read_text().replace("  - {name: co, overrides: {disaggregation: null}}\n", ""))
    doc = json.loads(_ok(cli("run", "--scenario", p, "--pd-contention-mode", "snapshot",
                             "--format", "json")).stdout)
    assert doc["variants"][0]["pd"]["contention"] is True


def test_warnings_are_tagged_with_the_variant(cli, scenario):
    res = _ok(cli("run", "--scenario", scenario, "--format", "json"))
    assert "[variant 1P1D]" in res.stderr and "sit idle" in res.stderr
    assert "[variant 2P2D]" not in res.stderr


def test_trace_output_is_refused(cli, scenario, tmp_path):
    res = cli("run", "--scenario", scenario, "--trace-output", tmp_path / "t")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: --trace-output: not supported with scenario variants")
    assert not list(tmp_path.glob("t.*"))


# ---------------------------------------------------------------------------- errors
ERRORS = [
    # (variant text, expected line, field, problem fragment)
    ("  - name: b\n    overrides:\n      engine: {bogus: 1}\n", 3, "variants[1].overrides.engine.bogus",
     "unknown key"),
    ("  - name: b\n    overrides:\n      engine:\n        max_num_running_reqs: -1\n", 4,
     "variants[1].overrides.engine.max_num_running_reqs", "greater than 0"),
    ("  - name: b\n    overrides:\n      cluster: {num_instances: '4'}\n", 3,
     "variants[1].overrides.cluster.num_instances", "valid integer"),
    ("  - name: b\n    overrides:\n      disaggregation:\n        prefill_instances: 3\n"
     "        decode_instances: 2\n", 4, "variants[1].overrides.disaggregation.prefill_instances",
     "exceeds num-instances (4)"),
    ("  - name: b\n    overrides:\n      latency: {model: nope}\n", 3,
     "variants[1].overrides.latency.model", "nope"),
    ("  - name: b\n    overrides:\n      workload: {rate: 2.0}\n", 3, "variants[1].overrides.workload",
     "cannot vary"),
    ("  - name: b\n    overrides:\n      seed: 7\n", 3, "variants[1].overrides.seed", "cannot vary"),
    # a bad workload spec in a variant: refused by validate as by run (workload cannot vary, so
    # the base's spec, which validate checks with check_workload, is every variant's)
    ("  - name: b\n    overrides:\n      workload:\n        kind: spec\n"
     "        spec: {clients: [{id: c, bogus: 1}]}\n", 3, "variants[1].overrides.workload",
     "cannot vary"),
    ("  - name: a\n    overrides: {}\n", 1, "variants[1].name", "duplicate variant name"),
    ("  - name: b\n    overrides: {}\n    extra: 1\n", 3, "variants[1].extra", "unknown key"),
    ("  - overrides: {}\n", 1, "variants[1].name", "required"),
]


@pytest.mark.parametrize(("text", "line", "field", "problem"), ERRORS)
def test_override_errors_are_located(cli, tmp_path, text, line, field, problem):
    head = BASE + "variants:\n  - name: a\n    overrides: {}\n"
    p = tmp_path / "bad.yaml"
    p.write_text(head + text)
    first = head.count("\n") + 1                           # line of the second variant
    for args in (("validate", p), ("run", "--scenario", p)):
        res = cli(*args)
        assert res.exit_code == 2, (res.stdout, res.stderr)
        m = LOCATED.match(res.stderr.strip())
        assert m, res.stderr
        assert (m["file"], int(m["line"]), m["field"]) == (str(p), first + line - 1, field), res.stderr
        assert problem in m["problem"], res.stderr
        assert res.stdout == ""


def test_base_key_made_invalid_by_a_variant_points_at_the_variant(cli, tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text(BASE + "disaggregation: {prefill_instances: 2, decode_instances: 2, decider: {policy: always}}\n"
                 "variants:\n  - name: three\n    overrides:\n      cluster: {num_instances: 3}\n")
    res = cli("validate", p)
    assert res.exit_code == 2
    m = LOCATED.match(res.stderr.strip())
    assert m and m["field"] == "variants[0].overrides" and int(m["line"]) == BASE.count("\n") + 4
    assert m["problem"].startswith("disaggregation.prefill_instances: Invalid PD pool topology")


def test_base_key_next_to_an_override_is_a_base_key(cli, tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(BASE.replace("cluster: {num_instances: 4}",
                              "cluster:\n  num_instances: 4\n  routing: {policy: least-loaded, params: {tie_break: first}}")
                 + "variants:\n  - name: rr\n    overrides:\n      cluster: {routing: {policy: round-robin}}\n")
    res = cli("validate", p)
    assert res.exit_code == 2
    m = LOCATED.match(res.stderr.strip())
    assert m and m["field"] == "variants[0].overrides", res.stderr
    assert m["problem"].startswith("cluster.routing.params"), res.stderr


# ---------------------------------------------------------------------------- validate
def test_validate_lists_every_variant(cli, scenario):
    out = _ok(cli("validate", scenario)).stdout.splitlines()
    assert out[0].startswith(f"ok: {scenario}: tiny-pd:")
    assert out[1:] == ["  variant co-located: 4 co-located, roofline latency, round-robin routing",
                       "  variant 2P2D: 2P + 2D, roofline latency, round-robin routing",
                       "  variant 1P1D: 1P + 1D + 2 idle, roofline latency, round-robin routing"]


def test_replay_with_variants(cli, tmp_path):
    rows = [trace_row(i, 10_000 * i, 300 + 10 * i, 10) for i in range(10)]
    write_trace_files(tmp_path, rows)
    p = tmp_path / "r.yaml"
    p.write_text("model: qwen/qwen3-14b\nhardware: H100\nlatency: {model: roofline}\n"
                 "cluster: {num_instances: 2}\nworkload: {kind: trace, header: trace.yaml, data: trace.csv}\n"
                 "variants:\n  - {name: co, overrides: {}}\n"
                 "  - {name: 1P1D, overrides: {disaggregation: {prefill_instances: 1, decode_instances: 1, "
                 "decider: {policy: always}}}}\n")
    out = tmp_path / "res.json"
    # the horizon: one prefill instance at 100 req/s is near capacity, so the last requests
    # finish after replay's default (twice the last arrival)
    doc = json.loads(_ok(cli("replay", "--scenario", p, "--format", "json", "--results-path", out,
                             "--horizon", "10000000")).stdout)
    assert [v["command"] for v in doc["variants"]] == ["replay", "replay"]
    res = json.loads(out.read_text())
    assert list(res) == ["co", "1P1D"]
    assert [r["request_id"] for r in res["co"]] == [r["request_id"] for r in res["1P1D"]] == list(range(10))


# ---------------------------------------------------------------------------- the PD scenario
def test_pd_comparison_scenario_shows_the_pd_sections(cli):
    assert _ok(cli("validate", PD_COMPARISON)).stdout.count("\n  variant ") == 4
    fast = ("--num-requests", "60")                        # flags apply to every variant
    table = _ok(cli("run", "--scenario", PD_COMPARISON, *fast)).stdout
    for name in ("2P2D", "1P3D", "3P1D"):
        assert f"Prefill/decode disaggregation: {name}" in table
    assert "co-located: no PD section" in table
    doc = json.loads(_ok(cli("run", "--scenario", PD_COMPARISON, "--format", "json", *fast)).stdout)
    by = {v["variant"]: v for v in doc["variants"]}
    assert list(by) == ["co-located", "2P2D", "1P3D", "3P1D"]
    assert by["co-located"]["pd"] is None
    for name in ("2P2D", "1P3D", "3P1D"):
        assert by[name]["pd"]["disaggregated_count"] == 60
        assert by[name]["pd"]["transfer_duration"]["mean_ms"] > 0
    assert {v["cluster"]["completed_requests"] for v in doc["variants"]} == {60}


@pytest.mark.parametrize("fmt, renderer", [("json", "blis_simpy.cli.variants.comparison_row"),
                                           ("table", "blis_simpy.metrics.tables.pd_table")])
def test_a_summary_that_cannot_be_rendered_leaves_no_results_file(cli, scenario, tmp_path,
                                                                  monkeypatch, fmt, renderer):
    # rendered before the results file is written (a NaN no JSON can hold, say)
    def fail(*a, **k):
        raise ValueError("Out of range float values are not JSON compliant")
    monkeypatch.setattr(renderer, fail)
    out = tmp_path / "r.json"
    res = cli("run", "--scenario", scenario, "--results-path", out, "--format", fmt)
    assert res.exit_code != 0 and "Out of range float" in res.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------- timelines
def test_each_variant_writes_its_own_timeline(cli, scenario, tmp_path):
    out = tmp_path / "tl.csv"
    _ok(cli("run", "--scenario", scenario, "--timeline", out))
    files = sorted(p.name for p in tmp_path.glob("tl.*.csv"))
    assert files == ["tl.1P1D.csv", "tl.2P2D.csv", "tl.co-located.csv"] and not out.exists()
    roles = {name: set(open(tmp_path / name).read().splitlines()[1].split(",")[2:3]) for name in files}
    assert roles["tl.co-located.csv"] == {""} and roles["tl.2P2D.csv"] == {"prefill"}


def test_variant_timeline_names(tmp_path):
    assert V.variant_path("out/day.parquet", "fixed 2/x") == "out/day.fixed_2_x.parquet"
    assert V.variant_path("day.csv", "a.b-c_d") == "day.a.b-c_d.csv"


def test_variants_whose_timeline_files_would_collide_are_refused(cli, tmp_path):
    p = tmp_path / "v.yaml"
    p.write_text(BASE + "variants:\n  - name: a b\n  - name: a/b\n")
    res = cli("run", "--scenario", p, "--timeline", tmp_path / "tl.csv")
    assert res.exit_code == 2 and "variants[1].name" in res.stderr
    assert "its timeline file would be" in res.stderr and not list(tmp_path.glob("tl*"))


def test_a_failing_variant_leaves_no_timeline(cli, scenario, tmp_path, monkeypatch):
    real = V.runner.execute
    calls = []

    def second_fails(inv, **kw):
        calls.append(inv)
        if len(calls) == 2:
            raise SimulationError("boom")
        return real(inv, **kw)
    monkeypatch.setattr(V.runner, "execute", second_fails)
    res = cli("run", "--scenario", scenario, "--timeline", tmp_path / "tl.csv")
    assert res.exit_code != 0 and "boom" in res.stderr
    assert len(calls) == 2 and not list(tmp_path.glob("tl*"))
