"""Autoscaling through the CLI: scenario keys and flags, the JSON summary and table, the
timeline's ``state`` column and the report figure, a plugin policy from a scenario file,
located errors (exit 2, one line), determinism."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.loading import loading_delay_us
from blis_simpy.deploy.resolve import resolve
from blis_simpy.report import figures
from blis_simpy.report.inputs import load_input
from tests.cli.support import SMALL_SCENARIO

AUTOSCALED = SMALL_SCENARIO.replace("max_num_running_reqs: 16", "max_num_running_reqs: 2") + """\
slo: {ttft_ms: 200}
cost: {gpu_hour_usd: 2.0}
cluster:
  routing: {policy: least-loaded}
  autoscaler:
    policy: queue-depth
    interval_s: 0.2
    min_instances: 1
    max_instances: 3
    load_bandwidth_gbps: null
    startup_s: 0.1
    params: {target_per_instance: 1, scale_down_stabilization_s: 0.4}
"""


@pytest.fixture
def scaled(tmp_path: Path) -> Path:
    p = tmp_path / "scaled.yaml"
    p.write_text(AUTOSCALED)
    return p


def run_json(cli, *args) -> dict:
    res = cli("run", *args, "--format", "json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def test_json_summary_has_the_section_and_the_results_file_does_not(cli, scaled, tmp_path):
    out = tmp_path / "results.json"
    doc = run_json(cli, "--scenario", scaled, "--results-path", out)
    a = doc["autoscaling"]
    assert a["policy"] == "queue-depth" and a["loading_delay_us"] == 100_000
    assert a["instance_count"][0] == {"t_us": 0, "pool": "", "serving": 1, "loading": 0,
                                      "draining": 0}
    assert a["scale_ups"] >= 1 and a["peak_instances"] >= 2
    # GPU-hours, priced at 2 USD; the intervals partition the arrivals
    assert a["cost_usd"] == pytest.approx(2.0 * a["gpu_hours"])
    assert sum(r["arrived"] for r in a["intervals"]) == 24
    assert [r["start_us"] for r in a["intervals"][:3]] == [0, 200_000, 400_000]
    for r in a["intervals"]:
        if r["arrived"]:
            assert r["attainment_pct"] == pytest.approx(100.0 * r["met"] / r["arrived"])
    assert "autoscaling" not in out.read_text()


def test_table_shows_autoscaling(cli, scaled):
    res = cli("run", "--scenario", scaled)
    assert res.exit_code == 0, res.stderr
    assert "Autoscaling" in res.stdout and "GPU-hours" in res.stdout


def test_same_seed_same_bytes(cli, scaled):
    a = cli("run", "--scenario", scaled, "--format", "json")
    b = cli("run", "--scenario", scaled, "--format", "json")
    assert a.exit_code == 0 and a.stdout == b.stdout


def test_flags_turn_it_on_and_override(cli, small_scenario):
    doc = run_json(cli, "--scenario", small_scenario, "--autoscaler", "queue-depth",
                   "--max-instances", "2", "--autoscaler-interval", "0.5",
                   "--load-bandwidth", "1", "--instance-startup", "0.25")
    a = doc["autoscaling"]
    assert (a["policy"], a["max_instances"], a["interval_us"]) == ("queue-depth", 2, 500_000)
    assert doc["num_instances"] == 2
    # Llama 3.1 8B's ~16 GB of bf16 weights at 1 GB/s after a 0.25 s start-up
    assert 16_250_000 < a["loading_delay_us"] < 16_750_000


@pytest.mark.parametrize("args, flag, problem", [
    (("--min-instances", "3", "--max-instances", "2"), "--min-instances", "above max_instances"),
    (("--autoscaler-interval", "0"), "--autoscaler-interval", "must be > 0"),
    (("--autoscaler", "nope"), "--autoscaler", "unknown autoscaling policy 'nope'"),
])
def test_bad_input_is_one_located_line(cli, scaled, args, flag, problem):
    res = cli("run", "--scenario", scaled, *args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and problem in lines[0]


def test_bad_scenario_key_names_file_line_and_key(cli, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(AUTOSCALED.replace("max_instances: 3", "max_instances: 3\n    initial_instances: 5"))
    res = cli("run", "--scenario", p)
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert "bad.yaml:" in line and "cluster.autoscaler.initial_instances" in line
    assert "outside [min_instances 1, max_instances 3]" in line


PD_SCALED = SMALL_SCENARIO + """\
cluster:
  num_instances: 2
  routing: {policy: least-loaded}
  autoscaler:
    policy: queue-depth
    interval_s: 0.2
    load_bandwidth_gbps: null
    startup_s: 0.1
    params: {target_per_instance: 1, scale_down_stabilization_s: 0.4}
