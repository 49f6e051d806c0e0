"""Sweep dataset part files stay readable by any Parquet reader (docs/planning.md)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds

from blis_simpy.planner.dataset import DatasetWriter, read, summarize


def test_parts_with_only_null_metrics_unify_with_the_others(tmp_path):
    """A part whose points all failed (or finished nothing: latencies null) is written with
    float64 metric columns, so pyarrow.dataset, as the docs show it, reads every part; an
    integer count in another part casts to it."""
    with DatasetWriter(str(tmp_path), flush_s=1e9) as w:
        w.add({"config_hash": "a", "config_key": "k1", "status": "error", "wall_s": None,
               "m.completed_requests": None, "m.ttft_p99_ms": None})
        w.flush()
        w.add({"config_hash": "b", "config_key": "k2", "status": "ok", "wall_s": 0.5,
               "m.completed_requests": 12, "m.ttft_p99_ms": 41.5})
    files = sorted(tmp_path.glob("part-*.parquet"))
    assert len(files) == 2
    t = ds.dataset(str(tmp_path), format="parquet").to_table()
    rows = sorted(t.to_pylist(), key=lambda r: r["config_hash"])
    assert rows == [
        {"config_hash": "a", "config_key": "k1", "status": "error", "wall_s": None,
         "m.completed_requests": None,
         "m.ttft_p99_ms": None},
        {"config_hash": "b", "config_key": "k2", "status": "ok", "wall_s": 0.5,
         "m.completed_requests": 12,
         "m.ttft_p99_ms": 41.5}]
    assert read(str(tmp_path)).num_rows == 2


def _rows():
    """Six points (two rates x three seeds) as dataset rows; TTFT values whose 95 % CI differs
    in the last digit when summed in another order."""
    ttft = {1: 55.76, 2: 80.06, 3: 56.88}
    return [{"config_hash": f"h{rate}-{seed}", "config_key": f"k{rate}", "seed": seed,
             "command": "run", "workload.rate": rate, "status": "ok", "error": "",
             "wall_s": 0.1, "m.ttft_p99_ms": ttft[seed] + rate}
            for rate in (4.0, 8.0) for seed in (1, 2, 3)]


def _write(path, rows):
    with DatasetWriter(str(path), flush_s=1e9) as w:
        for i, r in enumerate(rows):
            w.add(r)
            if i == 2:
                w.flush()


def test_read_and_summary_do_not_depend_on_completion_order(tmp_path):
    """Part files hold rows in completion order (it depends on the workers); read() gives
    them sorted by axis values then seed, and the summary's CI is computed in seed order,
    so a sweep run on 1 or 2 workers reads and prints the same."""
    rows = _rows()
    _write(tmp_path / "a", rows)
    _write(tmp_path / "b", [rows[i] for i in (4, 0, 5, 2, 1, 3)])
    a, b = read(str(tmp_path / "a")), read(str(tmp_path / "b"))
    assert [r["config_hash"] for r in b.to_pylist()] == [r["config_hash"] for r in rows]
    assert a.equals(b)
    swapped = pa.Table.from_pylist([rows[i] for i in (2, 1, 0, 5, 3, 4)])
    assert summarize(swapped) == summarize(pa.Table.from_pylist(rows))


def _part(path, name, table):
    import pyarrow.parquet as pq
    path.mkdir(exist_ok=True)
    pq.write_table(table, str(path / f"part-{name}.parquet"))


def test_bad_part_files_are_one_config_error_not_an_arrow_error(tmp_path):
    """Found by fuzzing `sweep --summary` and `report`: a part file with no rows made take([])
    an ArrowNotImplementedError (null-typed indices), parts whose columns cannot merge an
    ArrowTypeError, and a non-text config_hash a TypeError: each was an internal error
    (exit 1). An empty part reads as no rows; the others are ConfigErrors naming the folder."""
    import pytest

    from blis_simpy.errors import ConfigError
    good = pa.Table.from_pylist(_rows())
    _part(tmp_path / "empty", "a", good.slice(0, 0))
    assert read(str(tmp_path / "empty")).num_rows == 0
    assert summarize(read(str(tmp_path / "empty")))["points"] == 0
    _part(tmp_path / "clash", "a", good)
    i = good.schema.get_field_index("workload.rate")
    _part(tmp_path / "clash", "b", good.set_column(i, "workload.rate", pa.array([[1]] * good.num_rows)))
    with pytest.raises(ConfigError, match="part files do not agree: .*workload.rate") as ei:
        read(str(tmp_path / "clash"))
    assert ei.value.file == str(tmp_path / "clash")
    i = good.schema.get_field_index("config_hash")
    _part(tmp_path / "hash", "a", good.set_column(i, "config_hash", pa.array([[1]] * good.num_rows)))
    with pytest.raises(ConfigError, match=r"column config_hash is list<element: int64>, not text"):
        read(str(tmp_path / "hash"))
