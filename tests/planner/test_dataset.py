"""Sweep dataset part files stay readable by any Parquet reader (docs/planning.md)."""

from __future__ import annotations

import pyarrow.dataset as ds

from blis_simpy.planner.dataset import DatasetWriter, read


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
