"""BLIS's convert kinds that print a workload-spec v2 (blis_simpy.workload.convert)."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from blis_simpy.errors import ConfigError
from blis_simpy.workload import generate_requests
from blis_simpy.workload.convert import (
    inference_perf_workload,
    preset_workload,
    servegen_workload,
    spec_to_yaml,
)
from blis_simpy.workload.spec import load_workload_spec


def _reread(spec, tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(spec_to_yaml(spec))
    return load_workload_spec(p)


def test_preset_exact_yaml():
    assert spec_to_yaml(preset_workload("chatbot", 2.5, 50)) == """\
version: '2'
seed: 42
category: language
aggregate_rate: 2.5
num_requests: 50
clients:
- id: preset-chatbot
  rate_fraction: 1.0
  arrival:
    process: constant
  input_distribution:
    type: gaussian
    params:
      mean: 256
      std_dev: 100
      min: 2
      max: 800
  output_distribution:
    type: gaussian
    params:
      mean: 256
      std_dev: 100
      min: 1
      max: 1024
"""


def test_preset_reads_back_and_generates_the_same_requests(tmp_path):
    spec = preset_workload("summarization", 4.0, 20)
    back = _reread(spec, tmp_path)
    assert back == spec
    one, two = generate_requests(spec), generate_requests(back)
    assert [(r.arrival_us, r.input_len, r.output_len) for r in one] == \
        [(r.arrival_us, r.input_len, r.output_len) for r in two]
    assert len(one) == 20 and [r.arrival_us for r in one[:2]] == [250_000, 500_000]   # constant, 4/s


def test_preset_from_a_defaults_file(tmp_path):
    d = tmp_path / "defaults.yaml"
    d.write_text("workloads:\n  tiny:\n    prefix_tokens: 8\n    prompt_tokens: 40\n    prompt_tokens_stdev: 5\n"
                 "    prompt_tokens_min: 10\n    prompt_tokens_max: 80\n    output_tokens: 6\n"
                 "    output_tokens_stdev: 2\n    output_tokens_min: 1\n    output_tokens_max: 9\n"
                 "  broken:\n    prompt_tokens: -4\n")
    c = preset_workload("tiny", defaults_filepath=str(d)).clients[0]
    assert (c.id, c.prefix_group, c.prefix_length) == ("preset-tiny", "shared", 8)
    assert c.input_distribution.params == {"mean": 40.0, "std_dev": 5.0, "min": 10.0, "max": 80.0}
    assert c.output_distribution.params == {"mean": 6.0, "std_dev": 2.0, "min": 1.0, "max": 9.0}
    with pytest.raises(ConfigError) as ei:
        preset_workload("broken", defaults_filepath=str(d))
    assert (ei.value.file, ei.value.line, ei.value.field) == (str(d), 13, "workloads.broken.prompt_tokens")
    with pytest.raises(ConfigError, match="unknown preset 'chatbot'"):
        preset_workload("chatbot", defaults_filepath=str(tmp_path / "defaults.yaml"))


def test_servegen_clients_and_aggregate_rate(tmp_path):
    d = tmp_path / "sg"
    d.mkdir()
    (d / "chunk-a-trace.csv").write_text("0,2.0,1.5,Gamma\n")
    (d / "chunk-a-dataset.json").write_text(json.dumps(
        {"0": {"input_tokens": "{100: 0.25, 200: 0.75}", "output_tokens": "{10: 1.0}"}}))
    (d / "chunk-b-trace.csv").write_text("0,3.0,1,Poisson\n")
    (d / "chunk-b-dataset.json").write_text(json.dumps({"0": {"input_tokens": "{64: 1}", "output_tokens": "{8: 1}"}}))
    spec = servegen_workload(str(d))
    assert spec.aggregate_rate == 5.0 and spec.servegen_data is None
    assert [(c.id, c.tenant_id, c.rate_fraction, c.arrival.process, c.arrival.cv) for c in spec.clients] == [
        ("servegen-chunk-a", "chunk-a", 2.0, "gamma", 1.5), ("servegen-chunk-b", "chunk-b", 3.0, "poisson", None)]
    text = spec_to_yaml(spec)
    assert yaml.safe_load(text)["clients"][0]["input_distribution"]["params"] == {100: 0.25, 200: 0.75}
    assert _reread(spec, tmp_path) == spec
    with pytest.raises(ConfigError) as ei:
        servegen_workload(str(tmp_path / "nope"))
    assert ei.value.field == "--path"


def test_inference_perf_section_or_whole_spec(tmp_path):
    section = {"stages": [{"rate": 6.0, "duration": 10}],
               "shared_prefix": {"num_unique_system_prompts": 2, "num_users_per_system_prompt": 3,
                                 "system_prompt_len": 30, "question_len": 12, "output_len": 5}}
    a = tmp_path / "ip.yaml"
    a.write_text(yaml.safe_dump(section))
    spec = inference_perf_workload(str(a))
    assert spec.aggregate_rate == 6.0 and spec.seed == 42 and spec.inference_perf is None
    assert [c.id for c in spec.clients] == [f"prompt-{p}-user-{u}" for p in range(2) for u in range(3)]
    assert _reread(spec, tmp_path) == spec
    b = tmp_path / "whole.yaml"
    b.write_text(yaml.safe_dump({"version": "2", "seed": 9, "inference_perf": section}))
    whole = inference_perf_workload(str(b))
    assert whole.seed == 9 and whole.clients == spec.clients
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages:\n  - rate: 6\n    duration: 10\nshared_prefix:\n  num_unique_system_prompts: 0\n"
                   "  num_users_per_system_prompt: 1\n")
    with pytest.raises(ConfigError) as ei:
        inference_perf_workload(str(bad))
    assert (ei.value.file, ei.value.line, ei.value.field) == (
        str(bad), 5, "shared_prefix.num_unique_system_prompts")


@pytest.mark.parametrize(("name", "data", "problem"), [
    ("chunk-a-trace.csv", b"0,2.0,1.5,Gamma\n" + bytes(range(128, 256)), "not valid UTF-8"),
    ("chunk-a-trace.csv", b"0," + b"1" * 200_000 + b",1.5,Gamma\n", "not CSV: field larger than field limit"),
    ("chunk-a-dataset.json", b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
])
def test_servegen_unreadable_chunk_is_a_located_error(tmp_path, name, data, problem):
    """Found by CLI fuzzing: these were a UnicodeDecodeError, a csv.Error and a RecursionError,
    reported as internal errors (exit 1)."""
    d = tmp_path / "sg"
    d.mkdir()
    (d / "chunk-a-trace.csv").write_text("0,2.0,1.5,Gamma\n")
    (d / "chunk-a-dataset.json").write_text(json.dumps({"0": {"input_tokens": "{64: 1}", "output_tokens": "{8: 1}"}}))
    (d / name).write_bytes(data)
    # the csv module's field limit is process-wide and reading a TraceV2 trace raises it
    # (tracev2_read.py): run at the module's default, as a servegen-only command does
    limit = csv.field_size_limit(131_072)
    try:
        with pytest.raises(ConfigError, match=problem) as ei:
            servegen_workload(str(d))
    finally:
        csv.field_size_limit(limit)
    assert ei.value.file == str(d / name)


_DATASET = json.dumps({"0": {"input_tokens": "{64: 1}", "output_tokens": "{8: 1}"}})


@pytest.mark.parametrize(("files", "where", "problem"), [
    ({"chunk-a-trace.csv": "start_s,rate,cv,pattern\n0,abc,1.5,Gamma\n10,2\n", "chunk-a-dataset.json": _DATASET},
     ("chunk-a-trace.csv", 2), "no valid row (the first bad one: could not convert string to float: 'abc')"),
    ({"chunk-a-trace.csv": "0,-2,1.5,Gamma\n", "chunk-a-dataset.json": _DATASET},
     ("chunk-a-trace.csv", 1), "the highest rate is -2 req/s, not > 0"),
    ({"chunk-a-trace.csv": "0,2,1.5,Gamma\n", "chunk-a-dataset.json": '{"0": {"input_tokens": ""}}'},
     ("chunk-a-dataset.json", None), "no window with both input_tokens and output_tokens PDFs"),
    ({"chunk-a-trace.csv": "0,2,1.5,Gamma\n", "chunk-b-trace.csv": ""},
     ("chunk-a-dataset.json", None), "missing file; none of its 2 chunks is usable"),
])
def test_servegen_no_usable_chunk_names_the_file(tmp_path, files, where, problem):
    """Found by CLI fuzzing: the error named servegen_data.path and the folder, not the file
    (and line) that made the chunks unusable."""
    d = tmp_path / "sg"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    with pytest.raises(ConfigError) as ei:
        servegen_workload(str(d))
    e = ei.value
    assert (e.file, e.line, e.field) == (str(d / where[0]), where[1], None)
    assert e.problem == f"no usable ServeGen chunk in {d}: {problem}"


def test_inference_perf_output_runs_without_a_horizon(tmp_path):
    """The converted spec needed --horizon though its stages have durations: its horizon is
    their total (µs), unless the spec bounds itself (horizon or num_requests)."""
    from blis_simpy.workload.generator import generate_workload
    section = {"stages": [{"rate": 2.0, "duration": 1.5}, {"rate": 4.0, "duration": 0.25}],
               "shared_prefix": {"num_unique_system_prompts": 1, "num_users_per_system_prompt": 2,
                                 "system_prompt_len": 30, "question_len": 12, "output_len": 5}}
    a = tmp_path / "ip.yaml"
    a.write_text(yaml.safe_dump(section))
    spec = inference_perf_workload(str(a))
    assert spec.horizon == 1_750_000
    assert _reread(spec, tmp_path).horizon == 1_750_000
    wl = generate_workload(spec)            # bounded: no "requires either num_requests or --horizon"
    assert wl.horizon_us == 1_750_000 and all(r.arrival_us < 1_750_000 for r in wl.requests)
    b = tmp_path / "whole.yaml"
    b.write_text(yaml.safe_dump({"version": "2", "num_requests": 7, "inference_perf": section}))
    assert inference_perf_workload(str(b)).horizon == 0
    b.write_text(yaml.safe_dump({"version": "2", "horizon": 5, "inference_perf": section}))
    assert inference_perf_workload(str(b)).horizon == 5
