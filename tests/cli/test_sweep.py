"""``blis-simpy sweep``: a real Dask LocalCluster (2 worker processes) runs sweep points into a
Parquet dataset; every row equals the same scenario run directly; resume runs only what is
missing; failed points keep their error; the 95 % CIs are Student's t; bad sweep files are one
located line and exit 2. One cluster serves the whole module."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest
import yaml
from scipy import stats

from blis_simpy.cli import runner
from blis_simpy.cli.sweep_cmd import run_sweep
from blis_simpy.metrics.report import report_dict
from blis_simpy.planner import dataset
from blis_simpy.planner.executor import Executor
from blis_simpy.planner.sweep_points import config_hash, resolved
from blis_simpy.run.point import run_point

from .support import LOCATED, SMALL_SCENARIO, trace_row, write_trace_files

BASE = yaml.safe_load(SMALL_SCENARIO)
BASE["workload"]["num_requests"] = 200


@pytest.fixture(scope="module")
def ex():
    with Executor(n_workers=2) as e:
        assert e.n_workers == 2
        yield e


def write_sweep(folder: Path, body: str, base: dict | None = None) -> Path:
    (folder / "base.yaml").write_text(yaml.safe_dump(base if base is not None else BASE))
    p = folder / "sweep.yaml"
    p.write_text(body)
    return p


def direct(scenario: dict, command: str = "run") -> dict:
    """The report document of one scenario run with the runner, in this process."""
    plan = runner.prepare(command, {}, data=copy.deepcopy(scenario))
    return report_dict(runner.execute(plan).report)


def rows_by_hash(out: Path) -> dict[str, dict]:
    return {r["config_hash"]: r for r in dataset.read(str(out)).to_pylist()}


SIX = """\
base: base.yaml
axes:
  workload.rate: [10, 20, 40]
  cluster.num_instances: [1, 2]
