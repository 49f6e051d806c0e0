"""The column-wise TraceV2 reader (workload/tracev2_read.py, docs/performance.md "Trace
parsing"): the same records and the same located errors as the row parser, whichever block
a row falls in."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_simpy.errors import ConfigError
from blis_simpy.workload import tracev2_read as R
from blis_simpy.workload.tracev2 import TRACE_COLUMNS
from blis_simpy.workload.tracev2_read import read_trace_records

from .test_workload_tracev2 import GOOD_ROW, HEADER_ROW


def _row(i: int, **cells: str) -> str:
    row = GOOD_ROW.split(",")
    row[0] = str(i)
    for col, value in cells.items():
        row[TRACE_COLUMNS.index(col)] = value
    return ",".join(row)


def _outcome(path):
    """The records (as tuples) or the error line the reader gives."""
    try:
        return [tuple(vars(r).values()) if hasattr(r, "__dict__") else r for r in read_trace_records(path)]
    except ConfigError as exc:
        return str(exc)


def _row_parser_only(monkeypatch):
    monkeypatch.setattr(R, "_plain_block", lambda block, st: None)


def test_plain_rows_are_read_by_columns(tmp_path, monkeypatch):
    p = tmp_path / "t.csv"
    p.write_text("\n".join([HEADER_ROW, *(_row(i, arrival_time_us=str(100 + i)) for i in range(10))]))
    monkeypatch.setattr(R, "BLOCK_ROWS", 4)
    monkeypatch.setattr(R, "_parse_row", None)            # the row parser would fail
    recs = read_trace_records(p)
    assert [(r.request_id, r.arrival_time_us, r.prefix_length, r.streaming) for r in recs] == [
        (i, 100 + i, 10, False) for i in range(10)]


@pytest.mark.parametrize("bad, line, field, problem", [
    (_row(7, arrival_time_us="12.5"), 9, "arrival_time_us", "expected an integer, got '12.5'"),
    (_row(7, output_tokens="-3"), 9, "output_tokens", "must be >= 0, got -3"),
    (_row(7, input_tokens="16777217"), 9, "input_tokens",
     "16777217 tokens is more than the cap of 16777216"),
    (_row(7, reason_ratio="1.5"), 9, "reason_ratio", "must be in [0, 1], got 1.5"),
    (_row(7, streaming="yes"), 9, "streaming", "expected true or false, got 'yes'"),
    (_row(7, deadline_us="50"), 9, "deadline_us", "deadline 50 is before arrival_time_us 100"),
    (_row(2), 9, "request_id", "duplicate request_id 2 (first on line 4)"),
    (_row(7, client_id='a"b'), 9, "client_id",
     'bare " in an unquoted field (quote the field and double its quotes)'),
    (_row(7) + ",x", 9, "column-28", "extra cell: the row has 28 cells, the header row names 27 columns"),
    ("7,c,t", 9, "slo_class", "missing: the row has 3 columns, expected 27"),
])
def test_a_bad_row_after_plain_blocks_keeps_its_located_error(tmp_path, monkeypatch, bad, line,
                                                             field, problem):
    # rows 0-6 on lines 2-8 (two plain blocks of 3 and the start of a third), the bad row on 9
    monkeypatch.setattr(R, "BLOCK_ROWS", 3)
    p = tmp_path / "t.csv"
    p.write_text("\n".join([HEADER_ROW, *(_row(i) for i in range(7)), bad, _row(8)]) + "\n")
    with pytest.raises(ConfigError) as ei:
        read_trace_records(p)
    e = ei.value
    assert (e.file, e.line, e.field, e.problem) == (str(p), line, field, problem)
    by_columns = str(e)
    _row_parser_only(monkeypatch)
    assert _outcome(p) == by_columns


def test_bad_utf8_after_plain_blocks_is_on_the_same_line(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "BLOCK_ROWS", 2)
    p = tmp_path / "t.csv"
    p.write_bytes(("\n".join([HEADER_ROW, *(_row(i) for i in range(5))]) + "\n").encode()
                  + b"5,\xff\xfe,t\n")
    by_columns = _outcome(p)
    assert "not valid UTF-8" in by_columns
    _row_parser_only(monkeypatch)
    assert _outcome(p) == by_columns


INTS = st.one_of(st.integers(0, 3).map(str), st.sampled_from(["007", "+5", "-0", "", "x", "-2",
                                                               "16777216", "16777217", "1_0"]))
CELL = {
    "prefix_length": INTS, "input_tokens": INTS, "output_tokens": INTS, "text_tokens": INTS,
    "round_index": INTS, "num_chunks": INTS,
    "arrival_time_us": st.sampled_from(["0", "5", "100", "99999999999999999999", "1e3"]),
    "deadline_us": st.sampled_from(["0", "5", "100", "200"]),
    "streaming": st.sampled_from(["false", "true", "T", "0", "1", "yes"]),
    "reason_ratio": st.sampled_from(["0", "0.5", ".5", "1e-1", "1", "1.5", "nan"]),
    "client_id": st.sampled_from(["", "c", "a b", '"q,uoted"', '"multi\nline"', 'a"b']),
}
ROW = st.fixed_dictionaries({}, optional=CELL)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.one_of(ROW, st.just(None)), max_size=12),
       ids=st.sampled_from(["unique", "repeat"]), eol=st.sampled_from(["\n", "\r\n"]),
       block=st.integers(1, 4), chars=st.sampled_from([1 << 24, 150]))
def test_column_parser_equals_row_parser_on_random_traces(tmp_path, monkeypatch, rows, ids, eol,
                                                          block, chars):
    lines = [HEADER_ROW]
    for i, cells in enumerate(rows):          # None: a blank line
        lines.append("" if cells is None else _row(i if ids == "unique" else i % 3, **cells))
    p = tmp_path / "t.csv"
    p.write_bytes((eol.join(lines) + eol).encode())
    with monkeypatch.context() as m:
        m.setattr(R, "BLOCK_ROWS", block)
        m.setattr(R, "BLOCK_CHARS", chars)            # 150: a block ends after 2 rows
        by_columns = _outcome(p)
    with monkeypatch.context() as m:
        _row_parser_only(m)
        by_rows = _outcome(p)
    assert by_columns == by_rows
