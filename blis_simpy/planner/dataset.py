"""The Parquet dataset of a sweep: one row per point, part files written as points complete.

Layout (docs/planning.md, "Sweeps")::

    DIR/part-<ns timestamp>-<random>.parquet     # rows of the points finished in one flush

A part file is staged and renamed into place (:mod:`blis_simpy.atomic`), so a file is either
whole or absent: an interrupted sweep keeps every point flushed before the interruption (the
writer flushes every :data:`FLUSH_S` seconds and when it closes, also on Ctrl-C). Read the
directory with any Parquet reader (``pyarrow.dataset.dataset(DIR)``, pandas, DuckDB, Spark).

Columns: ``config_hash`` (SHA-256 of the command and the resolved scenario, seed included),
``config_key`` (the same without the seed), ``seed``, ``command``, one column per axis (its
dotted key: ``workload.rate``; a list or mapping value is JSON text), ``status`` (``ok`` /
``error``), ``error``, ``wall_s`` (seconds the point took on its worker), the metrics
(``m.<key>`` for each number of the cluster block of the JSON report, ``slo.<...>`` and
``deployment.<...>`` when the report has them) and ``config`` (the resolved scenario, JSON).

Resume: :func:`read` keeps one row per config hash (an ``ok`` row over an ``error`` row,
then the latest); a point whose hash has an ``ok`` row is not run again. The part files hold
the rows in completion order (it depends on the workers); :func:`read` returns them sorted by
the axis values, then the seed, then the config hash.

Summary: :func:`summarize` groups the ``ok`` rows by ``config_key`` and gives, for every
numeric metric, the mean over the seeds and its 95 % confidence interval (Student's t,
:func:`scipy.stats.t.interval`; none with a single seed).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Iterable

from blis_simpy.atomic import atomic_write
from blis_simpy.errors import ConfigError
from blis_simpy.planner.sweep_points import Point, canonical_json

__all__ = ["FLUSH_S", "DatasetWriter", "axis_columns", "dataset_row", "done_hashes",
           "promote_axis_columns", "read", "summarize"]

#: seconds between two part files while points complete
FLUSH_S = 2.0
#: columns that are not axes nor metrics
ID_COLUMNS = ("config_hash", "config_key", "seed", "command")
TAIL_COLUMNS = ("status", "error", "wall_s", "config")
METRIC_PREFIXES = ("m.", "slo.", "deployment.")
PART_GLOB_PREFIX, PART_SUFFIX = "part-", ".parquet"


# ---------------------------------------------------------------------------- rows
def axis_kind(values: Iterable) -> str:
    """The Parquet type of an axis column: ``bool``, ``int``, ``float``, ``str`` or ``json``
    (lists, mappings, null or mixed values become JSON text)."""
    kinds = set()
    for v in values:
        if isinstance(v, bool):
            kinds.add("bool")
        elif isinstance(v, int):
            kinds.add("int")
        elif isinstance(v, float):
            kinds.add("float")
        elif isinstance(v, str):
            kinds.add("str")
        else:
            kinds.add("json")
    if kinds <= {"int", "float"} and kinds:
        return "float" if "float" in kinds else "int"
    return kinds.pop() if len(kinds) == 1 else "json"


def axis_columns(axes: dict[str, list]) -> dict[str, str]:
    """Axis key -> column kind (:func:`axis_kind`) for a sweep's axis values."""
    return {k: axis_kind(v) for k, v in axes.items()}


def _cell(value, kind: str):
    if kind == "json":
        return canonical_json(value)
    if kind == "float":
        return float(value)
    return value


def dataset_row(point: Point, row: dict, kinds: dict[str, str]) -> dict:
    """The dataset row of a point from the row :func:`blis_simpy.run.point.run_point` returned."""
    out = {"config_hash": point.config_hash, "config_key": point.config_key, "seed": point.seed,
           "command": point.command}
    out |= {k: _cell(point.axes[k], kinds[k]) for k in kinds}
    out |= {k: v for k, v in row.items() if k.startswith(METRIC_PREFIXES)}
    wall = row.get("wall_s")
    out |= {"status": row.get("status") or "error", "error": row.get("error") or "",
            "wall_s": float(wall) if wall is not None else None, "config": canonical_json(point.config)}
    return out


