"""TraceV2: BLIS's workload trace format, a YAML header plus a CSV (docs/workloads.md,
"TraceV2").

Reading is strict: unknown header keys, malformed numbers, negative counts, out-of-range
ratios and deadlines before arrival are :class:`~blis_simpy.errors.ConfigError` naming the
file, the 1-based line and the column / key. Writing reproduces BLIS's export layout byte for
byte (Go ``encoding/csv`` quoting, ``\\n`` line ends, ``true``/``false`` booleans, shortest
float text) and goes through temporary files renamed into place.

Units: every ``*_us`` column is an integer number of microseconds; token columns are token
counts; ``reason_ratio`` is a fraction in [0, 1].

Our extensions (docs/workloads.md): optional columns after the 27 BLIS ones, recognised by
their name in the header row, in any order (other extra columns are ignored, as BLIS does):

* ``input_token_ids`` — the request's full prompt token IDs (prefix included),
  space-separated decimal integers, empty when unknown;
* ``scheduled_time_us`` — when the server first scheduled the request (integer µs on the
  trace's time origin, like ``send_time_us``); 0 or empty = unknown.

Each is written only when at least one record carries it (IDs; a positive scheduling time),
always in that order, so a trace without them is byte-identical to BLIS's export, and BLIS's
reader (which tolerates extra columns) still reads ours.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from blis_simpy.errors import ConfigError
from blis_simpy.workload import _yaml

TRACE_COLUMNS: tuple[str, ...] = (
    "request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index",
    "prefix_group", "prefix_length", "streaming", "input_tokens", "output_tokens",
    "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio", "model",
    "deadline_us", "server_input_tokens", "arrival_time_us", "send_time_us",
    "first_chunk_time_us", "last_chunk_time_us", "num_chunks", "status", "error_message",
    "finish_reason",
)
NUM_COLUMNS = len(TRACE_COLUMNS)
#: our extension column: full prompt token IDs, space-separated
TOKEN_IDS_COLUMN = "input_token_ids"
#: our extension column: first scheduling by the server, µs on the trace's origin (0 = unknown)
SCHEDULED_COLUMN = "scheduled_time_us"
#: our extension columns, in the order they are written after the 27 BLIS ones
EXTENSION_COLUMNS: tuple[str, ...] = (TOKEN_IDS_COLUMN, SCHEDULED_COLUMN)
#: cap on the token IDs one CSV file may carry (all rows together)
MAX_TOKEN_IDS_PER_FILE = 10_000_000
_MAX_FIELD_CHARS = 12 * MAX_TOKEN_IDS_PER_FILE   # csv field-size limit while reading
_MAX_TOKEN_ID = (1 << 31) - 1                     # IDs are kept as int32

# ---------------------------------------------------------------------------------- header

NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TraceServer(_Strict):
    """The serving configuration a real trace was recorded against (metadata only)."""

    type: str = ""
    model: str = ""
    tensor_parallel: NonNegInt = 0
    max_num_seqs: NonNegInt = 0
    block_size: NonNegInt = 0
    gpu_memory_utilization: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
    max_model_len: NonNegInt = 0


class TraceNetwork(_Strict):
    """Measured client↔server network of a real trace; ``measured_rtt_ms`` in ms."""

    measured_rtt_ms: NonNegFloat = 0.0


class TraceHeader(_Strict):
    """The YAML header of a TraceV2 trace. Only version 2 with µs timestamps is accepted."""

    trace_version: Literal[2]
    time_unit: Literal["microseconds"] = "microseconds"
    created_at: str = ""
    mode: Literal["real", "generated"] = "generated"
    warm_up_requests: NonNegInt = 0
    workload_seed: int | None = None
    workload_spec: str = ""
    server: TraceServer | None = None
    network: TraceNetwork | None = None


# ---------------------------------------------------------------------------------- records

@dataclass(slots=True)
class TraceRecord:
    """One CSV row. The first 27 fields are the TraceV2 columns, in order; then our optional
    extension columns: ``input_token_ids`` (an int32 array of the full prompt, prefix
    included, or None when unknown) and ``scheduled_time_us`` (the server's first scheduling
    of the request, µs on the trace's origin; 0 = unknown)."""

    request_id: int = 0
    client_id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    session_id: str = ""
    round_index: int = 0
    prefix_group: str = ""
    prefix_length: int = 0          # tokens of the shared group prefix
    streaming: bool = False
    input_tokens: int = 0           # suffix tokens (excluding the prefix)
    output_tokens: int = 0
    text_tokens: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0
    video_tokens: int = 0
    reason_ratio: float = 0.0
    model: str = ""
    deadline_us: int = 0            # absolute µs; 0 = no deadline
    server_input_tokens: int = 0
    arrival_time_us: int = 0
    send_time_us: int = 0
    first_chunk_time_us: int = 0
    last_chunk_time_us: int = 0
    num_chunks: int = 0
    status: str = "ok"
    error_message: str = ""
    finish_reason: str = ""
    # not part of ==: compare arrays with np.array_equal
    input_token_ids: np.ndarray | None = field(default=None, compare=False)
    scheduled_time_us: int = 0      # µs on the trace's origin; 0 = unknown


assert tuple(f.name for f in fields(TraceRecord))[:NUM_COLUMNS] == TRACE_COLUMNS
assert fields(TraceRecord)[NUM_COLUMNS].name == TOKEN_IDS_COLUMN
assert tuple(f.name for f in fields(TraceRecord))[NUM_COLUMNS:] == EXTENSION_COLUMNS


@dataclass
class TraceV2:
    """A loaded trace: the header and the rows in file order."""

    header: TraceHeader
    records: list[TraceRecord] = field(default_factory=list)


# ---------------------------------------------------------------------------------- reading

def read_trace_header(path: str | os.PathLike) -> TraceHeader:
    """Parse and validate a TraceV2 YAML header."""
    path = str(path)
    data, node = _yaml.load_yaml(path)
    if data is None:
        raise ConfigError("empty trace header, expected trace_version: 2", file=path, line=1)
    if not isinstance(data, dict):
        raise ConfigError("trace header must be a YAML mapping", file=path, line=1)
    try:
        return TraceHeader.model_validate(data)
    except ValidationError as e:
        raise _yaml.from_validation_error(e, path, node) from None


_INT_RE = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_BOOLS = {"true": True, "True": True, "TRUE": True, "t": True, "T": True, "1": True,
          "false": False, "False": False, "FALSE": False, "f": False, "F": False, "0": False}
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# columns that must be >= 0 (counts, indices, timestamps)
_NONNEG = frozenset(("request_id", "round_index", "prefix_length", "input_tokens",
                     "output_tokens", "text_tokens", "image_tokens", "audio_tokens",
                     "video_tokens", "server_input_tokens", "num_chunks", "arrival_time_us",
                     "send_time_us", "first_chunk_time_us", "last_chunk_time_us",
                     "deadline_us", SCHEDULED_COLUMN))


class _RowParser:
    """Typed access to the columns of one CSV row, raising located ConfigErrors."""

    __slots__ = ("path", "row", "line")

    def __init__(self, path: str):
        self.path = path

    def err(self, col: str, problem: str) -> ConfigError:
        return ConfigError(problem, file=self.path, line=self.line, field=col)

    def int(self, i: int, col: str | None = None) -> int:
        """Cell ``i`` as an int64 (``col``: its name, default the BLIS column ``i``)."""
        s = self.row[i]
        col = col or TRACE_COLUMNS[i]
        if not (s.isascii() and s.isdigit()) and not _INT_RE.match(s):
            raise self.err(col, f"expected an integer, got {s!r}")
        v = int(s)
        if v < 0 and col in _NONNEG:
            raise self.err(col, f"must be >= 0, got {v}")
        if v > _INT64_MAX or v < _INT64_MIN:
            raise self.err(col, f"out of the int64 range: {s}")
        return v

    def float(self, i: int) -> float:
        s = self.row[i]
        if not _FLOAT_RE.match(s):
            raise self.err(TRACE_COLUMNS[i], f"expected a number, got {s!r}")
        return float(s)

    def bool(self, i: int) -> bool:
        v = _BOOLS.get(self.row[i])
        if v is None:
            raise self.err(TRACE_COLUMNS[i], f"expected true or false, got {self.row[i]!r}")
        return v


def _parse_row(p: _RowParser) -> TraceRecord:
    r = p.row
    i = p.int
    rec = TraceRecord(
        i(0), r[1], r[2], r[3], r[4], i(5), r[6], i(7), p.bool(8), i(9), i(10), i(11), i(12),
        i(13), i(14), p.float(15), r[16], i(17), i(18), i(19), i(20), i(21), i(22), i(23),
        r[24], r[25], r[26])
    if not 0.0 <= rec.reason_ratio <= 1.0:
        raise p.err("reason_ratio", f"must be in [0, 1], got {r[15]}")
    if rec.deadline_us != 0 and rec.deadline_us < rec.arrival_time_us:
        raise p.err("deadline_us", f"deadline {rec.deadline_us} is before arrival_time_us "
                                   f"{rec.arrival_time_us}")
    return rec


_NOT_ID_CHARS = str.maketrans("", "", "0123456789 ")


def _parse_token_ids(p: _RowParser, rec: TraceRecord, j: int) -> np.ndarray | None:
    """The ``input_token_ids`` cell (column ``j``): None when empty, else an int32 array
    whose length must be ``prefix_length + input_tokens``; IDs are decimal integers in
    [0, 2^31)."""
    s = p.row[j]
    if s == "":
        return None
    if s.translate(_NOT_ID_CHARS) or s[0] == " " or s[-1] == " " or "  " in s:
        for k, tok in enumerate(s.split(" "), 1):
            if not (tok.isascii() and tok.isdigit()):
                if _INT_RE.match(tok) and int(tok) < 0:
                    raise p.err(TOKEN_IDS_COLUMN, f"token ID {k} is {tok}: must be >= 0")
                raise p.err(TOKEN_IDS_COLUMN, f"token ID {k} is {tok!r}: expected decimal integers "
                                              "separated by single spaces")
    ids = np.fromstring(s, dtype=np.int64, sep=" ")
    if ids.size and int(ids.max()) > _MAX_TOKEN_ID:
        k = int(np.argmax(ids > _MAX_TOKEN_ID)) + 1
        raise p.err(TOKEN_IDS_COLUMN, f"token ID {k} is larger than {_MAX_TOKEN_ID}")
    want = rec.prefix_length + rec.input_tokens
    if ids.size != want:
        raise p.err(TOKEN_IDS_COLUMN, f"{ids.size} token IDs, expected prefix_length + input_tokens "
                                      f"= {rec.prefix_length} + {rec.input_tokens} = {want}")
    return ids.astype(np.int32)


def _parse_scheduled(p: _RowParser, rec: TraceRecord, j: int) -> int:
    """The ``scheduled_time_us`` cell (column ``j``): 0 when empty, else an integer µs >= 0;
    a positive time must not be before ``arrival_time_us``."""
    if p.row[j] == "":
        return 0
    v = p.int(j, SCHEDULED_COLUMN)
    if 0 < v < rec.arrival_time_us:
        raise p.err(SCHEDULED_COLUMN, f"scheduled at {v}, before arrival_time_us {rec.arrival_time_us}")
    return v


def _check_header_row(row: list[str], path: str) -> dict[str, int]:
    """Check the 27 column names; returns our extension columns found after them (name →
    0-based column index), recognised by name in any order; other extra columns are
    ignored. A name given twice is an error."""
    if len(row) < NUM_COLUMNS:
        raise ConfigError(f"missing from the header row ({len(row)} columns, expected {NUM_COLUMNS})",
                          file=path, line=1, field=TRACE_COLUMNS[len(row)])
    for j, name in enumerate(TRACE_COLUMNS):
        got = row[j].strip()
        if got != name:
            raise ConfigError(f"header column {j + 1} is {got!r}, expected {name!r}",
                              file=path, line=1, field=name)
    ext: dict[str, int] = {}
    for j in range(NUM_COLUMNS, len(row)):
        name = row[j].strip()
        if name in EXTENSION_COLUMNS:
            if name in ext:
                raise ConfigError(f"header columns {ext[name] + 1} and {j + 1} are both {name!r}",
                                  file=path, line=1, field=name)
            ext[name] = j
    return ext


def read_trace_records(path: str | os.PathLike) -> list[TraceRecord]:
    """Parse and validate a TraceV2 CSV (header row + one row per request, file order).

    Our extension columns are read when the header row names them after the 27 BLIS ones
    (any order): ``input_token_ids`` into ``TraceRecord.input_token_ids`` (at most
    :data:`MAX_TOKEN_IDS_PER_FILE` per file), ``scheduled_time_us`` into
    ``TraceRecord.scheduled_time_us``. A row too short to reach one leaves it unknown."""
    path = str(path)
    p = _RowParser(path)
    records: list[TraceRecord] = []
    seen_ids: dict[int, int] = {}
    line = 0
    n_ids = 0
    old_limit = csv.field_size_limit()
    try:
        csv.field_size_limit(max(old_limit, _MAX_FIELD_CHARS))   # one row may hold many IDs
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, strict=True)
            header_seen = False
            ids_col = sched_col = -1
            for row in reader:
                start, line = line + 1, reader.line_num
                if not row:
                    continue  # blank line (Go's csv reader skips them too)
                if not header_seen:
                    ext = _check_header_row(row, path)
                    ids_col = ext.get(TOKEN_IDS_COLUMN, -1)
                    sched_col = ext.get(SCHEDULED_COLUMN, -1)
                    header_seen = True
                    continue
                p.line = start
                if len(row) < NUM_COLUMNS:
                    raise ConfigError(f"missing: the row has {len(row)} columns, expected {NUM_COLUMNS}",
                                      file=path, line=start, field=TRACE_COLUMNS[len(row)])
                p.row = row
                rec = _parse_row(p)
                if 0 <= ids_col < len(row):
                    n_ids += row[ids_col].count(" ") + 1
                    if n_ids > MAX_TOKEN_IDS_PER_FILE:
                        raise p.err(TOKEN_IDS_COLUMN, f"more than {MAX_TOKEN_IDS_PER_FILE} token IDs "
                                                      "in the file")
                    rec.input_token_ids = _parse_token_ids(p, rec, ids_col)
                if 0 <= sched_col < len(row):
                    rec.scheduled_time_us = _parse_scheduled(p, rec, sched_col)
                first = seen_ids.setdefault(rec.request_id, start)
                if first != start:
                    raise p.err("request_id", f"duplicate request_id {rec.request_id} "
                                              f"(first on line {first})")
                records.append(rec)
            if not header_seen:
                raise ConfigError("missing CSV header row", file=path, line=1)
    except FileNotFoundError:
        raise ConfigError("no such file", file=path) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a file", file=path) from None
    except csv.Error as e:
        raise ConfigError(f"malformed CSV: {e}", file=path, line=line + 1) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"not valid UTF-8 ({e.reason})", file=path, line=line + 1) from None
    except OSError as e:
        raise ConfigError(f"cannot read file: {e.strerror or e}", file=path) from None
    finally:
        csv.field_size_limit(old_limit)
    return records