disaggregation:
  prefill_instances: 1
  decode_instances: 1
  decider: {policy: always}
  transfer: {kv_bytes_per_token: 131072}
"""


def test_pd_pools_scale_from_flags(cli, tmp_path):
    """The pool flags set each pool's bounds; the JSON section has one row per pool and the
    per-pool set-up and GPU-hours, which add up to the total."""
    p = tmp_path / "pd.yaml"
    p.write_text(PD_SCALED)
    doc = run_json(cli, "--scenario", p, "--prefill-max-instances", "3",
                   "--decode-max-instances", "2", "--decode-initial-instances", "2")
    a = doc["autoscaling"]
    pools = {q["name"]: q for q in a["pools"]}
    assert (pools["prefill"]["max_instances"], pools["decode"]["initial_instances"]) == (3, 2)
    assert (a["min_instances"], a["max_instances"]) == (2, 5)
    assert [(c["pool"], c["serving"]) for c in a["instance_count"][:2]] == [("prefill", 1), ("decode", 2)]
    assert math.isclose(sum(q["gpu_hours"] for q in pools.values()), a["gpu_hours"])
    assert a["intervals"][0]["instances_by_pool"] == {"prefill": 1, "decode": 2}


@pytest.mark.parametrize("args,flag,problem", [
    (("--max-instances", "3"), "--max-instances", "pools.prefill.max_instances"),
    (("--num-instances", "3"), "--num-instances", "outside them is not supported"),
    (("--min-instances", "1"), "--min-instances", "pools.prefill.min_instances"),   # even the default
])
def test_pd_pools_refuse_the_one_pool_keys(cli, tmp_path, args, flag, problem):
    p = tmp_path / "pd.yaml"
    p.write_text(PD_SCALED)
    res = cli("run", "--scenario", p, "--prefill-max-instances", "2", *args)
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and flag in line and problem in line


def test_pool_flags_need_pools(cli, scaled):
    res = cli("run", "--scenario", scaled, "--decode-max-instances", "2")
    assert res.exit_code == 2
    assert "--decode-max-instances: needs prefill/decode pools" in res.stderr


PLUGIN = '''
from blis_simpy.autoscaling import AutoscalePolicy

class Always(AutoscalePolicy, name="test-always-max"):
    def desired(self, state):
        return state.pool("").max_instances

class Broken(AutoscalePolicy, name="test-broken-scaler"):
    def desired(self, state):
        return "many"
'''


def test_plugin_policy_from_a_scenario_file(cli, tmp_path):
    (tmp_path / "my_scaler.py").write_text(PLUGIN)
    p = tmp_path / "plug.yaml"
    p.write_text("plugins: [my_scaler]\n" + AUTOSCALED.replace("policy: queue-depth",
                                                               "policy: test-always-max").replace(
        "params: {target_per_instance: 1, scale_down_stabilization_s: 0.4}", "params: {}"))
    doc = run_json(cli, "--scenario", p, "--allow-plugins")
    a = doc["autoscaling"]
    # at the first decision (0.2 s) both others start; ready 0.1 s later
    assert a["instance_count"][:3] == [
        {"t_us": 0, "pool": "", "serving": 1, "loading": 0, "draining": 0},
        {"t_us": 200_000, "pool": "", "serving": 1, "loading": 2, "draining": 0},
        {"t_us": 300_000, "pool": "", "serving": 3, "loading": 0, "draining": 0}]
    p.write_text(p.read_text().replace("test-always-max", "test-broken-scaler"))
    res = cli("run", "--scenario", p, "--allow-plugins")
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "test-broken-scaler" in line and "'many' (str)" in line and "cluster.autoscaler.policy" in line


def test_timeline_state_column_and_the_report_figure(cli, scaled, tmp_path):
    tl = tmp_path / "tl.csv"
    res = cli("run", "--scenario", scaled, "--timeline", tl, "--timeline-interval-ms", "10")
    assert res.exit_code == 0, res.stderr
    header, first = tl.read_text().splitlines()[:2]
    assert header.endswith(",steps,state")
    assert first.endswith(",serving")            # instance_0 serves from 0
    inp = load_input(str(tl))
    fig = figures.autoscale_figure(inp)
    assert fig is not None and figures.has_data(fig)
    assert [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()] == [
        "instances", "requests (all instances)"]
    names = [s.name for s in figures.build_figures([inp])]
    assert "autoscaling_tl" in names
    out = tmp_path / "rep"
    res = cli("report", tl, "--out", out)
    assert res.exit_code == 0, res.stderr
    assert (out / "figures" / "autoscaling_tl.png").stat().st_size > 0


def test_the_figure_draws_each_pool(cli, tmp_path):
    """With prefill/decode pools the figure adds each pool's serving instances and queue depth,
    counted from the timeline's rows of that role."""
    import csv

    from blis_simpy.report.autoscale_figure import autoscale_series, pool_series
    p = tmp_path / "pd.yaml"
    p.write_text(PD_SCALED)
    tl = tmp_path / "tl.csv"
    res = cli("run", "--scenario", p, "--decode-max-instances", "2", "--decode-initial-instances",
              "2", "--timeline", tl, "--timeline-interval-ms", "10")
    assert res.exit_code == 0, res.stderr
    inp = load_input(str(tl))
    ts = autoscale_series(inp)[0]
    pools = pool_series(inp, ts)
    rows = list(csv.DictReader(tl.read_text().splitlines()))
    for role in ("prefill", "decode"):
        serving, waiting = pools[role]
        k = len(ts) // 2
        mine = [r for r in rows if int(r["t_us"]) == ts[k] and r["role"] == role]
        assert serving[k] == sum(r["state"] == "serving" for r in mine)
        assert waiting[k] == sum(int(r["waiting"]) for r in mine)
    assert pools["decode"][0][0] == 2 and pools["prefill"][0][0] == 1
    labels = figures.autoscale_figure(inp).axes[0].get_legend_handles_labels()[1]
    assert "prefill serving" in labels and "decode serving" in labels


