"""The optional ``input_token_ids`` TraceV2 column: reading, writing, replay (docs/workloads.md)."""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.rng import numpy_rng
from blis_simpy.workload.replay import VOCAB_SIZE, trace_requests
from blis_simpy.workload.tracev2 import TRACE_COLUMNS, TraceRecord
from blis_simpy.workload.tracev2_read import read_trace, read_trace_records
from blis_simpy.workload.tracev2_write import trace_csv_text, write_trace

from .wl_support import conformance_cases

HEADER_IDS = ",".join(TRACE_COLUMNS) + ",input_token_ids"
# request 0: prefix group g of 2 tokens + 3 suffix tokens = 5 IDs
ROW = "0,c,,,,0,g,2,false,3,4,0,0,0,0,0,,0,0,100,100,0,0,0,ok,,"


def _csv(tmp_path, *rows, header=HEADER_IDS):
    p = tmp_path / "t.csv"
    p.write_text("\n".join((header, *rows)) + "\n")
    return p


def rec(i, arrival, n_in, n_out, group="", plen=0, ids=None):
    return TraceRecord(request_id=i, arrival_time_us=arrival, input_tokens=n_in, output_tokens=n_out,
                       prefix_group=group, prefix_length=plen,
                       input_token_ids=None if ids is None else np.asarray(ids, dtype=np.int32))


def test_read_ids_and_empty_cell(tmp_path):
    p = _csv(tmp_path, ROW + ",5 0 127999 2147483647 9", ROW.replace("0,", "1,", 1) + ",")
    a, b = read_trace_records(p)
    assert a.input_token_ids.dtype == np.int32
    assert a.input_token_ids.tolist() == [5, 0, 127999, 2147483647, 9]
    assert b.input_token_ids is None


def test_column_ignored_without_the_header_name(tmp_path):
    p = _csv(tmp_path, ROW + ",1 2 3 4 5", header=",".join(TRACE_COLUMNS) + ",something_else")
    (r,) = read_trace_records(p)
    assert r.input_token_ids is None


@pytest.mark.parametrize("cell, problem", [
    ("1 2 x 4 5", "token ID 3 is 'x': expected decimal integers separated by single spaces"),
    ("1 2 -3 4 5", "token ID 3 is -3: must be >= 0"),
    ("1  2 3 4", "token ID 2 is '': expected decimal integers separated by single spaces"),
    ("1 2 3 4 5 ", "token ID 6 is '': expected decimal integers separated by single spaces"),
    ("1 2 3 4 +5", "token ID 5 is '+5': expected decimal integers separated by single spaces"),
    ("1 2 3 4 2147483648", "token ID 5 is larger than 2147483647"),
    ("1 2 3 4", "4 token IDs, expected prefix_length + input_tokens = 2 + 3 = 5"),
    ("1 2 3 4 5 6", "6 token IDs, expected prefix_length + input_tokens = 2 + 3 = 5"),
])
def test_bad_ids_name_file_line_column(tmp_path, cell, problem):
    p = _csv(tmp_path, ROW.replace("0,", "7,", 1) + ",1 2 3 4 5", ROW + "," + cell)
    with pytest.raises(ConfigError) as ei:
        read_trace_records(p)
    e = ei.value
    assert (e.file, e.line, e.field, e.problem) == (str(p), 3, "input_token_ids", problem)


def test_id_cap_per_file(tmp_path, monkeypatch):
    from blis_simpy.workload import tracev2_read
    monkeypatch.setattr(tracev2_read, "MAX_TOKEN_IDS_PER_FILE", 8)
    p = _csv(tmp_path, ROW + ",1 2 3 4 5", ROW.replace("0,", "1,", 1) + ",1 2 3 4 5")
    with pytest.raises(ConfigError) as ei:
        read_trace_records(p)
    assert (ei.value.line, ei.value.field, ei.value.problem) == (
        3, "input_token_ids", "more than 8 token IDs in the file")


def test_long_row_beyond_csv_default_field_limit(tmp_path):
    n = 40_000                                 # ~230 kB cell: above csv's 128 kB default
    row = f"0,,,,,0,,0,false,{n},1,0,0,0,0,0,,0,0,0,0,0,0,0,ok,,"
    p = _csv(tmp_path, row + "," + " ".join(str(100_000 + i) for i in range(n)))
    (r,) = read_trace_records(p)
    assert r.input_token_ids.size == n and r.input_token_ids[-1] == 100_000 + n - 1