def read_trace(header_path: str | os.PathLike, data_path: str | os.PathLike) -> TraceV2:
    """Load a complete trace (header, then data)."""
    return TraceV2(read_trace_header(header_path), read_trace_records(data_path))


# ---------------------------------------------------------------------------------- writing

def _go_float_g(x: float) -> str:
    """Go's ``strconv.FormatFloat(x, 'g', -1, 64)`` (what Go's yaml writes for floats)."""
    if math.isnan(x):
        return ".nan"
    if math.isinf(x):
        return ".inf" if x > 0 else "-.inf"
    if x == 0:
        return "-0" if math.copysign(1, x) < 0 else "0"
    sci = np.format_float_scientific(x, unique=True, trim="-")  # e.g. "1.5e+06", "9e-01"
    mant, exp = sci.split("e")
    e = int(exp)
    if e < -4 or e >= 6:  # Go: %e when exp < -4 or exp >= 6 for the shortest form
        return f"{mant}e{'-' if e < 0 else '+'}{abs(e):02d}"
    return np.format_float_positional(x, unique=True, trim="-")


def _yaml_str(s: str) -> str:
    """A YAML scalar for ``s``: plain when it reads back as the same string, else quoted."""
    if s and s == s.strip() and not re.search(r"[:#\[\]{},&*!|>'\"%@`]|^[-?]", s):
        try:
            if yaml.load(s, Loader=_yaml._Loader) == s:
                return s
        except yaml.YAMLError:
            pass
    return yaml.dump(s, Dumper=yaml.SafeDumper, default_style='"', allow_unicode=True,
                     width=math.inf).rstrip("\n")


