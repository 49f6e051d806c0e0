"""``--streaming-metrics`` and ``--requests-out`` (docs/metrics.md, "Streaming metrics";
docs/performance.md, "Very long runs"): real runs through the CLI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from blis_simpy.metrics import gojson, sink
from blis_simpy.metrics.percentile import rank_bounds
from blis_simpy.metrics.streaming import RELATIVE_ACCURACY
from blis_simpy.routing import Router, RoutingDecision
from blis_simpy.workload import TraceHeader, TraceRecord, read_trace, trace_requests, write_trace
from blis_simpy.workload.trace_stream import TraceRequestStream

BLACKBOX = ("--model", "meta-llama/llama-3.1-8b-instruct", "--latency-model", "blackbox",
            "--alpha-coeffs", "232.46,1.75,3357.44", "--beta-coeffs", "5752.7,17.25,5.99",
            "--total-kv-blocks", "20000")
N = 2000
OPTIONAL = ("slo_class", "tenant_id", "handled_by", "model")   # omitted keys: Parquet nulls


@pytest.fixture
def failing_router():
    """A router (registered for this test only) that breaks on the 500th request: a run that
    fails half way."""

    class FailsMidRun(Router, name="test-fails-mid-run"):
        def route(self, req, state):
            self.n = getattr(self, "n", 0) + 1
            if self.n == 500:
                raise RuntimeError("router broke")
            s = state.snapshots[self.n % len(state.snapshots)]
            return RoutingDecision(s.index, "rr", {})

    yield FailsMidRun.name
    del Router._registry[FailsMidRun.name]


def _trace(folder: Path, n: int = N) -> tuple[Path, Path]:
    """``n`` requests at 400/s: two SLO classes, two tenants, a model tag on every third, a
    shared prefix on every fourth."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(n):
        t = int(i * 2_500)
        rows.append(TraceRecord(
            request_id=i, slo_class=("batch", "interactive")[i % 2], tenant_id=f"t{i % 3}",
            model="meta-llama/llama-3.1-8b-instruct" if i % 3 == 0 else "",
            prefix_group="sys" if i % 4 == 0 else "", prefix_length=64 if i % 4 == 0 else 0,
            input_tokens=int(rng.integers(50, 400)), output_tokens=int(rng.integers(10, 200)),
            arrival_time_us=t, send_time_us=t))
    write_trace(str(folder / "tr"), TraceHeader(trace_version=2, mode="generated"), rows)
    return folder / "tr.yaml", folder / "tr.csv"


def _replay(cli, h, d, *extra):
    res = cli("replay", *BLACKBOX, "--num-instances", "4", "--trace-header", h, "--trace-data", d,
              "--format", "json", *extra)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def _is_percentile(key: str) -> bool:
    return re.fullmatch(r"(\w+_)?p\d+_ms", key) is not None


def _split(exact, streamed, path=""):
    """Walk both documents: exact-equal leaves besides percentiles; percentile pairs listed."""
    pairs = []
    if isinstance(exact, dict):
        assert list(exact) == [k for k in streamed if k != "streaming_metrics"], path
        for k in exact:
            if _is_percentile(k):
                pairs.append((f"{path}.{k}", exact[k], streamed[k]))
            else:
                pairs += _split(exact[k], streamed[k], f"{path}.{k}")
    elif isinstance(exact, list):
        assert len(exact) == len(streamed), path
        for i, (a, b) in enumerate(zip(exact, streamed, strict=True)):
            pairs += _split(a, b, f"{path}[{i}]")
    else:
        assert exact == streamed, (path, exact, streamed)
    return pairs


def _within(values_us, p: float, got: float) -> bool:
    """The stated guarantee: (1-α)·v_lo <= got <= (1+α)·v_hi for BLIS's rank bounds."""
    v = sorted(values_us)
    lo, hi, _ = rank_bounds(len(v), p)
    return (1 - RELATIVE_ACCURACY) * v[lo] - 1e-9 <= got <= (1 + RELATIVE_ACCURACY) * v[hi] + 1e-9


