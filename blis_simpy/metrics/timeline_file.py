"""The ``--timeline`` file: a run's :class:`~blis_simpy.cluster.monitor.Timeline` as CSV or
Parquet (docs/planning.md, "Reports").

One row per (sample time, instance), columns in :data:`COLUMNS` order: ``t_us`` (simulated µs), ``instance``, ``role`` (``prefill``/``decode`` with pools,
else empty), ``running``, ``waiting``, ``kv_blocks_used``, ``kv_blocks_total``,
``preemptions`` (cumulative), ``kv_transfers_in_flight`` (cluster-wide; empty/null without
pools), ``steps`` (engine steps the instance has begun, cumulative: the difference of two samples
is the steps of that interval, which shows a prefill instance busy although its requests leave
``running`` when their only step begins). Files written before ``steps`` existed are read
without it (:data:`REQUIRED`). A run with an autoscaler has one more column, ``state``
(``off``, ``loading``, ``serving`` or ``draining``; docs/control-plane.md, "Autoscaling"). The format follows the suffix (``.csv`` or ``.parquet``). Writing is atomic
(:mod:`blis_simpy.atomic`): a temporary file next to the path, renamed over it when complete.

:func:`read_timeline` reads either format back as a :class:`pyarrow.Table` and checks the
columns (the report reads timelines through it).
"""

from __future__ import annotations

import os

from blis_simpy.errors import ConfigError

__all__ = ["COLUMNS", "FORMATS", "GATEWAY_COLUMN", "REQUIRED", "STATE", "check_timeline_path",
           "read_timeline", "write_timeline"]

#: the columns of a timeline, one row per (sample time, instance)
COLUMNS = ("t_us", "instance", "role", "running", "waiting", "kv_blocks_used", "kv_blocks_total",
           "preemptions", "kv_transfers_in_flight", "steps")
#: the column of a run with a gateway queue (after :data:`COLUMNS`; absent otherwise)
GATEWAY_COLUMN = "gateway_queue_depth"
#: the column a run with an autoscaler adds: each instance's state
STATE = "state"
#: the columns a timeline file must have to be read (``steps`` came later: optional)
REQUIRED = COLUMNS[:-1]
FORMATS = (".csv", ".parquet")
_INTS = ("t_us", "running", "waiting", "kv_blocks_used", "kv_blocks_total", "preemptions",
         "kv_transfers_in_flight", "steps", GATEWAY_COLUMN)


def check_timeline_path(path: str, field: str) -> None:
    """Refuse, before the run, a path the timeline cannot be written to."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise ConfigError(f"unknown suffix {suffix or '(none)'!r}: expected .csv or .parquet",
                          file=path, field=field)
    if os.path.isdir(path):
        raise ConfigError("is a directory, expected a file", file=path, field=field)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError("no such directory for the timeline file", file=path, field=field)


def _table(tl):
    import pyarrow as pa
    names = tl.columns
    schema = pa.schema([(c, pa.string() if c in ("instance", "role", STATE) else pa.int64())
                        for c in names])
    return pa.Table.from_pydict({c: tl.cols[c] for c in names}, schema=schema)


def write_timeline(path: str, tl, *, field: str = "--timeline", batch=None) -> None:
    """Write ``tl`` (a :class:`~blis_simpy.cluster.monitor.Timeline`: its ``cols`` by
    column name) to ``path`` (.csv or .parquet), all-or-nothing (:mod:`blis_simpy.atomic`;
    with ``batch``, committed with the batch). Errors: ConfigError."""
    from blis_simpy.atomic import atomic_write
    check_timeline_path(path, field)
    parquet = path.lower().endswith(".parquet")
    with atomic_write(path, batch=batch, field=field, what="cannot write the timeline",
                      binary=parquet, perm=0o666) as f:
        if parquet:
            import pyarrow.parquet as pq
            pq.write_table(_table(tl), f)
        else:
            import csv
            w = csv.writer(f, lineterminator="\n")
            names = tl.columns
            w.writerow(names)
            w.writerows(zip(*(tl.cols[c] for c in names), strict=True))


def read_timeline(path: str, *, field: str | None = None):
    """A timeline file (.csv or .parquet) as a :class:`pyarrow.Table` with every column of
    :data:`REQUIRED` (and ``steps`` when the file has it). ConfigError (one line) when it is missing, unreadable or not a timeline."""
    import pyarrow as pa
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise ConfigError(f"unknown suffix {suffix or '(none)'!r}: expected .csv or .parquet",
                          file=path, field=field)
    if not os.path.isfile(path):
        raise ConfigError("no such file", file=path, field=field)
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq
            table = pq.read_table(path)
        else:
            import pyarrow.csv as pcsv
            types = {c: pa.int64() for c in _INTS}
            types.update(instance=pa.string(), role=pa.string(), state=pa.string())
            table = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
                column_types=types, strings_can_be_null=False))
    except (pa.ArrowInvalid, OSError) as exc:
        why = str(exc).splitlines()[0]
        why = why if len(why) <= 300 else why[:300] + "..."     # (a cell may be megabytes)
        raise ConfigError(f"not a readable timeline: {why}", file=path, field=field) from None
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise ConfigError(f"not a timeline: missing column(s) {', '.join(missing)}", file=path,
                          field=field)
    return table
