"""The optional ``scheduled_time_us`` TraceV2 column, and extension columns recognised by
name in any order (docs/workloads.md)."""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.workload.tracev2 import TRACE_COLUMNS, TraceRecord
from blis_simpy.workload.tracev2_read import read_trace, read_trace_records
from blis_simpy.workload.tracev2_write import trace_csv_text, write_trace

from .wl_support import conformance_cases

BLIS = ",".join(TRACE_COLUMNS)
# request 0: arrives (and is sent) at 100 µs; prefix group g of 2 tokens + 3 suffix tokens
ROW = "0,c,,,,0,g,2,false,3,4,0,0,0,0,0,,0,0,100,100,0,0,0,ok,,"
ROW1 = ROW.replace("0,", "1,", 1)


def _csv(tmp_path, header, *rows):
    p = tmp_path / "t.csv"
    p.write_text("\n".join((header, *rows)) + "\n")
    return p


def _got(records):
    return [(r.request_id, r.scheduled_time_us,
             None if r.input_token_ids is None else r.input_token_ids.tolist()) for r in records]


def test_read_scheduled_alone(tmp_path):
    p = _csv(tmp_path, BLIS + ",scheduled_time_us", ROW + ",2500", ROW1 + ",", ROW1.replace("1,", "2,", 1) + ",0")
    assert _got(read_trace_records(p)) == [(0, 2500, None), (1, 0, None), (2, 0, None)]


def test_extension_columns_in_any_order_among_unknown_ones(tmp_path):
    """The same two rows with the extension columns in both orders, with an unknown column
    before, between and after them (ignored, as BLIS ignores extra columns)."""
    a = _csv(tmp_path, BLIS + ",input_token_ids,scheduled_time_us",
             ROW + ",5 6 7 8 9,100", ROW1 + ",,350")
    want = [(0, 100, [5, 6, 7, 8, 9]), (1, 350, None)]
    assert _got(read_trace_records(a)) == want
    b = _csv(tmp_path, BLIS + ",note,scheduled_time_us,scheduled_time_ms,input_token_ids,x",
             ROW + ",hi,100,7,5 6 7 8 9,y", ROW1 + ",,350,,,")
    assert _got(read_trace_records(b)) == want


def test_without_the_column_or_under_another_name(tmp_path):
    for header in (BLIS, BLIS + ",scheduled_time_ms", BLIS + ", scheduled_time_us_x"):
        cells = "" if header == BLIS else ",2500"
        (r,) = read_trace_records(_csv(tmp_path, header, ROW + cells))
        assert r.scheduled_time_us == 0


def test_short_row_leaves_it_unknown(tmp_path):
    p = _csv(tmp_path, BLIS + ",input_token_ids,scheduled_time_us", ROW + ",1 2 3 4 5", ROW1)
    assert _got(read_trace_records(p)) == [(0, 0, [1, 2, 3, 4, 5]), (1, 0, None)]


@pytest.mark.parametrize("cell, problem", [
    ("x", "expected an integer, got 'x'"),
    ("1.5", "expected an integer, got '1.5'"),
    ("-5", "must be >= 0, got -5"),
    ("99", "scheduled at 99, before arrival_time_us 100"),
    ("9223372036854775808", "out of the int64 range: 9223372036854775808"),
])
@pytest.mark.parametrize("order", ["scheduled_time_us,input_token_ids", "input_token_ids,scheduled_time_us"])
def test_bad_values_name_file_line_column(tmp_path, cell, problem, order):
    good, bad = ("100", "1 2 3 4 5"), (cell, "1 2 3 4 5")
    if order.startswith("input"):
        good, bad = good[::-1], bad[::-1]
    p = _csv(tmp_path, BLIS + ",extra," + order, ROW1 + ",," + ",".join(good), "", ROW + ",," + ",".join(bad))
    with pytest.raises(ConfigError) as ei:
        read_trace_records(p)
    e = ei.value
    assert (e.file, e.line, e.field, e.problem) == (str(p), 4, "scheduled_time_us", problem)


def test_a_column_named_twice_is_an_error(tmp_path):
    p = _csv(tmp_path, BLIS + ",scheduled_time_us,x,scheduled_time_us", ROW + ",100,,100")
    with pytest.raises(ConfigError) as ei:
        read_trace_records(p)
    e = ei.value
    assert (e.line, e.field, e.problem) == (
        1, "scheduled_time_us", "header columns 28 and 30 are both 'scheduled_time_us'")


def rec(i, arrival, sched=0, ids=None):
    return TraceRecord(request_id=i, arrival_time_us=arrival, send_time_us=arrival,
                       input_tokens=2 if ids is None else len(ids), output_tokens=1, scheduled_time_us=sched,
                       input_token_ids=None if ids is None else np.asarray(ids, dtype=np.int32))


def test_written_only_when_a_record_has_a_time(tmp_path):
    assert trace_csv_text([rec(0, 0), rec(1, 5)]).splitlines()[0] == BLIS
    mixed = [rec(0, 0, 2500), rec(1, 5)]
    lines = trace_csv_text(mixed).splitlines()
    assert lines[0] == BLIS + ",scheduled_time_us"
    assert lines[1] == "0,,,,,0,,0,false,2,1,0,0,0,0,0,,0,0,0,0,0,0,0,ok,,,2500"
    assert lines[2] == "1,,,,,0,,0,false,2,1,0,0,0,0,0,,0,0,5,5,0,0,0,ok,,,0"
    y, c = write_trace(tmp_path / "tr", None, mixed)
    assert read_trace(y, c).records == mixed                  # every field, scheduled included


def test_both_columns_written_ids_first_and_read_back(tmp_path):
    recs = [rec(0, 0, 0, ids=[7, 8, 9]), rec(1, 5, 40)]
    lines = trace_csv_text(recs).splitlines()
    assert lines[0] == BLIS + ",input_token_ids,scheduled_time_us"
    assert lines[1].endswith(",ok,,,7 8 9,0") and lines[2].endswith(",ok,,,,40")
    y, c = write_trace(tmp_path / "tr", None, recs)
    back = read_trace(y, c).records
    assert back == recs and _got(back) == [(0, 0, [7, 8, 9]), (1, 40, None)]


@pytest.mark.parametrize("case", conformance_cases()[:3], ids=lambda p: p.name)
def test_conformance_traces_have_no_extension_and_stay_byte_identical(case, tmp_path):
    tr = read_trace(case / "trace.yaml", case / "trace.csv")
    assert all(r.scheduled_time_us == 0 and r.input_token_ids is None for r in tr.records)
    _, c = write_trace(tmp_path / "out", tr.header, tr.records)
    assert c.read_bytes() == (case / "trace.csv").read_bytes()


def test_conformance_cases_present():
    assert len(conformance_cases()) >= 3       # the parametrised test above is not empty