def test_streaming_equals_exact_counts_and_means_and_bounds_percentiles(cli, tmp_path):
    h, d = _trace(tmp_path)
    exact = _replay(cli, h, d, "--requests-out", tmp_path / "rows.jsonl")
    streamed = _replay(cli, h, d, "--streaming-metrics")
    assert streamed["streaming_metrics"]["relative_accuracy"] == RELATIVE_ACCURACY == 0.01
    assert exact["cluster"]["completed_requests"] == N
    pairs = _split(exact, streamed)
    # every printed percentile (ms): cluster and instances (p50/90/95/99 of 4 latencies), per
    # SLO class and per model (p50/95/99 of TTFT and E2E); ITL stays exact
    assert len(pairs) == 5 * 4 * 4 + 2 * 2 * 3 + 2 * 3
    assert all(a == b for k, a, b in pairs if ".itl_" in k)
    assert any(a != b for _, a, b in pairs)          # the sketch is really what is printed
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    by_inst = {"cluster": rows}
    for r in rows:
        by_inst.setdefault(r["handled_by"], []).append(r)
    for doc in [exact["cluster"]] + exact["instances"]:
        sdoc = (streamed["cluster"] if doc["instance_id"] == "cluster"
                else streamed["instances"][int(doc["instance_id"].split("_")[1])])
        mine = by_inst[doc["instance_id"]]
        for metric in ("ttft", "e2e"):
            vals = [round(r[f"{metric}_ms"] * 1000) for r in mine]
            for p in (50, 90, 95, 99):
                assert _within(vals, p, sdoc[f"{metric}_p{p}_ms"] * 1000), (doc["instance_id"], metric, p)
        sched = [round(r["scheduling_delay_ms"] * 1000) for r in mine]
        for p in (50, 90, 95, 99):
            assert _within(sched, p, sdoc[f"scheduling_delay_p{p}_ms"] * 1000)
    for cls, dists in streamed["per_slo"].items():
        mine = [r for r in rows if r["slo_class"] == cls]
        for metric in ("ttft", "e2e"):
            vals = [round(r[f"{metric}_ms"] * 1000) for r in mine]
            for p in (50, 95, 99):
                assert _within(vals, p, dists[metric][f"p{p}_ms"] * 1000), (cls, metric, p)
    # the text layout says the percentiles are approximate
    res = cli("replay", *BLACKBOX, "--trace-header", h, "--trace-data", d, "--format", "blis",
              "--streaming-metrics")
    assert res.exit_code == 0 and "relative accuracy 0.01" in res.stdout.splitlines()[-1]


def _nulls(row: dict) -> dict:
    """A results-file row as our rows file has it: absent latencies (BLIS's 0) are null. Every
    latency a request has is > 0 here (steps last >= 1 us; these requests queue first)."""
    return {k: (None if k.endswith("_ms") and v == 0 else v) for k, v in row.items()}


