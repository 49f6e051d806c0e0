"""TraceV2 reading, validation errors and BLIS-layout writing (docs/workloads.md, "TraceV2")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_simpy.errors import ConfigError
from blis_simpy.workload.tracev2 import TRACE_COLUMNS, TraceHeader, TraceNetwork, TraceRecord, TraceServer
from blis_simpy.workload.tracev2_read import (
    MAX_FIELD_CHARS,
    MAX_TRACE_TOKENS,
    read_trace,
    read_trace_header,
    read_trace_records,
)
from blis_simpy.workload.tracev2_write import header_to_yaml, record_to_csv_line, write_trace

from .wl_support import conformance_cases

HEADER_ROW = ",".join(TRACE_COLUMNS)
GOOD_ROW = "0,c,t,standard,,0,g,10,false,5,7,0,0,0,0,0,,0,0,100,100,0,0,0,ok,,"
CASES = conformance_cases()


def _csv(tmp_path: Path, *rows: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text("\n".join((HEADER_ROW, *rows)) + "\n")
    return p


def _err(fn, *args) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        fn(*args)
    return ei.value


# ----------------------------------------------------------------------- conformance traces

@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name if p else "none")
def test_conformance_trace_reads_and_rewrites_byte_identical(case, tmp_path):
    tr = read_trace(case / "trace.yaml", case / "trace.csv")
    n_lines = len((case / "trace.csv").read_text().splitlines())
    assert len(tr.records) == n_lines - 1 > 0
    assert tr.header.trace_version == 2 and tr.header.mode == "generated"
    assert all(r.arrival_time_us >= 0 for r in tr.records)
    y, c = write_trace(tmp_path / "out", tr.header, tr.records)
    assert y.read_bytes() == (case / "trace.yaml").read_bytes()
    assert c.read_bytes() == (case / "trace.csv").read_bytes()


def test_conformance_values_parsed(conformance_dir):
    tr = read_trace(conformance_dir / "E34_preset_chatbot" / "trace.yaml",
                    conformance_dir / "E34_preset_chatbot" / "trace.csv")
    assert tr.header.workload_seed == 42
    r = tr.records[0]
    assert (r.request_id, r.client_id, r.input_tokens, r.output_tokens, r.arrival_time_us,
            r.first_chunk_time_us, r.status, r.streaming) == (
        0, "distribution", 128, 528, 125000, 136773, "ok", False)


# ----------------------------------------------------------------------- round trip

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=12)
_count = st.integers(min_value=0, max_value=10**9)
_tokens = st.integers(min_value=0, max_value=MAX_TRACE_TOKENS)
_ts = st.integers(min_value=0, max_value=2**62)


@st.composite
def _records(draw):
    n = draw(st.integers(min_value=0, max_value=6))
    out = []
    for i in range(n):
        arrival = draw(_ts)
        out.append(TraceRecord(
            request_id=i, client_id=draw(_text), tenant_id=draw(_text), slo_class=draw(_text),
            session_id=draw(_text), round_index=draw(_count), prefix_group=draw(_text),
            prefix_length=draw(_tokens), streaming=draw(st.booleans()), input_tokens=draw(_tokens),
            output_tokens=draw(_tokens), text_tokens=draw(_tokens), image_tokens=draw(_tokens),
            audio_tokens=draw(_tokens), video_tokens=draw(_tokens),
            reason_ratio=draw(st.floats(min_value=0, max_value=1)), model=draw(_text),
            deadline_us=draw(st.sampled_from([0, arrival, arrival + 5])),
            server_input_tokens=draw(_tokens), arrival_time_us=arrival, send_time_us=draw(_ts),
            first_chunk_time_us=draw(_ts), last_chunk_time_us=draw(_ts), num_chunks=draw(_count),
            status=draw(_text), error_message=draw(_text), finish_reason=draw(_text)))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=_records(), seed=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
       created=_text)
def test_write_then_read_round_trip(tmp_path, records, seed, created):
    header = TraceHeader(trace_version=2, created_at=created, mode="real", warm_up_requests=3,
                         workload_seed=seed, workload_spec="spec: x.yaml",
                         server=TraceServer(type="vllm", model="m", tensor_parallel=2,
                                            gpu_memory_utilization=0.9, max_model_len=4096),
                         network=TraceNetwork(measured_rtt_ms=1e6))
    y, c = write_trace(tmp_path / "rt", header, records)
    back = read_trace(y, c)
    assert back.header == header
    assert back.records == records
    assert sorted(os.listdir(tmp_path)) == ["rt.csv", "rt.yaml"]  # no temp files left


def test_header_layout_matches_go_yaml():
    h = TraceHeader(trace_version=2, workload_seed=7,
                    server=TraceServer(type="vllm", model="a/b", tensor_parallel=1,
                                       gpu_memory_utilization=0.9),
                    network=TraceNetwork(measured_rtt_ms=1234567.0))
    assert header_to_yaml(h) == (
        "trace_version: 2\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"
        "workload_seed: 7\nserver:\n    type: vllm\n    model: a/b\n    tensor_parallel: 1\n"
        "    max_num_seqs: 0\n    block_size: 0\n    gpu_memory_utilization: 0.9\n"
        "    max_model_len: 0\nnetwork:\n    measured_rtt_ms: 1.234567e+06\n")
    # strings that would read back as other types are quoted
    assert 'created_at: "true"' in header_to_yaml(TraceHeader(trace_version=2, created_at="true"))


def test_csv_quoting_like_go():
    r = TraceRecord(client_id='a,b', tenant_id='say "hi"', slo_class=" lead", model="x\ny",
                    reason_ratio=0.25, streaming=True)
    line = record_to_csv_line(r)
    assert line == ('0,"a,b","say ""hi"""," lead",,0,,0,true,0,0,0,0,0,0,0.25,"x\ny",'
                    '0,0,0,0,0,0,0,ok,,\n')


