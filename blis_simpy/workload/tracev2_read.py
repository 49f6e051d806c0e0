"""Reading a TraceV2 trace (docs/workloads.md, "TraceV2"): the YAML header and the CSV.

Reading is strict: unknown header keys, malformed numbers, negative counts, out-of-range
ratios and deadlines before arrival are :class:`~blis_simpy.errors.ConfigError` naming the
file, the 1-based line and the column / key. Our extension columns
(:data:`~blis_simpy.workload.tracev2.EXTENSION_COLUMNS`) are recognised by name after the 27
BLIS ones; other extra columns named in the header row are ignored, as BLIS does. Every
``*_us`` column is an integer number of µs; token columns are token counts.

Caps and CSV rules (docs/workloads.md, "TraceV2"): a token count cell is at most
:data:`MAX_TRACE_TOKENS` (2^24, the cap of a scenario's token keys); a row may not have more
cells than the header row has columns; a ``"`` inside an unquoted field (a bare quote) is an
error, as in Go's ``encoding/csv``; one field may hold up to :data:`MAX_FIELD_CHARS`
characters (an ``input_token_ids`` cell of a long prompt is long).
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from operator import itemgetter

import numpy as np
from pydantic import ValidationError

from blis_simpy.bounds import MAX_TOKENS
from blis_simpy.errors import ConfigError
from blis_simpy.infile import TOO_MANY_DIGITS, open_input, too_many_digits
from blis_simpy.workload import _yaml
from blis_simpy.workload.tracev2 import (
    EXTENSION_COLUMNS,
    MAX_TOKEN_IDS_PER_FILE,
    NUM_COLUMNS,
    SCHEDULED_COLUMN,
    TOKEN_IDS_COLUMN,
    TRACE_COLUMNS,
    TraceHeader,
    TraceRecord,
    TraceV2,
)

#: the csv field-size limit while reading (characters of one field): room for the most token
#: IDs a file may carry, each up to 10 digits and a space
MAX_FIELD_CHARS = 12 * MAX_TOKEN_IDS_PER_FILE
#: cap on a token count cell (prefix_length, input/output/text/image/audio/video tokens,
#: server_input_tokens): the one token cap (``bounds.MAX_TOKENS``, 2^24)
MAX_TRACE_TOKENS = MAX_TOKENS
_MAX_TOKEN_ID = (1 << 31) - 1                     # IDs are kept as int32


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
        raise _yaml.from_validation_error(e, path, node, TraceHeader) from None


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
        if too_many_digits(s):
            raise self.err(col, TOO_MANY_DIGITS)
        v = int(s)
        if v < 0 and col in _NONNEG:
            raise self.err(col, f"must be >= 0, got {v}")
        if v > _INT64_MAX or v < _INT64_MIN:
            raise self.err(col, f"out of the int64 range: {s}")
        return v

    def float(self, i: int) -> float:
        s = self.row[i]
        if not (s.isascii() and s.isdigit()) and not _FLOAT_RE.match(s):
            raise self.err(TRACE_COLUMNS[i], f"expected a number, got {s!r}")
        return float(s)

    def bool(self, i: int) -> bool:
        v = _BOOLS.get(self.row[i])
        if v is None:
            raise self.err(TRACE_COLUMNS[i], f"expected true or false, got {self.row[i]!r}")
        return v


_TOKEN_COLS = ("prefix_length", "input_tokens", "output_tokens", "text_tokens", "image_tokens",
               "audio_tokens", "video_tokens", "server_input_tokens")
_INT_COLS = (0, 5, 7, 9, 10, 11, 12, 13, 14, 17, 18, 19, 20, 21, 22, 23)
_plain_ints = itemgetter(*_INT_COLS)
_INT64_DIGITS = len(str(_INT64_MAX)) - 1   # any number of this many digits fits an int64


def _parse_row(p: _RowParser) -> TraceRecord:
    r = p.row
    cells = _plain_ints(r)
    digits = "".join(cells)
    if all(cells) and digits.isascii() and digits.isdigit() and max(map(len, cells)) <= _INT64_DIGITS:
        # the common row: every integer cell is plain ASCII digits that fit an int64
        c0, c5, c7, c9, c10, c11, c12, c13, c14, c17, c18, c19, c20, c21, c22, c23 = map(int, cells)
        rec = TraceRecord(
            c0, r[1], r[2], r[3], r[4], c5, r[6], c7, p.bool(8), c9, c10, c11, c12,
            c13, c14, p.float(15), r[16], c17, c18, c19, c20, c21, c22, c23,
            r[24], r[25], r[26])
    else:                                # cell by cell, left to right: the located error
        i = p.int
        rec = TraceRecord(
            i(0), r[1], r[2], r[3], r[4], i(5), r[6], i(7), p.bool(8), i(9), i(10), i(11), i(12),
            i(13), i(14), p.float(15), r[16], i(17), i(18), i(19), i(20), i(21), i(22), i(23),
            r[24], r[25], r[26])
    if max(rec.prefix_length, rec.input_tokens, rec.output_tokens, rec.text_tokens,
           rec.image_tokens, rec.audio_tokens, rec.video_tokens,
           rec.server_input_tokens) > MAX_TRACE_TOKENS:
        for col in _TOKEN_COLS:
            if getattr(rec, col) > MAX_TRACE_TOKENS:
                raise p.err(col, f"{getattr(rec, col)} tokens is more than the cap of "
                                 f"{MAX_TRACE_TOKENS}")
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
                if _INT_RE.match(tok) and tok.startswith("-") and tok.strip("-0"):
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


def _bare_quote_column(text: str) -> int | None:
    """The 0-based column of the first unquoted field of the raw record ``text`` that holds a
    ``"`` (Go's ``encoding/csv``: "bare \" in non-quoted field"), else None. Quoted fields
    were already checked by Python's strict reader."""
    col, i, n = 0, 0, len(text)
    start = True
    while i < n:
        ch = text[i]
        if start and ch == '"':               # a quoted field: skip to its closing quote
            i = text.find('"', i + 1)
            while i != -1 and text.startswith('""', i):
                i = text.find('"', i + 2)
            if i == -1:
                return None
            start = False
        elif ch == ",":
            col += 1
            start = True
        elif ch in "\r\n":
            start = True
        elif ch == '"':
            return col
        else:
            start = False
        i += 1
    return None


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
    return list(iter_trace_records(path))


