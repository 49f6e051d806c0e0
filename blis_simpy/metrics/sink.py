"""Per-request rows written to a file (``--requests-out PATH``; docs/metrics.md, "Per-request
rows file").

A row has the fields and values of a ``--results-path`` ``requests`` row
(:func:`~blis_simpy.metrics.summary.request_row`). The format follows the suffix:

* ``.jsonl`` — one compact JSON object per line, numbers written as Go writes them (the
  results file's values, byte for byte); keys the results rows omit are omitted;
* ``.parquet`` — one table, written with pyarrow in row groups of :data:`ROW_GROUP_ROWS`
  rows; columns ``arrived_at`` (s), ``requestID``, ``num_prefill_tokens``,
  ``num_decode_tokens``, ``ttft_ms``, ``itl_ms``, ``e2e_ms``, ``scheduling_delay_ms``,
  ``slo_class``, ``tenant_id``, ``handled_by``, ``model`` (null where the results row omits
  the key) and ``length_capped`` (false where it is omitted).

Writing is atomic (:mod:`blis_simpy.atomic`): rows go to a temporary file next to ``PATH``,
renamed over it by :meth:`RequestSink.commit` (with the run's other outputs);
:meth:`RequestSink.abort` (any failure) removes it, so ``PATH`` is either the complete file or
untouched. A device path (``/dev/null``) is written through, not replaced.
"""

from __future__ import annotations

import os

from blis_simpy.atomic import Batch, Staged
from blis_simpy.errors import ConfigError
from blis_simpy.metrics import gojson

__all__ = ["FORMATS", "ROW_GROUP_ROWS", "RequestSink"]

FORMATS = (".jsonl", ".parquet")
ROW_GROUP_ROWS = 65_536
_STRINGS = ("slo_class", "tenant_id", "handled_by", "model")
_REQUIRED = ("arrived_at", "requestID", "num_prefill_tokens", "num_decode_tokens", "ttft_ms",
             "itl_ms", "e2e_ms", "scheduling_delay_ms")


def _schema():
    import pyarrow as pa
    return pa.schema([
        ("arrived_at", pa.float64()), ("requestID", pa.string()),
        ("num_prefill_tokens", pa.int64()), ("num_decode_tokens", pa.int64()),
        ("ttft_ms", pa.float64()), ("itl_ms", pa.float64()), ("e2e_ms", pa.float64()),
        ("scheduling_delay_ms", pa.float64()),
        ("slo_class", pa.string()), ("tenant_id", pa.string()), ("handled_by", pa.string()),
        ("model", pa.string()), ("length_capped", pa.bool_()),
    ])


class RequestSink:
    """An open per-request rows file; ``field`` names what set the path (for errors)."""

    def __init__(self, path: str | os.PathLike, *, field: str = "--requests-out"):
        self.path = os.fspath(path)
        self.field = field
        self.rows = 0
        suffix = os.path.splitext(self.path)[1].lower()
        if suffix not in FORMATS:
            raise ConfigError(f"unknown suffix {suffix or '(none)'!r}: expected .jsonl or .parquet",
                              file=self.path, field=field)
        self.parquet = suffix == ".parquet"
        self._staged = Staged(self.path, field=field, fsync=True)   # errors: ConfigError
        self._fh = self._staged.file
        self._writer = None
        self._cols: dict[str, list] = {}      # Parquet: the pending row group, by column
        self._pending = 0
        if self.parquet:
            import pyarrow.parquet as pq
            self._writer = pq.ParquetWriter(self._fh, _schema())

    # ------------------------------------------------------------------ writing
    def write(self, row: dict) -> None:
        """Append one row (a results-file ``requests`` row)."""
        self.rows += 1
        if self._writer is None:
            try:
                self._fh.write(gojson.dumps(row, indent=None).encode("utf-8") + b"\n")
            except OSError as exc:             # a full disk mid-run: name the file and flag
                raise self._staged.error(exc) from None
            return
        cols = self._cols
        if not cols:
            cols.update((name, []) for name in self._writer.schema.names)
        for name in _REQUIRED:
            cols[name].append(row[name])
        for name in _STRINGS:
            cols[name].append(row.get(name))
        cols["length_capped"].append(row.get("length_capped", False))
        self._pending += 1
        if self._pending >= ROW_GROUP_ROWS:
            self._flush_batch()

    def _flush_batch(self) -> None:
        import pyarrow as pa
        if not self._pending:
            return
        self._writer.write_table(pa.Table.from_pydict(self._cols, schema=self._writer.schema))
        self._cols = {}
        self._pending = 0

    # ------------------------------------------------------------------ ending
    def commit(self, batch: Batch | None = None) -> None:
        """Finish the file and rename it over the path (with ``batch``: stage it there, to
        commit with the batch's other outputs)."""
        try:
            if self._writer is not None:
                self._flush_batch()
                self._writer.close()
                self._writer = None
            if batch is not None:
                batch.add(self._staged)
            else:
                self._staged.commit()
        except OSError as exc:
            self.abort()
            raise self._staged.error(exc) from None
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop the temporary file; the path is left as it was."""
        try:
            if self._writer is not None:
                self._writer.close()
        except Exception:  # noqa: BLE001 - already failing; the file goes anyway
            pass
        self._writer = None
        self._staged.abort()