def _yaml_scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_float_g(v)
    return _yaml_str(str(v))


def header_to_yaml(header: TraceHeader) -> str:
    """The header as BLIS writes it (Go yaml: field order, empty optionals left out, 4-space
    indentation for nested sections)."""
    out = []
    omit_empty = {"created_at", "workload_seed", "workload_spec", "server", "network"}
    for name in TraceHeader.model_fields:
        v = getattr(header, name)
        if name in omit_empty and (v is None or v == ""):
            continue
        if isinstance(v, BaseModel):
            out.append(f"{name}:")
            for sub in type(v).model_fields:
                out.append(f"    {sub}: {_yaml_scalar(getattr(v, sub))}")
        else:
            out.append(f"{name}: {_yaml_scalar(v)}")
    return "\n".join(out) + "\n"


def _csv_field(s: str) -> str:
    """Go ``encoding/csv`` quoting: quote if the field holds , " CR LF, starts with a space
    or is exactly ``\\.``."""
    if s == "":
        return s
    if ("," in s or '"' in s or "\r" in s or "\n" in s or s[0].isspace() or s == "\\."):
        return '"' + s.replace('"', '""') + '"'
    return s


def _format_ratio(x: float) -> str:
    return np.format_float_positional(float(x), unique=True, trim="-")