#: rows parsed column-wise at a time (docs/performance.md, "Trace parsing")
BLOCK_ROWS = 4096
#: characters a block stops at (rows are not split): a file of long rows is not held whole
BLOCK_CHARS = 1 << 24
_FLOAT_COL, _BOOL_COL = 15, 8
_TOKEN_IDX = tuple(TRACE_COLUMNS.index(c) for c in _TOKEN_COLS)
_ID_IDX, _DEADLINE_IDX, _ARRIVAL_IDX = (TRACE_COLUMNS.index(c) for c in
                                        ("request_id", "deadline_us", "arrival_time_us"))


def iter_trace_records(path: str | os.PathLike, *, unique_ids: bool = True) -> Iterator[TraceRecord]:
    """:func:`read_trace_records` one row at a time (the same checks, the same errors, raised
    when the reader reaches the row); only the request IDs seen so far are kept.
    ``unique_ids=False`` skips the duplicate-ID check (and that memory) on a file already
    read once with it.

    Plain rows are parsed column-wise, :data:`BLOCK_ROWS` at a time (:func:`_plain_block`);
    from the first block that is not plain (a quote, a blank line, a short or long row, an
    extension column, any cell the checks refuse) to the end of the file every row goes
    through the row parser, which raises the located error."""
    path = str(path)
    st = _ReadState(path, unique_ids)
    # process-wide and only ever raised: a reader suspended in another generator keeps it
    if csv.field_size_limit() < MAX_FIELD_CHARS:
        csv.field_size_limit(MAX_FIELD_CHARS)
    try:
        with open_input(path, encoding="utf-8-sig", newline="") as f:
            rest = f
            first = f.readline()
            names = _plain_split([first])
            if names is None:
                rest = chain((first,), f)              # the row parser reads the header too
            else:
                st.line = 1
                st.header(names[0])
                while st.ids_col < 0 and st.sched_col < 0:
                    block, failed = _read_block(f)
                    records = None if failed else _plain_block(block, st) if block else []
                    if records is None:                # the row parser takes it from here
                        rest = chain(block, _raising(failed) if failed else f)
                        break
                    if not records:
                        break
                    yield from records
            yield from _row_records(rest, st)
    except FileNotFoundError:
        raise ConfigError("no such file", file=path) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a file", file=path) from None
    except csv.Error as e:
        raise ConfigError(f"malformed CSV: {e}", file=path, line=st.line + 1) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"not valid UTF-8 ({e.reason})", file=path, line=st.line + 1) from None
    except OSError as e:
        raise ConfigError(f"cannot read file: {e.strerror or e}", file=path) from None


