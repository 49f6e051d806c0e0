"""The run layer directly: prepare → RunDescription, execute → Outcome, run_point → row.

One request worked out by hand (blackbox, docs/latency-models.md; the same case as
tests/engine/test_engine_exact.py): queueing 100 + 1.0·32 = 132 µs; step 1 prefills 32
tokens in 1000 + 10·32 = 1320 µs, so TTFT = 132 + 1320 + 50 (α2) = 1502 µs; two decode
steps of 1000 + 5 = 1005 µs, ITL 1055 µs, E2E = 1502 + 2·1055 = 3612 µs.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from blis_simpy import run
from blis_simpy.config.scenario import TraceWorkload
from blis_simpy.errors import ConfigError
from blis_simpy.run.describe import PluginsRefused
from blis_simpy.run.point import run_point
from tests.cli.support import trace_row, write_trace_files

#: the tiny scenario, as data (written to a file by the fixture)
DATA = {"seed": 7, "model": "meta-llama/llama-3.1-8b-instruct",
        "latency": {"model": "blackbox", "alpha_coeffs": [100.0, 1.0, 50.0],
                    "beta_coeffs": [1000.0, 10.0, 5.0]},
        "engine": {"total_kv_blocks": 1000, "max_num_running_reqs": 8}}
SCENARIO = yaml.safe_dump(DATA, sort_keys=False, default_flow_style=None)


@pytest.fixture
def tiny(tmp_path):
    """A scenario file and the overrides that give it a one-request trace."""
    h, d = write_trace_files(tmp_path, [trace_row(0, 0, 32, 3)])
    path = tmp_path / "tiny.yaml"
    path.write_text(SCENARIO)
    return str(path), {"workload": {"kind": "trace", "header": str(h), "data": str(d)}}


def test_prepare_applies_overrides_keyed_by_scenario_paths(tiny):
    path, trace = tiny
    d = run.prepare(path, {**trace, "engine.max_num_running_reqs": 64}, mode="replay")
    assert d.scenario.engine.max_num_running_reqs == 64
    assert d.scenario.engine.total_kv_blocks == 1000          # the file's, untouched
    assert isinstance(d.scenario.workload, TraceWorkload)
    assert d.overridden == {"workload", "engine.max_num_running_reqs"}
    assert d.mode == "replay" and d.src.path == path
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.mode = "run"


def test_prepare_locates_errors_at_the_file_line_or_the_overridden_key(tiny):
    path, trace = tiny
    bad = SCENARIO.replace("max_num_running_reqs: 8", "max_num_running_reqs: -1")
    with open(path, "w") as f:
        f.write(bad)
    with pytest.raises(ConfigError) as e:     # written in the file: FILE:LINE
        run.prepare(path, trace, mode="replay")
    line = 1 + next(i for i, t in enumerate(bad.splitlines()) if "max_num_running_reqs" in t)
    assert (e.value.file, e.value.line, e.value.field) == (path, line, "engine.max_num_running_reqs")
    with pytest.raises(ConfigError) as e:     # set by an override: the key, no line
        run.prepare(path, {**trace, "engine.max_num_running_reqs": -2}, mode="replay")
    assert (e.value.file, e.value.line, e.value.field) == (None, None, "engine.max_num_running_reqs")


def test_prepare_refuses_plugins_without_the_opt_in(tiny):
    path, trace = tiny
    data = {"plugins": ["no_such_plugin_module"], "model": "meta-llama/llama-3.1-8b-instruct"}
    with pytest.raises(PluginsRefused) as e:
        run.prepare(data)
    assert e.value.modules == ["no_such_plugin_module"] and e.value.field == "plugins"
    pending = run.prepare(data, validate_only=True)
    assert pending.pending_plugins == ("no_such_plugin_module",)


def test_replay_needs_a_trace(tiny):
    path, _ = tiny
    with pytest.raises(ConfigError) as e:
        run.prepare(path, mode="replay")
    assert e.value.field == "workload.kind"
    assert run.prepare(path, mode="replay", need_trace=False).mode == "replay"


def test_execute_gives_the_hand_worked_times(tiny):
    path, trace = tiny
    out = run.execute(run.prepare(path, trace, mode="replay"))
    c = out.report.cluster
    assert c.ttft == {"request_0": 1502}
    assert c.e2e == {"request_0": 3612}
    assert c.itl == {"request_0": 1055.0}
    assert c.completed_requests == 1 and len(out.requests) == 1
    assert out.report.is_replay and not out.interrupted
    assert out.report.total_kv_blocks == 1000


def test_execute_fitness_follows_the_outputs(tiny):
    path, trace = tiny
    weights = {**trace, "fitness_weights": {"mean_ttft": 1.0}}
    with_fitness = run.execute(run.prepare(path, weights, mode="replay"))
    assert with_fitness.report.fitness is not None
    without = run.execute(run.prepare(path, weights, mode="replay",
                                      outputs=run.Outputs(fitness=False)))
    assert without.report.fitness is None


def test_execute_writes_the_rows_file_it_was_asked_for(tiny, tmp_path):
    path, trace = tiny
    rows = tmp_path / "rows.jsonl"
    run.execute(run.prepare(path, trace, mode="replay",
                            outputs=run.Outputs(requests_out=str(rows))))
    lines = rows.read_text().splitlines()
    assert len(lines) == 1 and '"ttft_ms":1.502' in lines[0].replace(" ", "")


def test_simulate_runs_requests_a_caller_built(tiny):
    from blis_simpy.run.workload import build_requests
    path, trace = tiny
    d = run.prepare(path, trace, mode="replay")
    requests, _ = build_requests(d)
    seen = []
    sim, result = run.simulate(d.scenario, requests, attach=seen.append)
    assert seen == [sim]
    assert result.instances[0].ttft == {"request_0": 1502}
    assert result.instances[0].e2e == {"request_0": 3612}


def test_run_point_row(tiny):
    path, trace = tiny
    from blis_simpy.config.loader import load_raw
    data, _ = load_raw(path)
    data.update(trace)
    row = run_point({"command": "replay", "scenario": data})
    assert row["status"] == "ok" and row["error"] == ""
    assert row["m.ttft_mean_ms"] == 1.502 and row["m.e2e_mean_ms"] == 3.612
    assert row["m.completed_requests"] == 1
    assert len(row["config_hash"]) == 64 and row["wall_s"] > 0
    assert data["workload"]["kind"] == "trace"    # the job is not edited


def test_run_point_error_row_names_the_scenario_key():
    row = run_point({"command": "run", "scenario": {"tp": "x"}})
    assert row["status"] == "error"
    assert row["error"].startswith("tp: ")
    refused = run_point({"command": "run", "scenario": {"plugins": ["x_mod"]}})
    assert refused["status"] == "error" and "'x_mod'" in refused["error"]