# ---------------------------------------------------------------------------- writing
class DatasetWriter:
    """Buffers rows and writes them as part files (at most every :data:`FLUSH_S` seconds).
    Use as a context manager: closing flushes what is left."""

    def __init__(self, out_dir: str, flush_s: float = FLUSH_S):
        self.out_dir = str(out_dir)
        self.flush_s = flush_s
        self.rows: list[dict] = []
        self.written = 0
        self._last = time.monotonic()
        ensure_dir(self.out_dir)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.flush()

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if time.monotonic() - self._last >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one part file (atomically)."""
        self._last = time.monotonic()
        if not self.rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq
        cols: dict[str, None] = {}
        for r in self.rows:
            cols |= dict.fromkeys(r)
        table = pa.table({c: _column(c, [r.get(c) for r in self.rows]) for c in cols})
        name = f"{PART_GLOB_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}{PART_SUFFIX}"
        final = os.path.join(self.out_dir, name)
        with atomic_write(final, what="cannot write the dataset") as f:
            pq.write_table(table, f)
        self.written += len(self.rows)
        self.rows = []


def _column(name: str, values: list):
    """One column of a part file. A metric (or ``wall_s``) that is null in every row of the
    part — nothing finished, the points failed — is typed float64, not Arrow's null type,
    so any Parquet reader can unify the parts (``pyarrow.dataset`` cannot cast double to
    null); integers in other parts cast to it."""
    import pyarrow as pa
    if (name.startswith(METRIC_PREFIXES) or name == "wall_s") and all(v is None for v in values):
        return pa.array(values, type=pa.float64())
    return pa.array(values)


def ensure_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError("exists and is not a directory", file=path, field="--out")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the dataset directory: {exc.strerror or exc}", file=path,
                          field="--out") from None


def promote_axis_columns(out_dir: str, kinds: dict[str, str]) -> int:
    """Rewrite the part files whose column of a ``float`` axis is integer-typed (written while
    that axis had integer values only: ``workload.rate: [4, 8]`` grown to ``[4, 8, 12.5]``)
    with the column as float64, so the directory has one type per column and any Parquet
    reader reads it (``pyarrow.dataset`` takes the first file's schema and cannot put 12.5 in
    an int64 column). Each file is replaced atomically under its own name; the values and
    the rows are unchanged. Returns the files rewritten."""
    floats = [k for k, kind in kinds.items() if kind == "float"]
    if not floats:
        return 0
    import pyarrow as pa
    import pyarrow.parquet as pq
    rewritten = 0
    for path in part_files(out_dir):
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"not a readable Parquet file: {exc}".replace("\n", " "), file=path) from None
        ints = [k for k in floats if k in schema.names and pa.types.is_integer(schema.field(k).type)]
        if not ints:
            continue
        table = pq.read_table(path)
        for k in ints:
            i = table.schema.get_field_index(k)
            table = table.set_column(i, pa.field(k, pa.float64()), table.column(k).cast(pa.float64()))
        with atomic_write(path, what="cannot write the dataset") as f:
            pq.write_table(table, f)
        rewritten += 1
    return rewritten


# ---------------------------------------------------------------------------- reading
def part_files(out_dir: str) -> list[str]:
    """The part files of a dataset, oldest first."""
    try:
        names = os.listdir(out_dir)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise ConfigError("is not a dataset directory", file=out_dir) from None
    return [os.path.join(out_dir, n) for n in sorted(names)
            if n.startswith(PART_GLOB_PREFIX) and n.endswith(PART_SUFFIX)]


def read(out_dir: str, *, required: bool = False):
    """The dataset as a :class:`pyarrow.Table`, one row per config hash (an ``ok`` row wins
    over an ``error`` row, then the latest). ``required``: a missing or empty dataset is an
    error (else an empty table)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    files = part_files(out_dir)
    if not files:
        if required:
            what = "no such dataset" if not os.path.exists(out_dir) else "no part files: not a sweep dataset"
            raise ConfigError(what, file=out_dir)
        return pa.table({})
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f))
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"not a readable Parquet file: {exc}".replace("\n", " "), file=f) from None
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as exc:    # part files whose columns cannot be one table
        raise ConfigError(f"part files do not agree: {exc}".replace("\n", " "), file=out_dir) from None
    if not {"config_hash", "status", "config_key"} <= set(table.column_names):
        raise ConfigError("not a sweep dataset (no config_hash/status columns)", file=out_dir)
    for name in ("config_hash", "status", "config_key"):
        kind = table.schema.field(name).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ConfigError(f"not a sweep dataset (column {name} is {kind}, not text)", file=out_dir)
    hashes = table.column("config_hash").to_pylist()
    status = table.column("status").to_pylist()
    keep: dict[str, int] = {}
    for i, (h, s) in enumerate(zip(hashes, status, strict=True)):
        j = keep.get(h)
        if j is None or s == "ok" or status[j] != "ok":
            keep[h] = i
    # an int64 array: an empty Python list would infer Arrow's null type, which take() refuses
    return table.take(pa.array(sorted(keep.values(), key=_row_order(table)), type=pa.int64()))