def _read_block(f) -> tuple[list[str], UnicodeDecodeError | None]:
    """The next :data:`BLOCK_ROWS` lines of ``f`` (fewer at the end of the file, or once they
    pass :data:`BLOCK_CHARS` characters), and the
    decoding error that stopped the read, if one did (the row parser reaches it after the
    lines before it, on the same line as it would have)."""
    block: list[str] = []
    size = 0
    try:
        for line in islice(f, BLOCK_ROWS):
            block.append(line)
            size += len(line)
            if size > BLOCK_CHARS:           # long rows: a smaller block
                break
    except UnicodeDecodeError as exc:
        return block, exc
    return block, None


def _raising(exc: BaseException) -> Iterator[str]:
    raise exc
    yield ""     # a generator: raises when the reader reaches it


class _ReadState:
    """Where a read of one CSV is: the last line read, the header row's names and extension
    columns, the request IDs seen (ID → line) and the token IDs counted."""

    __slots__ = ("path", "unique_ids", "line", "names", "ids_col", "sched_col", "seen_ids",
                 "n_ids")

    def __init__(self, path: str, unique_ids: bool):
        self.path = path
        self.unique_ids = unique_ids
        self.line = 0
        self.names: list[str] | None = None
        self.ids_col = self.sched_col = -1
        self.seen_ids: dict[int, int] = {}
        self.n_ids = 0

    def header(self, row: list[str]) -> None:
        ext = _check_header_row(row, self.path)
        self.ids_col = ext.get(TOKEN_IDS_COLUMN, -1)
        self.sched_col = ext.get(SCHEDULED_COLUMN, -1)
        self.names = row


def _plain_split(block: list[str]) -> list[list[str]] | None:
    """The cells of ``block``'s lines when every line is a plain record (no quote, no NUL,
    not blank, ended by one line break or the end of the file), else None: then Python's csv
    reader would split them the same way."""
    text = "".join(block)
    if '"' in text or "\0" in text:
        return None
    if len(text) > MAX_FIELD_CHARS and max(map(len, block)) > MAX_FIELD_CHARS:
        return None                          # the csv reader refuses a field this long
    lines = text.replace("\r\n", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) != len(block) or "\r" in text.replace("\r\n", "") or not all(lines):
        return None
    return [line.split(",") for line in lines]