seeds: [7]
"""


def test_every_row_equals_the_direct_run(tmp_path, ex):
    path = write_sweep(tmp_path, SIX)
    stats_ = run_sweep(str(path), str(tmp_path / "out"), executor=ex)
    assert stats_ | {"wall_s": 0} == {"points": 6, "skipped": 0, "run": 6, "failed": 0,
                                      "first_error": "", "wall_s": 0}
    rows = dataset.read(str(tmp_path / "out")).to_pylist()
    assert sorted((r["workload.rate"], r["cluster.num_instances"]) for r in rows) == [
        (10.0, 1), (10.0, 2), (20.0, 1), (20.0, 2), (40.0, 1), (40.0, 2)]
    for r in rows:
        scenario = copy.deepcopy(BASE)
        scenario["workload"]["rate"] = r["workload.rate"]
        scenario["cluster"] = {"num_instances": r["cluster.num_instances"]}
        scenario["seed"] = 7
        assert r["seed"] == 7 and r["status"] == "ok" and r["error"] == "" and r["wall_s"] > 0
        assert r["config_hash"] == config_hash("run", resolved(scenario))
        assert json.loads(r["config"]) == resolved(scenario)
        cluster = direct(scenario)["cluster"]
        metrics = {k: v for k, v in r.items() if k.startswith("m.")}
        assert metrics == {f"m.{k}": v for k, v in cluster.items() if k != "instance_id"}
        assert r["m.completed_requests"] == 200
    # the configurations differ: six distinct hashes, six distinct config keys (one seed each)
    assert len({r["config_hash"] for r in rows}) == len({r["config_key"] for r in rows}) == 6


#: config hashes of datasets written while blackbox was the scenario default (the values then)
BLACKBOX_HASH = "1d6b660ce26f894e8a7e5c52b6d90e7f206d350d3b029d2fd1d396a6457e10a7"
PHYSICS_HASH = "078669dbd1883ac7d574f414ad8145c1ce46791246fbeab78ce2e9260351f766"


@pytest.mark.parametrize("latency, want", [
    ({"model": "blackbox"}, BLACKBOX_HASH),
    ({"model": "physics"}, PHYSICS_HASH),
    (None, PHYSICS_HASH),                      # no latency key: physics, the default now
], ids=["blackbox", "physics", "default"])
def test_a_hash_names_the_backend_it_ran_across_the_default_change(latency, want):
    # a physics point must not take the hash blackbox points had (resumed as done: the
    # blackbox numbers reported as physics), nor a blackbox point get a new one (run again)
    assert config_hash("run", resolved({} if latency is None else {"latency": latency})) == want


def test_resume_runs_only_the_missing_points(tmp_path, ex):
    out = tmp_path / "out"
    path = write_sweep(tmp_path, SIX)
    first = run_sweep(str(path), str(out), executor=ex, flush_s=0)   # one part file per point
    parts = dataset.part_files(str(out))
    assert first["run"] == 6 and len(parts) == 6
    full = rows_by_hash(out)
    gone = {r["config_hash"] for p in parts[:2] for r in dataset.read_part(p)}
    for p in parts[:2]:
        os.unlink(p)
    again = run_sweep(str(path), str(out), executor=ex)
    assert (again["skipped"], again["run"], again["failed"]) == (4, 2, 0)
    after = rows_by_hash(out)
    assert after.keys() == full.keys() and len(gone) == 2
    for h, r in full.items():       # identical metrics; only the wall time is the rerun's own
        assert {k: v for k, v in after[h].items() if k != "wall_s"} == \
            {k: v for k, v in r.items() if k != "wall_s"}
    # a larger sweep in the same directory runs only its new points
    bigger = write_sweep(tmp_path, SIX.replace("[10, 20, 40]", "[10, 20, 40, 80]"))
    more = run_sweep(str(bigger), str(out), executor=ex)
    assert (more["skipped"], more["run"]) == (6, 2)
    assert len(dataset.read(str(out))) == 8


def test_an_integer_axis_given_a_float_value_keeps_the_dataset_readable(tmp_path, ex):
    """Rates [10, 20, 40] write an int64 column; resumed with 25.5 added, the old parts are
    promoted to float64: pyarrow.dataset (the first file's schema) read the directory as int64
    and failed on 25.5 ("truncated converting to int64") before. Only the new points run."""
    import pyarrow.dataset as pads
    out = tmp_path / "out"
    run_sweep(str(write_sweep(tmp_path, SIX)), str(out), executor=ex)
    more = run_sweep(str(write_sweep(tmp_path, SIX.replace("40]", "40, 25.5]"))), str(out), executor=ex)
    assert (more["skipped"], more["run"]) == (6, 2)
    table = pads.dataset(str(out), format="parquet").to_table()
    assert str(table.schema.field("workload.rate").type) == "double"
    assert sorted(table.column("workload.rate").to_pylist()) == [10.0, 10.0, 20.0, 20.0, 25.5, 25.5, 40.0, 40.0]
    assert table.num_rows == len(set(table.column("config_hash").to_pylist())) == 8


def test_a_failed_point_is_recorded_then_rerun(tmp_path, ex):
    """A replay point whose trace data file is missing passes validation, fails when it runs:
    its row has the error; once the file exists, a rerun runs that point alone."""
    good_h, good_d = write_trace_files(tmp_path, [trace_row(i, 50_000 * i, 120, 10) for i in range(8)])
    base = {k: v for k, v in BASE.items() if k != "workload"}
    base["workload"] = {"kind": "trace", "header": good_h.name, "data": good_d.name}
    path = write_sweep(tmp_path, "base: base.yaml\ncommand: replay\naxes:\n"
                                 "  workload.data: [trace.csv, later.csv]\n", base)
    out = tmp_path / "out"
    first = run_sweep(str(path), str(out), executor=ex)
    assert (first["run"], first["failed"]) == (2, 1)
    later = str(tmp_path / "later.csv")
    assert first["first_error"] == f"workload.data: no such file: {later}"
    rows = {r["workload.data"]: r for r in dataset.read(str(out)).to_pylist()}
    assert rows["later.csv"]["status"] == "error" and rows["later.csv"]["m.completed_requests"] is None
    assert rows["trace.csv"]["status"] == "ok" and rows["trace.csv"]["m.completed_requests"] == 8
    summary = dataset.summarize(dataset.read(str(out)))
    assert (summary["ok"], summary["failed"]) == (1, 1)
    os.link(good_d, later)
    again = run_sweep(str(path), str(out), executor=ex)
    assert (again["skipped"], again["run"], again["failed"]) == (1, 1, 0)
    rows = {r["workload.data"]: r for r in dataset.read(str(out)).to_pylist()}
    assert len(rows) == 2 and rows["later.csv"]["status"] == "ok"
    assert rows["later.csv"]["m.ttft_p99_ms"] == rows["trace.csv"]["m.ttft_p99_ms"]   # same trace


def test_an_interrupted_map_keeps_what_finished(ex):
    """on_result raising stops the map (the rest is cancelled); the cluster stays usable and
    a raising function gives an error row, not an exception."""
    seen = []

    def stop(i, row):
        seen.append(i)
        if len(seen) == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        ex.map(math.sqrt, [float(i) for i in range(40)], on_result=stop, progress=False)
    assert len(seen) == 2
    out = ex.map(math.sqrt, [4.0, -1.0, 9.0], progress=False)
    assert out[0] == 2.0 and out[2] == 3.0
    assert out[1] == {"status": "error", "error": "ValueError: math domain error", "wall_s": None,
                      "config_hash": None}


def test_run_point_error_row_is_one_line():
    row = run_point({"command": "run", "scenario": {"tp": "x"}})
    assert row["status"] == "error" and row["error"] == "tp: input should be a valid integer, got 'x'"
    assert len(row["config_hash"]) == 64 and row["wall_s"] >= 0


def test_confidence_intervals_over_three_seeds(tmp_path, ex):
    path = write_sweep(tmp_path, "base: base.yaml\naxes:\n  workload.rate: [30]\nrepeats: 3\n")
    run_sweep(str(path), str(tmp_path / "out"), executor=ex)
    table = dataset.read(str(tmp_path / "out"))
    rows = table.to_pylist()
    assert sorted(r["seed"] for r in rows) == [42, 43, 44]   # the base seed, +1, +2
    (cfg,) = dataset.summarize(table)["configs"]
    assert cfg["n"] == 3 and cfg["seeds"] == [42, 43, 44]
    for m in ("m.ttft_p99_ms", "m.e2e_mean_ms", "m.responses_per_sec"):
        vals = [r[m] for r in rows]
        mean = sum(vals) / 3
        half = stats.t.ppf(0.975, 2) * stats.tstd(vals) / math.sqrt(3)
        got = cfg["metrics"][m]
        assert len(set(vals)) == 3     # the seeds give different runs
        assert got["mean"] == pytest.approx(mean, rel=1e-12)
        assert got["ci95_low"] == pytest.approx(mean - half, rel=1e-9)
        assert got["ci95_high"] == pytest.approx(mean + half, rel=1e-9)
    # by hand: [1, 2, 3] -> mean 2, sem 1/sqrt(3), t(0.975, 2) = 4.302652729749464
    mean, lo, hi = dataset.mean_ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and lo == pytest.approx(2 - 4.302652729749464 / math.sqrt(3), rel=1e-12)
    assert hi == pytest.approx(2 + 4.302652729749464 / math.sqrt(3), rel=1e-12)
    assert dataset.mean_ci95([5.0]) == (5.0, None, None)
    assert dataset.mean_ci95([5.0, 5.0]) == (5.0, 5.0, 5.0)


def test_summary_command(tmp_path, ex, cli):
    path = write_sweep(tmp_path, "base: base.yaml\naxes:\n  cluster.num_instances: [1, 2]\nseeds: [1, 2]\n")
    run_sweep(str(path), str(tmp_path / "out"), executor=ex)
    r = cli("sweep", "--summary", str(tmp_path / "out"), "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["points"], doc["ok"], doc["axes"]) == (4, 4, ["cluster.num_instances"])
    assert [c["axes"] for c in doc["configs"]] == [{"cluster.num_instances": 1}, {"cluster.num_instances": 2}]
    r = cli("sweep", "--summary", str(tmp_path / "out"), "--metric", "m.ttft_p99_ms")
    assert r.exit_code == 0 and "TTFT p99 ms" in r.stdout and "num_instances" in r.stdout
    r = cli("sweep", "--summary", str(tmp_path / "out"), "--metric", "ttft_p99_ms")
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: --metric: no such metric in the dataset: "
                        "ttft_p99_ms (did you mean m.ttft_p99_ms or m.ttft_p95_ms or m.ttft_p90_ms?)\n")


# ---------------------------------------------------------------------------- bad input
BAD = [
    ("base: base.yaml\naxes:\n  workload.rate: {range: [1, 5, 1], stepp: 2}\n",
     3, "axes.workload.rate.stepp", "unknown key"),
    ("base: base.yaml\nmode: zip\naxes:\n  tp: [1]\n", 2, "mode", "input should be 'product' or 'list'"),
    ("base: base.yaml\naxes:\n  cluster.num_instances: [1,\n    0]\n", 4,
     "axes.cluster.num_instances[1]", "input should be greater than 0, got 0"),
    ("base: base.yaml\naxes:\n  workload.rat: [1, 2]\n", 3, "axes.workload.rat",
     "unknown scenario key (did you mean workload.rate?)"),
    # unknown keys name the closest known ones, at any depth (the flags did, the YAML did not)
    ("base: base.yaml\nseeds: [1]\nrepeets: 2\n", 3, "repeets", "unknown key (did you mean repeats?)"),
    ("base: {workload: {rat: 1}}\n", 1, "base.workload.rat", "unknown key (did you mean rate?)"),

    ("base: base.yaml\naxes:\n  workload.rate: {range: [1, 1000000, 1]}\n", 3,
     "axes.workload.rate.range", "range has 1,000,000 values, more than a sweep's 100,000 points"),
    ("base: base.yaml\naxes:\n  workload.rate: {range: [1, 1000, 1]}\n  tp: {range: [1, 1000, 1]}\n",
     2, "axes", "1,000,000 configurations, more than a sweep's 100,000 points (fewer axis values, "
                "or split the sweep)"),
    ("base: base.yaml\nmode: list\naxes:\n  tp: [1, 2]\n  dp: [1]\n", 5, "axes.dp",
     "mode list needs axes of equal length: tp has 2 values, dp has 1"),
    ("base: nothere.yaml\n", 1, "base", "no such scenario file"),
    ("base: {workload: {rate: -1}}\n", 1, "base.workload.rate", "input should be greater than 0"),
    ("base: base.yaml\naxes:\n  seed: [1, 2]\n", 3, "axes.seed", "the seed is not an axis"),
    # repeats count up from the base seed: a seed that is not an integer was an internal error
    ("base: {seed: abc}\nrepeats: 2\n", 1, "base.seed", "input should be a valid integer, got 'abc'"),
    # seeds past int64 (only the first point's seed was checked): 'internal error: OverflowError'
    # (exit 1) after the first points ran
    ("base: {seed: 9223372036854775807}\nrepeats: 2\n", 2, "repeats",
     "the last seed, base seed 9223372036854775807 + 1, is out of the int64 range"),
    ("base: base.yaml\nseeds: [1, 9223372036854775808]\n", 2, "seeds[1]",
     "input should be less than or equal to 9223372036854775807"),
    # (1e308 - 1) / 1e-308 is inf: 'internal error: OverflowError' (exit 1) counting the values
    ("base: base.yaml\naxes:\n  workload.rate: {range: [1, 1e308, 1e-308]}\n", 3,
     "axes.workload.rate.range", "range has more values than a sweep's 100,000 points"),
    # integers past int64 ran every point, then could not be written to the int64 column:
    # 'internal error: OverflowError' (exit 1) and an empty --out folder left behind
    ("base: base.yaml\naxes:\n  workload.rate: {range: [1, 10000000000000000000000, 1000000000000000000000]}\n",
     3, "axes.workload.rate.range", "stop (10000000000000000000000) is out of the signed 64-bit integer range"),
    ("base: base.yaml\naxes:\n  workload.rate: [1, 100000000000000000000]\n", 3, "axes.workload.rate[1]",
     "100000000000000000000 is out of the signed 64-bit integer range"),
]


@pytest.mark.parametrize(("body", "line", "field", "problem"), BAD)
def test_bad_sweep_file_is_one_located_line(tmp_path, cli, body, line, field, problem):
    path = write_sweep(tmp_path, body)
    r = cli("sweep", str(path), "--out", str(tmp_path / "out"))
    assert r.exit_code == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1, r.stderr
    m = LOCATED.match(r.stderr.strip())
    assert m, r.stderr
    assert (m["file"], int(m["line"]), m["field"]) == (str(path), line, field)
    assert m["problem"].startswith(problem), m["problem"]
    assert not (tmp_path / "out").exists()     # nothing ran, nothing written


@pytest.mark.parametrize(("option", "problem"), [
    (["--workers", "0"], "--workers: must be in [1, 256], got 0"),
    (["--workers", "-1"], "--workers: must be in [1, 256], got -1"),
    (["--workers", "100000"], "--workers: must be in [1, 256], got 100000"),
    (["--scheduler", "zzz"], "--scheduler: not a Dask scheduler address (tcp://host:8786): "
                             "missing port number in address 'zzz'"),
    (["--scheduler", "tcp://localhost:99999"], "--scheduler: not a Dask scheduler address "
                                               "(tcp://host:8786): the port must be in [1, 65535]"),
])
def test_a_bad_executor_option_is_the_only_line(tmp_path, cli, option, problem):
    """Checked before the sweep file is expanded: no 'N points ... to run' line first."""
    path = write_sweep(tmp_path, SIX)
    r = cli("sweep", str(path), "--out", str(tmp_path / "out"), *option)
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", f"error: {problem}\n")
    assert not (tmp_path / "out").exists()


def test_summary_of_a_missing_dataset(tmp_path, cli):
    r = cli("sweep", "--summary", str(tmp_path / "none"))
    assert r.exit_code == 2 and r.stderr == f"error: {tmp_path / 'none'}: no such dataset\n"