def _row_order(table):
    """Sort key of a row index: the axis values, then the seed, then the config hash. The part
    files hold the rows in the order the points completed, which depends on the workers;
    this order does not, so a dataset reads (and summarizes) the same however it was run."""
    cols = [table.column(n).to_pylist() for n in axis_names(table.column_names)]
    for n in ("seed", "config_hash"):
        cols.append(table.column(n).to_pylist() if n in table.column_names else [None] * table.num_rows)
    return lambda i: tuple(_sort_key(c[i]) for c in cols)


def read_part(path: str) -> list[dict]:
    """The rows of one part file."""
    import pyarrow.parquet as pq
    return pq.read_table(path).to_pylist()


def done_hashes(out_dir: str) -> set[str]:
    """Config hashes with an ``ok`` row in the dataset (their points are not run again)."""
    table = read(out_dir)
    if table.num_rows == 0:
        return set()
    return {h for h, s in zip(table.column("config_hash").to_pylist(),
                              table.column("status").to_pylist(), strict=True) if s == "ok"}


# ---------------------------------------------------------------------------- summary
def metric_columns(names: Iterable[str]) -> list[str]:
    return [n for n in names if n.startswith(METRIC_PREFIXES)]


def axis_names(names: Iterable[str]) -> list[str]:
    """The axis columns of a dataset: neither identity, status nor metric columns."""
    fixed = set(ID_COLUMNS) | set(TAIL_COLUMNS)
    return [n for n in names if n not in fixed and not n.startswith(METRIC_PREFIXES)]


def mean_ci95(values: list[float]) -> tuple[float, float | None, float | None]:
    """Mean and the 95 % confidence interval of the mean (Student's t with n - 1 degrees of
    freedom); ``(mean, None, None)`` for one value."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None, None
    from scipy import stats
    sem = stats.sem(values)
    if sem == 0:
        return mean, mean, mean
    lo, hi = stats.t.interval(0.95, n - 1, loc=mean, scale=sem)
    return mean, float(lo), float(hi)


def _sort_key(v):
    return (v is None, isinstance(v, str), v if v is not None else 0)


def _seed_order(row: dict) -> tuple:
    return _sort_key(row.get("seed")), _sort_key(row.get("config_hash"))


def summarize(table) -> dict:
    """Per configuration (``config_key``): axis values, seeds run, failed points and, for every
    numeric metric, ``{"mean", "ci95_low", "ci95_high"}`` over its ``ok`` rows."""
    rows = table.to_pylist() if table.num_rows else []
    names = table.column_names
    axes = axis_names(names)
    metrics = [m for m in metric_columns(names)
               if any(isinstance(r.get(m), (int, float)) and not isinstance(r.get(m), bool)
                      for r in rows)]
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r["config_key"], {"axes": {a: r.get(a) for a in axes}, "seeds": [],
                                                "failed": 0, "errors": [], "rows": []})
        if r["status"] == "ok":
            g["seeds"].append(r.get("seed"))
            g["rows"].append(r)
        else:
            g["failed"] += 1
            g["errors"].append((_seed_order(r), r.get("error") or ""))
    configs = []
    for key, g in groups.items():
        # seed order, not the table's: the CI's float sums, and the errors kept, would
        # otherwise depend on the order the points completed in
        g["rows"].sort(key=_seed_order)
        g["errors"].sort()
        out = {"config_key": key, "axes": g["axes"], "n": len(g["rows"]), "seeds": sorted(g["seeds"]),
               "failed": g["failed"], "errors": [e for _, e in g["errors"][:3]], "metrics": {}}
        for m in metrics:
            vals = [float(r[m]) for r in g["rows"] if isinstance(r.get(m), (int, float))
                    and not isinstance(r.get(m), bool) and not math.isnan(float(r[m]))]
            if vals:
                mean, lo, hi = mean_ci95(vals)
                out["metrics"][m] = {"mean": mean, "ci95_low": lo, "ci95_high": hi}
        configs.append(out)
    configs.sort(key=lambda c: tuple(_sort_key(c["axes"].get(a)) for a in axes))
    ok = sum(c["n"] for c in configs)
    return {"points": len(rows), "ok": ok, "failed": len(rows) - ok, "axes": axes,
            "metrics": metrics, "configs": configs}