def test_failed_write_leaves_existing_files_untouched(tmp_path):
    write_trace(tmp_path / "t", None, [TraceRecord()])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def boom():
        yield TraceRecord(request_id=1)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_trace(tmp_path / "t", None, boom())
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_write_into_missing_directory_is_config_error(tmp_path):
    e = _err(write_trace, tmp_path / "nope" / "t", None, [])
    assert "nope" in e.file and "cannot write trace" in e.problem
    assert not (tmp_path / "nope").exists()


# ----------------------------------------------------------------------- bad input

def test_wrong_column_count(tmp_path):
    p = _csv(tmp_path, GOOD_ROW, "1,c,t")
    e = _err(read_trace_records, p)
    assert (e.file, e.line, e.field) == (str(p), 3, "slo_class")
    assert str(e) == f"{p}:3: slo_class: missing: the row has 3 columns, expected 27"


def test_extra_columns_tolerated_and_blank_lines_skipped(tmp_path):
    # columns the header row names after the 27 are tolerated (as BLIS does)
    p = tmp_path / "t.csv"
    p.write_text(HEADER_ROW + ",mine,more\n" + GOOD_ROW + ",extra,more\n\n"
                 + GOOD_ROW.replace("0,", "1,", 1) + ",,\n")
    recs = read_trace_records(p)
    assert [r.request_id for r in recs] == [0, 1]