def test_requests_out_rows_are_the_results_rows(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(sink, "ROW_GROUP_ROWS", 100)
    h, d = _trace(tmp_path, 450)
    sc = tmp_path / "sc.yaml"
    sc.write_text(f"workload:\n  kind: trace\n  header: {h}\n  data: {d}\nhorizon_us: 1000000\n")
    common = ("run", "--scenario", sc, *BLACKBOX, "--num-instances", "2", "--format", "json")
    res = cli(*common, "--results-path", tmp_path / "res.json", "--requests-out", tmp_path / "a.jsonl")
    assert res.exit_code == 0, res.stderr
    results = json.loads((tmp_path / "res.json").read_text())["requests"]
    assert 0 < sum(r["e2e_ms"] > 0 for r in results) < len(results)   # some cut by the horizon
    # exact metrics: the same rows, in the same order, the same bytes as the results file's,
    # except that a latency the request does not have is null, not BLIS's 0
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert lines == [gojson.dumps(_nulls(r), indent=None) for r in results]
    assert sum('"e2e_ms":null' in x for x in lines) == sum(r["e2e_ms"] == 0 for r in results) > 0
    results = [_nulls(r) for r in results]
    # streaming: the rows arrive in completion order; the same set, the same values
    res = cli(*common, "--streaming-metrics", "--requests-out", tmp_path / "b.jsonl")
    assert res.exit_code == 0, res.stderr
    streamed = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert sorted(streamed, key=lambda r: r["requestID"]) == sorted(results, key=lambda r: r["requestID"])
    assert [r["requestID"] for r in streamed] != [r["requestID"] for r in results]
    # Parquet, in row groups of ROW_GROUP_ROWS; omitted keys are nulls (length_capped false)
    res = cli(*common, "--streaming-metrics", "--requests-out", tmp_path / "c.parquet")
    assert res.exit_code == 0, res.stderr
    f = pq.ParquetFile(tmp_path / "c.parquet")
    assert f.metadata.num_row_groups == math.ceil(len(results) / 100)
    table = f.read().to_pylist()
    back = [{k: v for k, v in r.items() if not (v is None and k in OPTIONAL)
             and not (k == "length_capped" and v is False)} for r in table]
    assert sorted(back, key=lambda r: r["requestID"]) == sorted(results, key=lambda r: r["requestID"])
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_no_rows_file_when_the_run_fails(cli, tmp_path, failing_router):
    h, d = _trace(tmp_path, 800)
    sc = tmp_path / "sc.yaml"
    sc.write_text(f"cluster:\n  num_instances: 2\n  routing:\n    policy: {failing_router}\n"
                  f"workload:\n  kind: trace\n  header: {h}\n  data: {d}\n")
    old = tmp_path / "old.jsonl"
    old.write_text("an earlier file\n")
    for target, mode in ((tmp_path / "rows.parquet", "--streaming-metrics"), (old, "--log=warn")):
        res = cli("replay", "--scenario", sc, *BLACKBOX, "--requests-out", target, mode)
        assert res.exit_code == 2       # the plugin's error, located at the key that chose it
        assert res.stderr.startswith(f"error: {sc}:4: cluster.routing.policy: routing policy "
                                     "'test-fails-mid-run' (")
        assert res.stderr.endswith("failed: route() raised RuntimeError: router broke\n")
    assert not (tmp_path / "rows.parquet").exists()
    assert old.read_text() == "an earlier file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.jsonl", "sc.yaml", "tr.csv", "tr.yaml"]


@pytest.mark.parametrize("extra, problem", [
    (("--requests-out", "rows.csv"), "--requests-out: unknown suffix '.csv'"),
    (("--streaming-metrics", "--results-path", "r.json"), "--results-path: cannot be combined"),
])
def test_refused_combinations(cli, tmp_path, extra, problem):
    h, d = _trace(tmp_path, 20)
    res = cli("replay", *BLACKBOX, "--trace-header", h, "--trace-data", d, *extra)
    assert res.exit_code == 2 and problem in res.stderr and len(res.stderr.splitlines()) == 1
    assert not any(p.suffix in (".csv", ".json", ".tmp") and p.name != "tr.csv" for p in tmp_path.iterdir())


def test_trace_stream_gives_replays_requests(tmp_path):
    h, d = _trace(tmp_path, 700)                   # 700 rows: three draw blocks
    stream = TraceRequestStream(d, seed=11)
    assert stream.sorted and len(stream) == 700 and stream.last_arrival_us == 699 * 2_500
    want = trace_requests(read_trace(h, d).records, 11)
    got = list(stream)
    assert [r.id for r in got] == [r.id for r in want]
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(got, want, strict=True))
    assert stream.count_arriving_after(2_500 * 690) == 9
    # rows out of arrival order: replay sorts them, the stream says it cannot
    lines = d.read_text().splitlines()
    d.write_text("\n".join([lines[0], lines[2], lines[1]] + lines[3:]) + "\n")
    assert not TraceRequestStream(d, seed=11).sorted