def _plain_block(block: list[str], st: _ReadState) -> list[TraceRecord] | None:
    """The records of the lines ``block`` (rows following ``st.line``), parsed column by
    column; None when a row is not plain or any check would refuse a cell (the row parser
    then reads the block again and raises the located error). ``st`` advances only on
    success."""
    rows = _plain_split(block)
    ncols = len(st.names)
    if rows is None or ncols != NUM_COLUMNS or any(len(r) != ncols for r in rows):
        return None
    cols = list(zip(*rows, strict=True))
    n = len(rows)
    for j in _INT_COLS:
        col = cols[j]
        if col.count(col[0]) == n:             # one value (zero counts, unused times)
            v = col[0]
            if not (v.isascii() and v.isdigit() and len(v) <= _INT64_DIGITS):
                return None
            cols[j] = [int(v)] * n
            continue
        digits = "".join(col)
        if not (digits.isascii() and digits.isdigit() and min(map(len, col)) > 0
                and max(map(len, col)) <= _INT64_DIGITS):
            return None
        cols[j] = list(map(int, col))
    flags = set(cols[_BOOL_COL])
    if not _BOOLS.keys() >= flags:
        return None
    cols[_BOOL_COL] = ([_BOOLS[flags.pop()]] * n if len(flags) == 1
                       else list(map(_BOOLS.__getitem__, cols[_BOOL_COL])))
    ratios = {}
    for v in set(cols[_FLOAT_COL]):
        if not ((v.isascii() and v.isdigit()) or _FLOAT_RE.match(v)):
            return None
        ratios[v] = x = float(v)
        if not 0.0 <= x <= 1.0:
            return None
    cols[_FLOAT_COL] = ([ratios.popitem()[1]] * n if len(ratios) == 1
                        else list(map(ratios.__getitem__, cols[_FLOAT_COL])))
    if max(max(cols[j]) for j in _TOKEN_IDX) > MAX_TRACE_TOKENS:
        return None
    if any(d and d < a for d, a in zip(cols[_DEADLINE_IDX], cols[_ARRIVAL_IDX], strict=True)):
        return None
    first = st.line + 1
    if st.unique_ids:
        ids = cols[_ID_IDX]
        seen = st.seen_ids
        if len(set(ids)) != len(ids) or not seen.keys().isdisjoint(ids):
            return None
        seen.update(zip(ids, range(first, first + len(ids)), strict=True))
    st.line += n
    return list(map(TraceRecord, *cols))


def _row_records(lines: Iterable[str], st: _ReadState) -> Iterator[TraceRecord]:
    """The records of the rest of the file (``lines``, following ``st.line``) parsed row by
    row, with every check and its located error; reads the header row if not read yet."""
    path = st.path
    p = _RowParser(path)
    raw: list[str] = []                  # the text lines of the current record

    def recorded(f):
        for text in f:
            raw.append(text)
            yield text

    reader = csv.reader(recorded(lines), strict=True)
    offset = st.line
    for row in reader:
        start, st.line = st.line + 1, offset + reader.line_num
        text = raw[0] if len(raw) == 1 else "".join(raw)
        raw.clear()
        if not row:
            continue  # blank line (Go's csv reader skips them too)
        if '"' in text:
            k = _bare_quote_column(text)
            if k is not None:
                cols = st.names if st.names is not None else row
                col = cols[k].strip() if k < len(cols) else f"column-{k + 1}"
                raise ConfigError('bare " in an unquoted field (quote the field and '
                                  'double its quotes)', file=path, line=start, field=col)
        if st.names is None:
            st.header(row)
            continue
        names = st.names
        p.line = start
        if len(row) < NUM_COLUMNS:
            raise ConfigError(f"missing: the row has {len(row)} columns, expected {NUM_COLUMNS}",
                              file=path, line=start, field=TRACE_COLUMNS[len(row)])
        if len(row) > len(names):
            raise ConfigError(f"extra cell: the row has {len(row)} cells, the header row "
                              f"names {len(names)} columns", file=path, line=start,
                              field=f"column-{len(names) + 1}")
        p.row = row
        rec = _parse_row(p)
        if 0 <= st.ids_col < len(row):
            st.n_ids += row[st.ids_col].count(" ") + 1
            if st.n_ids > MAX_TOKEN_IDS_PER_FILE:
                raise p.err(TOKEN_IDS_COLUMN, f"more than {MAX_TOKEN_IDS_PER_FILE} token IDs "
                                              "in the file")
            rec.input_token_ids = _parse_token_ids(p, rec, st.ids_col)
        if 0 <= st.sched_col < len(row):
            rec.scheduled_time_us = _parse_scheduled(p, rec, st.sched_col)
        first = st.seen_ids.setdefault(rec.request_id, start) if st.unique_ids else start
        if first != start:
            raise p.err("request_id", f"duplicate request_id {rec.request_id} "
                                      f"(first on line {first})")
        yield rec
    if st.names is None:
        raise ConfigError("missing CSV header row", file=path, line=1)


def read_trace(header_path: str | os.PathLike, data_path: str | os.PathLike) -> TraceV2:
    """Load a complete trace (header, then data)."""
    return TraceV2(read_trace_header(header_path), read_trace_records(data_path))