@pytest.mark.parametrize("col, value, problem", [
    ("arrival_time_us", "12.5", "expected an integer, got '12.5'"),
    ("arrival_time_us", "", "expected an integer, got ''"),
    ("input_tokens", "1_000", "expected an integer, got '1_000'"),
    ("deadline_us", " 7", "expected an integer, got ' 7'"),
    ("reason_ratio", "abc", "expected a number, got 'abc'"),
    ("streaming", "yes", "expected true or false, got 'yes'"),
    ("output_tokens", "-3", "must be >= 0, got -3"),
    ("prefix_length", "-1", "must be >= 0, got -1"),
    ("num_chunks", "-1", "must be >= 0, got -1"),
    ("reason_ratio", "1.5", "must be in [0, 1], got 1.5"),
    ("reason_ratio", "nan", "expected a number, got 'nan'"),
    ("deadline_us", "50", "deadline 50 is before arrival_time_us 100"),
    ("deadline_us", "-1", "must be >= 0, got -1"),
    ("request_id", "99999999999999999999", "out of the int64 range: 99999999999999999999"),
    # token counts are capped (MAX_TRACE_TOKENS = 2^24), every token column
    *((c, str(2**62), f"{2**62} tokens is more than the cap of 16777216")
      for c in ("prefix_length", "input_tokens", "output_tokens", "text_tokens", "image_tokens",
                "audio_tokens", "video_tokens", "server_input_tokens")),
    ("input_tokens", "16777217", "16777217 tokens is more than the cap of 16777216"),
    # a bare quote inside an unquoted field (Go's encoding/csv refuses it)
    ("client_id", 'a"b', 'bare " in an unquoted field (quote the field and double its quotes)'),
    ("model", ' "m"', 'bare " in an unquoted field (quote the field and double its quotes)'),
])
def test_bad_field_names_file_line_and_column(tmp_path, col, value, problem):
    row = GOOD_ROW.split(",")
    row[TRACE_COLUMNS.index(col)] = value
    p = _csv(tmp_path, GOOD_ROW.replace("0,", "5,", 1), ",".join(row))
    e = _err(read_trace_records, p)
    assert (e.file, e.line, e.field, e.problem) == (str(p), 3, col, problem)
    assert str(e) == f"{p}:3: {col}: {problem}"


def test_token_cap_is_admitted(tmp_path):
    row = GOOD_ROW.split(",")
    row[TRACE_COLUMNS.index("output_tokens")] = str(MAX_TRACE_TOKENS)
    assert read_trace_records(_csv(tmp_path, ",".join(row)))[0].output_tokens == MAX_TRACE_TOKENS


@pytest.mark.parametrize("extra, cells", [(",x", 28), (",,", 29)])
def test_cells_beyond_the_header_row_are_refused(tmp_path, extra, cells):
    p = _csv(tmp_path, GOOD_ROW.replace("0,", "5,", 1), GOOD_ROW + extra)
    e = _err(read_trace_records, p)
    assert (e.file, e.line, e.field) == (str(p), 3, "column-28")
    assert e.problem == f"extra cell: the row has {cells} cells, the header row names 27 columns"


def test_quoted_quotes_and_long_fields_are_read(tmp_path):
    # a doubled quote inside a quoted field is fine; one field of 131,072 characters (the
    # default csv field-size limit) and of 1M characters is read (MAX_FIELD_CHARS)
    assert MAX_FIELD_CHARS >= 12 * 10_000_000
    for n in (131_072, 1_000_000):
        long = GOOD_ROW.replace(",c,", ',"say ""hi""",', 1).replace(",t,", f",{'x' * n},", 1)
        recs = read_trace_records(_csv(tmp_path, long))
        assert (recs[0].client_id, len(recs[0].tenant_id)) == ('say "hi"', n)


def test_line_numbers_count_quoted_newlines_and_blank_lines(tmp_path):
    multi = GOOD_ROW.replace(",c,", ',"multi\nline",', 1)
    bad = GOOD_ROW.replace("0,", "2,", 1).replace(",100,100,", ",x,100,")
    p = _csv(tmp_path, multi, "", bad)
    e = _err(read_trace_records, p)
    assert (e.line, e.field) == (5, "arrival_time_us")


def test_deadline_rules(tmp_path):
    ok = GOOD_ROW.split(",")
    ok[TRACE_COLUMNS.index("deadline_us")] = "100"   # equal to arrival: allowed
    recs = read_trace_records(_csv(tmp_path, ",".join(ok)))
    assert recs[0].deadline_us == 100