def _extension_cell(r: TraceRecord, name: str) -> str:
    if name == TOKEN_IDS_COLUMN:
        ids = r.input_token_ids
        return "" if ids is None else " ".join(map(str, np.asarray(ids).tolist()))
    return str(r.scheduled_time_us)


def _has_extension(r: TraceRecord, name: str) -> bool:
    return r.input_token_ids is not None if name == TOKEN_IDS_COLUMN else r.scheduled_time_us > 0


def extension_columns(records: Iterable[TraceRecord]) -> tuple[str, ...]:
    """The extension columns a CSV of ``records`` carries: those some record has (IDs not
    None; a scheduling time > 0), in :data:`EXTENSION_COLUMNS` order."""
    records = list(records)
    return tuple(c for c in EXTENSION_COLUMNS if any(_has_extension(r, c) for r in records))


def record_to_csv_line(r: TraceRecord, with_ids: bool = False, *,
                       extensions: tuple[str, ...] | None = None) -> str:
    """One CSV row (with trailing newline) in BLIS's export format, then the cells of the
    ``extensions`` columns (:data:`EXTENSION_COLUMNS` names, in the given order; an unknown
    ``input_token_ids`` is empty, an unknown ``scheduled_time_us`` 0). ``with_ids`` is the
    short form of ``extensions=("input_token_ids",)``."""
    q = _csv_field
    if extensions is None:
        extensions = (TOKEN_IDS_COLUMN,) if with_ids else ()
    tail = "".join("," + _extension_cell(r, c) for c in extensions)
    return ",".join((
        str(r.request_id), q(r.client_id), q(r.tenant_id), q(r.slo_class), q(r.session_id),
        str(r.round_index), q(r.prefix_group), str(r.prefix_length),
        "true" if r.streaming else "false", str(r.input_tokens), str(r.output_tokens),
        str(r.text_tokens), str(r.image_tokens), str(r.audio_tokens), str(r.video_tokens),
        _format_ratio(r.reason_ratio), q(r.model), str(r.deadline_us),
        str(r.server_input_tokens), str(r.arrival_time_us), str(r.send_time_us),
        str(r.first_chunk_time_us), str(r.last_chunk_time_us), str(r.num_chunks),
        q(r.status), q(r.error_message), q(r.finish_reason))) + tail + "\n"


