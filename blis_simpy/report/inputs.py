"""The inputs of ``blis-simpy report``, recognised by what they hold (docs/planning.md, "Reports").

* a **results file**: ``run --results-path`` JSON (a MetricsOutput object whose ``requests``
  rows hold ``ttft_ms``, ``itl_ms``, ``e2e_ms``), ``replay --results-path`` JSON (an array of
  ``{request_id, ttft_us, e2e_us, ...}``), or a ``--requests-out`` rows file (``.jsonl`` /
  ``.parquet`` with ``requestID`` and ``ttft_ms``). Latencies of completed requests only:
  TTFT and E2E where > 0, ITL (the request's mean inter-token latency) where > 0 and the
  request has more than one output token;
* a **timeline**: a ``--timeline`` file (``.csv`` / ``.parquet`` with the timeline columns);
* a **sweep dataset**: a ``sweep`` output directory (or one of its Parquet files): one row per
  point, axis columns, ``m.<metric>``, ``slo.<...>``, ``status`` (``ok`` rows are used;
  missing columns are tolerated);
* a **plan result**: JSON, a list of deployments ``{label, gpus, cost_per_hour_usd,
  ttft_p99_ms, goodput_rps, meets_slo}`` (or an object holding such a list under
  ``pareto``, ``front``, ``candidates`` or ``deployments``).

Anything else is a one-line :class:`~blis_simpy.errors.ConfigError` naming the file. Sizes
are capped: a JSON file at :data:`MAX_JSON_BYTES`, a table at :data:`MAX_ROWS` rows.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from blis_simpy.errors import ConfigError
from blis_simpy.infile import json_loads, open_input
from blis_simpy.metrics.timeline_file import COLUMNS as TIMELINE_COLUMNS
from blis_simpy.metrics.timeline_file import read_timeline

__all__ = ["MAX_JSON_BYTES", "MAX_ROWS", "Input", "load_input", "load_inputs"]

MAX_JSON_BYTES = 1 << 30
MAX_ROWS = 5_000_000
FIELD = "INPUT"
_PLAN_KEYS = ("pareto", "front", "candidates", "deployments")


@dataclass
class Input:
    """One recognised input. ``kind``: ``results`` | ``timeline`` | ``sweep`` | ``plan``.

    ``latency_ms``: results — metric (``ttft``, ``itl``, ``e2e``) → values, ms.
    ``table``: timeline / sweep — a :class:`pyarrow.Table` (sweep: ``ok`` rows only).
    ``deployments``: plan — the deployment dicts.
    ``doc``: plan — the whole JSON object when the deployments came from one (a ``plan
    --out`` document: ``plan``, ``cheapest``, ``max_rate``, ``points``), else empty.
    ``slo_ms``: results — the run's per-request SLO thresholds (``ttft``, ``itl``, ``e2e``,
    ms) that were set."""

    path: str
    kind: str
    latency_ms: dict[str, list[float]] = field(default_factory=dict)
    table: object | None = None
    deployments: list[dict] = field(default_factory=list)
    doc: dict = field(default_factory=dict)
    slo_ms: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        base = os.path.basename(os.path.normpath(self.path))
        return os.path.splitext(base)[0] or base

    def describe(self) -> str:
        """One line: what the input holds."""
        if self.kind == "results":
            n = max((len(v) for v in self.latency_ms.values()), default=0)
            return f"results: {n} completed requests"
        if self.kind == "timeline":
            t = self.table
            insts = len(set(t.column("instance").to_pylist()))
            return f"timeline: {t.num_rows} rows, {insts} instance(s)"
        if self.kind == "sweep":
            return f"sweep dataset: {self.table.num_rows} ok point(s)"
        return f"plan result: {len(self.deployments)} deployment(s)"


def _bad(path: str, problem: str, line: int | None = None) -> ConfigError:
    return ConfigError(problem, file=path, line=line, field=FIELD)


def _pos(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _from_rows(path: str, rows: list[dict]) -> Input:
    """Results rows (``--results-path`` requests rows or ``--requests-out`` rows)."""
    ttft, itl, e2e = [], [], []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise _bad(path, "a request row is not an object")
        n_out = r.get("num_decode_tokens")
        if n_out is not None and not (isinstance(n_out, (int, float)) and not isinstance(n_out, bool)):
            raise _bad(path, f"request row {i}: num_decode_tokens: not a number, got {n_out!r:.40}")
        if _pos(r.get("e2e_ms")):
            e2e.append(float(r["e2e_ms"]))
            if _pos(r.get("ttft_ms")):
                ttft.append(float(r["ttft_ms"]))
            if _pos(r.get("itl_ms")) and (n_out or 0) > 1:
                itl.append(float(r["itl_ms"]))
    return Input(path, "results", latency_ms={"ttft": ttft, "itl": itl, "e2e": e2e})


def _from_replay(path: str, rows: list[dict]) -> Input:
    ttft = [r["ttft_us"] / 1000.0 for r in rows if _pos(r.get("ttft_us"))]
    e2e = [r["e2e_us"] / 1000.0 for r in rows if _pos(r.get("e2e_us"))]
    return Input(path, "results", latency_ms={"ttft": ttft, "itl": [], "e2e": e2e})


def _is_deployment(d) -> bool:
    return isinstance(d, dict) and ("gpus" in d or "cost_per_hour_usd" in d) and (
        "ttft_p99_ms" in d or "goodput_rps" in d)


def _from_json(path: str) -> Input:
    if os.path.getsize(path) > MAX_JSON_BYTES:
        raise _bad(path, f"larger than {MAX_JSON_BYTES >> 20} MiB")
    try:
        with open_input(path, encoding="utf-8") as fh:
            doc = json_loads(fh.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"not JSON: {exc}".splitlines()[0]) from None
    except RecursionError:
        raise _bad(path, "not JSON: nested too deeply") from None
    if isinstance(doc, dict) and isinstance(doc.get("requests"), list):
        res = _from_rows(path, doc["requests"])
        slo = doc.get("slo") if isinstance(doc.get("slo"), dict) else {}
        res.slo_ms = {k: float(slo[f"{k}_ms"]) for k in ("ttft", "itl", "e2e")
                      if _pos(slo.get(f"{k}_ms"))}
        return res
    if isinstance(doc, dict) and "completed_requests" in doc:      # a run with no request row
        return _from_rows(path, [])
    whole = doc if isinstance(doc, dict) else {}
    if isinstance(doc, dict):
        for key in _PLAN_KEYS:
            if isinstance(doc.get(key), list):
                doc = doc[key]
                break
    if isinstance(doc, list) and doc and all(_is_deployment(d) for d in doc):
        return Input(path, "plan", deployments=doc[:MAX_ROWS], doc=whole)
    if isinstance(doc, list) and all(isinstance(d, dict) and "ttft_us" in d for d in doc):
        return _from_replay(path, doc[:MAX_ROWS])
    raise _bad(path, "not a results file (run/replay --results-path) nor a plan result")


def _from_jsonl(path: str) -> Input:
    rows = []
    n = 0
    try:
        with open_input(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if n > MAX_ROWS:
                    raise _bad(path, f"more than {MAX_ROWS} rows")
                if line.strip():
                    rows.append(json_loads(line))
    except UnicodeDecodeError as exc:     # decoded by blocks: the line is not known
        raise _bad(path, f"not a --requests-out .jsonl file: {exc}") from None
    except json.JSONDecodeError as exc:
        raise _bad(path, f"not a --requests-out .jsonl file: {exc}", line=n) from None
    except RecursionError:
        raise _bad(path, "not a --requests-out .jsonl file: nested too deeply", line=n) from None
    if rows and not all(isinstance(r, dict) and "requestID" in r for r in rows):
        raise _bad(path, "not a --requests-out .jsonl file (rows without requestID)")
    return _from_rows(path, rows)


def _sweep(path: str, table) -> Input:
    if table.num_rows > MAX_ROWS:
        raise _bad(path, f"more than {MAX_ROWS} rows")
    if "status" in table.column_names:
        import pyarrow.compute as pc
        table = table.filter(pc.equal(table.column("status"), "ok"))
    return Input(path, "sweep", table=table)


def _from_parquet(path: str) -> Input:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        names = pq.read_schema(path).names
    except (pa.ArrowInvalid, OSError) as exc:
        raise _bad(path, f"not a readable Parquet file: {str(exc).splitlines()[0]}") from None
    if set(TIMELINE_COLUMNS) <= set(names):
        return Input(path, "timeline", table=read_timeline(path, field=FIELD))
    if "requestID" in names and "ttft_ms" in names:
        t = pq.read_table(path)
        if t.num_rows > MAX_ROWS:
            raise _bad(path, f"more than {MAX_ROWS} rows")
        return _from_rows(path, t.to_pylist())
    if any(n.startswith(("m.", "slo.")) for n in names):
        return _sweep(path, pq.read_table(path))
    raise _bad(path, "a Parquet file that is neither a timeline, request rows nor a sweep dataset")


def _from_dir(path: str) -> Input:
    import pyarrow as pa
    import pyarrow.dataset as ds

    from blis_simpy.planner import dataset
    try:       # a sweep's own dataset, read as `sweep --summary` reads it: one row per point
        table = dataset.read(path)     # (ok row first), parts of an axis that changed type unified
    except ConfigError:
        table = None
    if table is not None and table.num_rows:
        return _sweep(path, table)
    try:
        table = ds.dataset(path, format="parquet", exclude_invalid_files=True).to_table()
    except (pa.ArrowInvalid, OSError) as exc:
        raise _bad(path, f"not a sweep dataset: {str(exc).splitlines()[0]}") from None
    if not any(n.startswith(("m.", "slo.")) for n in table.column_names):
        raise _bad(path, "not a sweep dataset (no Parquet rows with m.<metric> columns)")
    return _sweep(path, table)


def load_input(path: str) -> Input:
    """Recognise and read one input (see the module docstring)."""
    if os.path.isdir(path):
        return _from_dir(path)
    if not os.path.isfile(path):
        raise _bad(path, "no such file or directory")
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".json":
        return _from_json(path)
    if suffix == ".jsonl":
        return _from_jsonl(path)
    if suffix == ".parquet":
        return _from_parquet(path)
    if suffix == ".csv":
        return Input(path, "timeline", table=read_timeline(path, field=FIELD))
    raise _bad(path, f"unknown suffix {suffix or '(none)'!r}: expected .json, .jsonl, .csv, "
                     ".parquet or a sweep directory")


def load_inputs(paths: list[str]) -> list[Input]:
    """Every input, in the order given."""
    if not paths:
        raise ConfigError("give at least one input", field=FIELD)
    return [load_input(p) for p in paths]