def test_written_only_when_a_record_has_ids(tmp_path):
    plain = [rec(0, 0, 3, 1), rec(1, 5, 2, 1)]
    assert "input_token_ids" not in trace_csv_text(plain)
    mixed = [rec(0, 0, 3, 1, ids=[7, 8, 9]), rec(1, 5, 2, 1)]
    text = trace_csv_text(mixed)
    lines = text.splitlines()
    assert lines[0].endswith(",finish_reason,input_token_ids")
    assert lines[1].endswith(",ok,,,7 8 9") and lines[2].endswith(",ok,,,")
    y, c = write_trace(tmp_path / "tr", None, mixed)
    back = read_trace(y, c).records
    assert back[0].input_token_ids.tolist() == [7, 8, 9] and back[1].input_token_ids is None
    assert back == mixed                       # the other 27 fields round-trip too


@pytest.mark.parametrize("case", conformance_cases()[:3], ids=lambda p: p.name)
def test_conformance_traces_stay_byte_identical(case, tmp_path):
    tr = read_trace(case / "trace.yaml", case / "trace.csv")
    assert all(r.input_token_ids is None for r in tr.records)
    _, c = write_trace(tmp_path / "out", tr.header, tr.records)
    assert c.read_bytes() == (case / "trace.csv").read_bytes()


def test_conformance_cases_present():
    assert len(conformance_cases()) >= 3       # the parametrised test above is not empty


# ----------------------------------------------------------------------------- replay

def test_replay_uses_real_ids_and_keeps_every_other_draw():
    """Draw order by hand: group g's 2-token prefix, then one block of every record's
    suffix + output draws (3+2, 5+2, 3+1) — the record with IDs draws but does not use its
    suffix, so records 0 and 2 and every output are the same as without IDs."""
    seed = 2024
    real = [11, 12, 13, 14, 15]
    with_ids = [rec(0, 0, 3, 2, "g", 2), rec(1, 10, 5, 2, ids=real), rec(2, 20, 3, 1)]
    without = [rec(0, 0, 3, 2, "g", 2), rec(1, 10, 5, 2), rec(2, 20, 3, 1)]
    g = numpy_rng(seed)
    prefix = g.integers(0, VOCAB_SIZE, size=2, dtype=np.int32)
    block = g.integers(0, VOCAB_SIZE, size=5 + 7 + 4, dtype=np.int32)
    a = trace_requests(with_ids, seed)
    b = trace_requests(without, seed)
    assert a[0].input_tokens.tolist() == prefix.tolist() + block[0:3].tolist()
    assert a[0].output_tokens.tolist() == block[3:5].tolist()
    assert a[1].input_tokens.tolist() == real
    assert a[1].output_tokens.tolist() == block[10:12].tolist()
    assert a[2].input_tokens.tolist() == block[12:15].tolist()
    assert a[2].output_tokens.tolist() == block[15:16].tolist()
    assert b[1].input_tokens.tolist() == block[5:10].tolist()          # the unused draw
    for x, y in ((a[0], b[0]), (a[2], b[2])):
        assert np.array_equal(x.tokens, y.tokens)
    assert all(np.array_equal(x.output_tokens, y.output_tokens) for x, y in zip(a, b, strict=True))


def test_ids_replace_the_group_prefix_of_their_record():
    ids = list(range(100, 106))                # 2 prefix + 4 suffix tokens, all real
    recs = [rec(0, 0, 4, 1, "g", 2, ids=ids), rec(1, 5, 4, 1, "g", 2)]
    a, b = trace_requests(recs, 3)
    assert a.input_tokens.tolist() == ids and (a.prefix_length, a.prefix_group) == (2, "g")
    assert b.input_len == 6 and b.input_tokens[:2].tolist() != ids[:2]


def test_two_prompts_sharing_1000_real_tokens_share_them_in_replay(tmp_path):
    g = np.random.default_rng(5)
    shared = g.integers(0, VOCAB_SIZE, size=1000)
    p1 = np.concatenate((shared, g.integers(0, VOCAB_SIZE, size=300)))
    p2 = np.concatenate((shared, g.integers(0, VOCAB_SIZE, size=40)))
    y, c = write_trace(tmp_path / "tr", None, [rec(0, 0, 1300, 5, ids=p1), rec(1, 1000, 1040, 5, ids=p2)])
    r1, r2 = trace_requests(read_trace(y, c).records, 42)
    assert np.array_equal(r1.input_tokens[:1000], r2.input_tokens[:1000])
    assert np.array_equal(r2.input_tokens, p2) and r1.input_tokens[1000] != r2.input_tokens[1000]