def trace_csv_text(records: Iterable[TraceRecord]) -> str:
    """The whole CSV: header row and rows. Each extension column is present only when at
    least one record carries it (:func:`extension_columns`), so a trace without them is
    BLIS's layout, byte for byte."""
    records = list(records)
    ext = extension_columns(records)
    head = ",".join(TRACE_COLUMNS + ext) + "\n"
    return head + "".join(record_to_csv_line(r, extensions=ext) for r in records)


def _atomic_write(final: Path, text: str) -> Path:
    """Write ``text`` to a temporary sibling of ``final`` (respecting the umask)."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_trace(prefix_path: str | os.PathLike, header: TraceHeader | None,
                records: Iterable[TraceRecord]) -> tuple[Path, Path]:
    """Write ``<prefix>.yaml`` and ``<prefix>.csv``; returns both paths.

    ``header`` None means BLIS's export header (version 2, µs, generated, no warm-up). Both
    files are written to temporary names first and renamed only when both are complete, so a
    failure never leaves a half-written file. Errors are ConfigErrors naming the file.
    """
    prefix = Path(prefix_path)
    return write_trace_files(prefix.with_name(prefix.name + ".yaml"),
                             prefix.with_name(prefix.name + ".csv"), header, records)


def write_trace_files(header_path: str | os.PathLike, data_path: str | os.PathLike,
                      header: TraceHeader | None, records: Iterable[TraceRecord]) -> tuple[Path, Path]:
    """:func:`write_trace` to two explicit paths (``--trace-header`` / ``--trace-data`` of
    ``observe``): the same content, temporary files and all-or-nothing renames."""
    yaml_path, csv_path = Path(header_path), Path(data_path)
    if header is None:
        header = TraceHeader(trace_version=2)
    body = trace_csv_text(records)
    temps: list[Path] = []
    try:
        temps.append(_atomic_write(yaml_path, header_to_yaml(header)))
        temps.append(_atomic_write(csv_path, body))
        os.replace(temps[0], yaml_path)
        os.replace(temps[1], csv_path)
    except OSError as e:
        for t in temps:
            t.unlink(missing_ok=True)
        bad = e.filename or str(yaml_path)
        raise ConfigError(f"cannot write trace: {e.strerror or e}", file=str(bad)) from None
    return yaml_path, csv_path
