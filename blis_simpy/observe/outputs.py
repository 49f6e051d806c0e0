"""The files of an ``observe`` run, written as the requests finish (docs/cli.md, "observe").

:class:`ObserveOutputs` takes each finished :class:`~blis_simpy.observe.records.Observation`
in trace order (the sender hands them over in dispatch order, each once it and every
earlier one have ended: ``observe(..., record=outputs.add)``) and keeps nothing of it but:

* its TraceV2 row, written at once to the staged ``--trace-data`` file — except while it is
  open whether the trace carries the prompts' token IDs (``completions`` and the prompts so
  far within :data:`~blis_simpy.workload.tracev2.MAX_TOKEN_IDS_PER_FILE`): then the row (its
  CSV text and its int32 IDs) waits in an anonymous temporary file beside the output until
  the prompts pass the cap (the waiting rows are written without IDs) or the run ends (with
  them);
* its ``--results`` entry, appended to another such file (the summary comes first in the
  results file, and is known only at the end);
* the running :class:`~blis_simpy.observe.records.Summary` and the first failure.

:meth:`ObserveOutputs.finish` writes the trace header and the results document — byte for
byte what :func:`~blis_simpy.workload.tracev2_write.write_trace_files` and
:func:`~blis_simpy.observe.records.write_json` write for the same observations — and stages
every file in the command's :class:`~blis_simpy.atomic.Batch`, which renames them into place
together; :meth:`ObserveOutputs.abort` (any failure) leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile

import numpy as np

from blis_simpy.atomic import Batch, Staged
from blis_simpy.observe import records as _records
from blis_simpy.observe.records import OK, Observation, Summary, request_result, trace_record
from blis_simpy.workload.tracev2 import TOKEN_IDS_COLUMN, TRACE_COLUMNS
from blis_simpy.workload.tracev2_write import header_to_yaml, record_to_csv_line


def _indented(doc, level: int) -> str:
    """``doc`` as ``json.dump(..., indent=1)`` writes it ``level`` levels deep (its first
    line not indented). JSON text has no raw newline inside a string."""
    return json.dumps(doc, indent=1).replace("\n", "\n" + " " * level)


_ROW = struct.Struct("<II")        # a waiting row: text bytes, IDs
_NO_IDS = 0xFFFF_FFFF


def _spill(path, staged: Staged, mode: str, **kw):
    """An anonymous temporary file beside ``path`` (not in /tmp, often memory), or in the
    temporary folder when ``path`` is a device or its folder is not writable."""
    folder = os.path.dirname(os.path.abspath(path))
    return tempfile.TemporaryFile(mode, dir=None if staged.through or not os.access(folder, os.W_OK)
                                  else folder, **kw)


class ObserveOutputs:
    """The trace pair (``trace_paths``: header, data) and the results file (``results``) of
    one run, any of them None; files open in ``batch`` (see the module docstring).
    ``api_format``: only a ``completions`` trace may carry token IDs."""

    def __init__(self, batch: Batch, *, trace_paths: tuple | None, results: str | os.PathLike | None,
                 streaming: bool, api_format: str, warmup_requests: int):
        self.batch = batch
        self.streaming = streaming
        self.warmup_requests = warmup_requests
        self.summary = Summary(warmup_requests)
        self.first_failure: Observation | None = None
        self.n = 0
        self.header = self.csv = self.results = self.spill = None
        #: while the ID column is open, the rows waiting (see :meth:`_hold`), and their number
        self.held = None
        self.n_held = 0
        self.ids_total = 0
        try:
            if trace_paths is not None:
                header_path, data_path = trace_paths
                self.header = self._open(header_path, "--trace-header", "cannot write trace", 0o666)
                self.csv = self._open(data_path, "--trace-header", "cannot write trace", 0o666)
                if api_format == "completions":
                    self.held = _spill(data_path, self.csv, "w+b")
                else:
                    self._write(self.csv, ",".join(TRACE_COLUMNS) + "\n")
            if results is not None:
                self.results = self._open(results, "--results", "cannot write results", 0o644)
                self.spill = _spill(results, self.results, "w+", encoding="utf-8", newline="")
        except BaseException:
            self.abort()
            raise

    def _open(self, path, field: str, what: str, perm: int) -> Staged:
        return self.batch.open(path, field=field, what=what, binary=False, perm=perm)

    @staticmethod
    def _write(staged: Staged, text: str) -> None:
        try:
            staged.file.write(text)
        except OSError as exc:
            raise staged.error(exc) from None

    # ------------------------------------------------------------------ per request
    def add(self, o: Observation) -> None:
        """Take the next observation in trace order (it has ended)."""
        i = self.n
        self.n += 1
        self.summary.add(o)
        if self.first_failure is None and o.status != OK:
            self.first_failure = o
        if self.csv is not None:
            self._row(i, o)
        if self.spill is not None:
            entry = _indented(request_result(i, o, i < self.warmup_requests), 2)
            self.spill.write((",\n  " if i else "  ") + entry)

    def _row(self, i: int, o: Observation) -> None:
        line = record_to_csv_line(trace_record(i, o, streaming=self.streaming))
        if self.held is None:
            self._write(self.csv, line)
            return
        r = o.request
        self.ids_total += r.input_len
        if self.ids_total > _records.MAX_TOKEN_IDS_PER_FILE:   # no IDs: the held rows go out bare
            self._flush_held(with_ids=False)
            self._write(self.csv, line)
            return
        self._hold(line[:-1].encode("utf-8"), r.input_tokens)

    def _hold(self, text: bytes, ids) -> None:
        """One waiting row: its byte count and ID count (``NO_IDS`` for none), then both."""
        raw = b"" if ids is None else np.asarray(ids, dtype="<i4").tobytes()
        self.held.write(_ROW.pack(len(text), _NO_IDS if ids is None else len(raw) // 4) + text + raw)
        self.n_held += 1

    def _flush_held(self, *, with_ids: bool) -> None:
        held, self.held = self.held, None
        head = TRACE_COLUMNS + ((TOKEN_IDS_COLUMN,) if with_ids else ())
        self._write(self.csv, ",".join(head) + "\n")
        held.seek(0)
        for _ in range(self.n_held):
            n_text, n_ids = _ROW.unpack(held.read(_ROW.size))
            text = held.read(n_text).decode("utf-8")
            ids = None if n_ids == _NO_IDS else np.frombuffer(held.read(4 * n_ids), dtype="<i4")
            cell = "" if not with_ids else "," if ids is None else "," + " ".join(map(str, ids.tolist()))
            self._write(self.csv, text + cell + "\n")
        held.close()

    # ------------------------------------------------------------------ the end
    def finish(self, *, header=None, run: dict | None = None) -> dict:
        """Complete the files (``header``: the TraceV2 header; ``run``: the results' ``run``
        section) and stage them in the batch; returns the summary."""
        summary = self.summary.result()
        if self.csv is not None:
            if self.held is not None:
                self._flush_held(with_ids=self.n_held > 0)
            self._write(self.header, header_to_yaml(header))
        if self.results is not None:
            head = _indented({"run": run or {}, "summary": summary, "requests": []}, 0)
            if self.n:               # json.dump's layout of a non-empty list
                head = head[:-len("[]\n}")] + "[\n"
            self._write(self.results, head)
            self.spill.seek(0)
            try:
                shutil.copyfileobj(self.spill, self.results.file)
            except OSError as exc:
                raise self.results.error(exc) from None
            self._write(self.results, ("\n ]\n}" if self.n else "") + "\n")
            self.spill.close()
        return summary

    def abort(self) -> None:
        """Drop every staged file (nothing is left behind)."""
        for f in (self.spill, self.held):
            if f is not None:
                f.close()
        self.batch.abort()