def test_fixed_runs_have_no_state_column(cli, small_scenario, tmp_path):
    tl = tmp_path / "tl.csv"
    assert cli("run", "--scenario", small_scenario, "--timeline", tl).exit_code == 0
    assert tl.read_text().splitlines()[0].endswith(",steps")
    assert figures.autoscale_figure(load_input(str(tl))) is None


def test_loading_delay_from_the_weight_bytes_by_hand(tmp_path):
    """A tiny dense model: hidden 64, 4 heads (head dim 16), 4 KV heads, 2 layers, MLP 128,
    vocab 1000, untied, bf16. BLIS's count: embeddings 1000 x 64 = 64 000; per layer
    attention 64 x (64 + 2 x 64) + 64 x 64 = 16 384, MLP 3 x 64 x 128 = 24 576, norms 128;
    2 layers = 82 176; LM head 64 000; final norm 64: 210 240 parameters, 420 480 bytes.
    At 0.001 GB/s (10^6 B/s) that is 420 480 us, plus a 0.5 s start-up."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
           "intermediate_size": 128, "vocab_size": 1000, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sc = Scenario.model_validate({
        "model": "tiny/llama", "model_config_folder": str(tmp_path),
        "latency": {"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1, 1, 1]},
        "engine": {"total_kv_blocks": 100},
        "cluster": {"autoscaler": {"max_instances": 2, "load_bandwidth_gbps": 0.001,
                                   "startup_s": 0.5}}})
    assert loading_delay_us(sc, resolve(sc, quiet=True)) == 500_000 + 420_480
    assert math.isclose(420_480 / 1e6, 420_480 / (0.001 * 1e9))


def test_streaming_metrics_keep_no_per_interval_attainment(cli, scaled):
    a = run_json(cli, "--scenario", scaled, "--streaming-metrics")["autoscaling"]
    assert sum(r["arrived"] for r in a["intervals"]) == 24
    assert {r["attainment_pct"] for r in a["intervals"]} == {None}
    assert a["gpu_hours"] > 0


def test_sweep_and_plan_rows_carry_the_gpu_hours(scaled):
    from blis_simpy.config.loader import load_scenario
    from blis_simpy.run.point import run_point
    sc = load_scenario(str(scaled)).model_dump(mode="json")
    row = run_point({"command": "run", "scenario": sc})
    assert row["status"] == "ok", row["error"]
    assert row["autoscaling.gpu_hours"] > 0 and row["autoscaling.policy"] == "queue-depth"
    assert json.loads(row["autoscaling.instance_count"])[0]["serving"] == 1


def test_max_instances_times_dp_is_capped(cli, scaled):
    res = cli("run", "--scenario", scaled, "--max-instances", "4096", "--dp", "2")
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and "--max-instances" in line and "8192 engine ranks" in line
