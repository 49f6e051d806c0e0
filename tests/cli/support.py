"""Shared test data for the CLI tests: a small scenario and tiny TraceV2 files."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"

#: ``error: FILE:LINE: field: problem`` — the one line every located bad-input error prints.
LOCATED = re.compile(r"^error: (?P<file>[^:\s]+):(?P<line>\d+): (?P<field>[^:\s]+): (?P<problem>.+)$")

SMALL_SCENARIO = """\
seed: 42
model: meta-llama/llama-3.1-8b-instruct
latency:
  model: blackbox
  alpha_coeffs: [10326.268121600151, 0.0, 0.0]
  beta_coeffs: [6472.007648778123, 19.79721387814611, 304.4021040302657]
engine:
  total_kv_blocks: 2000
  max_num_running_reqs: 16
workload:
  kind: distribution
  rate: 20.0
  num_requests: 24
  prompt_tokens: {mean: 200, stdev: 80, min: 2, max: 600}
  output_tokens: {mean: 40, stdev: 20, min: 2, max: 120}
"""

TRACE_HEADER = "trace_version: 2\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"
TRACE_COLUMNS = (
    "request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,prefix_length,"
    "streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,"
    "reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,send_time_us,"
    "first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,finish_reason")


def trace_row(rid: int, arrival_us: int, n_in: int, n_out: int) -> str:
    """One 27-column TraceV2 row."""
    return (f"{rid},c,,,,0,,0,false,{n_in},{n_out},0,0,0,0,0,,0,0,{arrival_us},{arrival_us},"
            "0,0,0,ok,,")


def write_trace_files(folder: Path, rows: list[str], name: str = "trace") -> tuple[Path, Path]:
    header = folder / f"{name}.yaml"
    data = folder / f"{name}.csv"
    header.write_text(TRACE_HEADER)
    data.write_text(TRACE_COLUMNS + "\n" + "".join(r + "\n" for r in rows))
    return header, data


def plugin_trace_scenario(folder: Path, plugin: str, rows: list[str], body: str,
                          tail: str = "") -> Path:
    """``folder/scenario.yaml``: model ``m``, the plugin module ``plugin``, blackbox latency with
    no queueing delay (step = 5000 + 10 µs per prefill token + 100 µs per decode token), 2000 KV
    blocks, then ``body`` (YAML text right after ``engine.total_kv_blocks``: more ``engine`` keys
    indented by two spaces, or top-level sections), a trace workload of ``rows``, and ``tail``."""
    header, data = write_trace_files(folder, rows)
    sc = folder / "scenario.yaml"
    sc.write_text(f"model: m\nplugins: [{plugin}]\nlatency:\n  model: blackbox\n"
                  "  alpha_coeffs: [0.0, 0.0, 0.0]\n  beta_coeffs: [5000.0, 10.0, 100.0]\n"
                  f"engine:\n  total_kv_blocks: 2000\n{body}workload:\n  kind: trace\n"
                  f"  header: {header.name}\n  data: {data.name}\n{tail}")
    return sc


def one_error(res) -> str:
    """The one ``error:`` line of a command that failed on bad input: exit 2, no traceback."""
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]