def test_go_booleans_accepted(tmp_path):
    rows = [GOOD_ROW.replace("0,", f"{i},", 1).replace(",false,", f",{b},")
            for i, b in enumerate(["true", "TRUE", "1", "F", "False"])]
    recs = read_trace_records(_csv(tmp_path, *rows))
    assert [r.streaming for r in recs] == [True, True, True, False, False]


def test_duplicate_request_id(tmp_path):
    p = _csv(tmp_path, GOOD_ROW, GOOD_ROW)
    e = _err(read_trace_records, p)
    assert (e.line, e.field) == (3, "request_id") and "first on line 2" in e.problem


def test_header_row_checked(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text(HEADER_ROW.replace("session_id", "session") + "\n" + GOOD_ROW + "\n")
    e = _err(read_trace_records, p)
    assert (e.line, e.field) == (1, "session_id")
    p.write_text("")
    assert _err(read_trace_records, p).problem == "missing CSV header row"
    p.write_text("request_id,client_id\n")
    e = _err(read_trace_records, p)
    assert (e.line, e.field, e.problem) == (1, "tenant_id",
                                            "missing from the header row (2 columns, expected 27)")


def test_malformed_quotes(tmp_path):
    p = _csv(tmp_path, GOOD_ROW, '1,"unterminated')
    e = _err(read_trace_records, p)
    assert e.file == str(p) and e.line == 3 and e.problem.startswith("malformed CSV")


def test_missing_files(tmp_path):
    e = _err(read_trace_records, tmp_path / "absent.csv")
    assert (e.file, e.line, e.problem) == (str(tmp_path / "absent.csv"), None, "no such file")
    e = _err(read_trace_header, tmp_path / "absent.yaml")
    assert str(e) == f"{tmp_path / 'absent.yaml'}: no such file"


def test_unknown_header_key(tmp_path):
    p = tmp_path / "h.yaml"
    p.write_text("trace_version: 2\ntime_unit: microseconds\nmode: real\nbogus: 1\n")
    e = _err(read_trace_header, p)
    assert (e.file, e.line, e.field, e.problem) == (str(p), 4, "bogus", "unknown key")


def test_header_errors_located(tmp_path):
    p = tmp_path / "h.yaml"
    p.write_text("trace_version: 2\nserver:\n    type: vllm\n    block_size: -16\n")
    e = _err(read_trace_header, p)
    assert (e.line, e.field) == (4, "server.block_size")
    assert e.problem == "input should be greater than or equal to 0, got -16"
    p.write_text("trace_version: 3\n")
    assert (_err(read_trace_header, p).line, _err(read_trace_header, p).field) == (1, "trace_version")
    p.write_text("trace_version: 2\ntime_unit: milliseconds\n")
    assert _err(read_trace_header, p).line == 2
    p.write_text("time_unit: microseconds\n")
    assert _err(read_trace_header, p).problem == "required key is missing"
    p.write_text("trace_version: 2\nmode: [unclosed\n")
    e = _err(read_trace_header, p)
    assert e.problem.startswith("invalid YAML") and e.line == 3
    p.write_text("trace_version: 2\nmode: real\nmode: generated\n")
    e = _err(read_trace_header, p)
    assert (e.line, e.field, e.problem) == (3, "mode", "duplicate key")
    p.write_text("")
    assert _err(read_trace_header, p).line == 1
    p.write_text("- 1\n")
    assert "mapping" in _err(read_trace_header, p).problem


def test_header_created_at_timestamp_kept_as_string(tmp_path):
    p = tmp_path / "h.yaml"
    p.write_text("trace_version: 2\ncreated_at: 2026-03-26T10:00:00Z\n")
    assert read_trace_header(p).created_at == "2026-03-26T10:00:00Z"
