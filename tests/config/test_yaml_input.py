"""The capped YAML reader (blis_simpy/yaml_input.py): alias bombs, recursive aliases, deep
nesting, oversized files, boolean/null keys and NUL bytes are one located error, through
every command that reads a user's YAML file (exit 2, one line, no traceback)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from blis_simpy.errors import ConfigError
from blis_simpy.yaml_input import MAX_ALIAS_NODES, MAX_DEPTH, parse

#: "billion laughs": 9 ** 9 strings when expanded
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
MODEL = "meta-llama/llama-3.1-8b-instruct"


def _refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(text, "f.yaml")
    return info.value


def test_alias_bomb_refused_at_the_line_where_the_budget_runs_out():
    # expanded sizes: a = 10 nodes, b = 1 + 9*10 = 91, c = 820, d = 7381, e = 66430, f > 100000
    # (with the nodes of the keys) — the alias budget (100000 added nodes) runs out in f, line 6
    e = _refused(BOMB)
    assert (e.file, e.line, e.problem) == ("f.yaml", 6, f"aliases expand to more than {MAX_ALIAS_NODES} nodes")


def test_aliases_within_the_budget_and_merge_keys_still_work():
    data, _ = parse("base: &b {x: 1, y: [1, 2]}\none: *b\ntwo:\n  <<: *b\n  y: [3]\n", "f.yaml")
    assert data == {"base": {"x": 1, "y": [1, 2]}, "one": {"x": 1, "y": [1, 2]},
                    "two": {"x": 1, "y": [3]}}


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a {k: *a}\n", "a: &a [1, [2, *a]]\n"])
def test_alias_to_an_enclosing_node_refused(text):
    e = _refused(text)
    assert (e.line, e.problem) == (1, "alias *a refers to a node that contains it")


def test_nesting_cap_is_exact():
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse(ok, "f.yaml")[0] == eval(ok)          # 64 nested lists: fine
    e = _refused("k:\n  " + "[" * 10_000 + "]" * 10_000 + "\n")   # the mapping is level 1
    assert (e.line, e.problem) == (2, f"nested too deeply (more than {MAX_DEPTH} levels)")


@pytest.mark.parametrize("key,what", [("yes", "a boolean"), ("off", "a boolean"), ("~", "null"),
                                      ("null", "null")])
def test_boolean_and_null_keys_refused_with_their_line(key, what):
    e = _refused(f"seed: 1\n{key}: 2\n")
    assert (e.line, e.field) == (2, key)
    assert e.problem == f"reads as {what} in YAML; quote it ('{key}') to mean the text"


def test_quoted_yes_is_a_string_key():
    assert parse("'yes': 1\n1: 2\n", "f.yaml")[0] == {"yes": 1, 1: 2}


def test_nul_byte_names_the_file_and_line():
    e = _refused("seed: 1\nmodel: \"a\x00b\"\n")
    assert (e.file, e.line) == ("f.yaml", 2)
    assert e.problem == "invalid YAML: unacceptable character #x0000: special characters are not allowed"


# ---------------------------------------------------------------------------- every command
SPEC = ("version: \"2\"\naggregate_rate: 10\nnum_requests: 5\nclients:\n  - id: c\n    rate_fraction: 1\n"
        "    arrival: {process: poisson}\n    input_distribution: {type: constant, params: {value: 10}}\n"
        "    output_distribution: {type: constant, params: {value: 5}}\n")
CSV = ("request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,prefix_length,"
       "streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,"
       "reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,send_time_us,"
       "first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,finish_reason\n"
       "0,c,,,,0,,0,false,10,5,0,0,0,0,0,,0,0,0,0,0,0,0,ok,,\n")

#: how each command is handed the bad file ``B`` (the other files are valid)
ENTRIES = {
    "validate": lambda b, d: ["validate", b],
    "run --scenario": lambda b, d: ["run", "--scenario", b],
    "run --policy-config": lambda b, d: ["run", "--model", MODEL, "--num-requests", "5", "--policy-config", b],
    "run --workload-spec": lambda b, d: ["run", "--model", MODEL, "--workload-spec", b],
    "run --coefficients": lambda b, d: ["run", "--model", MODEL, "--num-requests", "5",
                                        "--latency-model", "physics", "--hardware", "H100", "--coefficients", b],
    "run --defaults-filepath": lambda b, d: ["run", "--model", MODEL, "--num-requests", "5",
                                             "--defaults-filepath", b],
    "replay --trace-header": lambda b, d: ["replay", "--model", MODEL, "--trace-header", b,
                                           "--trace-data", d / "t.csv"],
    "sweep": lambda b, d: ["sweep", b, "--out", d / "out"],
    "plan": lambda b, d: ["plan", b],
}
#: (file text, line, problem) of each class of bad YAML
BAD = {
    "alias bomb": (BOMB, 6, f"aliases expand to more than {MAX_ALIAS_NODES} nodes"),
    "recursive alias": ("a: &a [*a]\n", 1, "alias *a refers to a node that contains it"),
    "deep nesting": ("a: " + "[" * 10_000 + "\n", 1, f"nested too deeply (more than {MAX_DEPTH} levels)"),
    "boolean key": ("yes: 1\n", 1, "yes: reads as a boolean in YAML; quote it ('yes') to mean the text"),
    "NUL byte": ("a: 1\nb: \"\x00\"\n", 2, "invalid YAML: unacceptable character #x0000: special characters "
                                             "are not allowed"),
}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_every_command_refuses_bad_yaml_in_one_located_line(tmp_path, entry, bad):
    text, line, problem = BAD[bad]
    b = tmp_path / "bad.yaml"
    b.write_text(text)
    (tmp_path / "t.csv").write_text(CSV)
    res = CliRunner().invoke(app, [str(a) for a in ENTRIES[entry](b, tmp_path)], prog_name="blis-simpy")
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    # some commands name the flag that brought the file in (``FILE:LINE: --flag: problem``)
    assert lines[0].startswith(f"error: {b}:{line}: ") and lines[0].endswith(problem), lines[0]
    assert not (tmp_path / "out").exists()


def test_oversized_scenario_refused_before_parsing(tmp_path):
    b = tmp_path / "big.yaml"
    b.write_bytes(b"# " + b"x" * (16 << 20) + b"\n")
    res = CliRunner().invoke(app, ["validate", str(b)], prog_name="blis-simpy")
    assert res.exit_code == 2
    assert res.stderr == f"error: {b}: larger than 16777216 bytes\n"


def test_a_valid_spec_passes_every_entry_it_is_valid_for(tmp_path):
    """The caps do not refuse ordinary files: a spec and a header read normally."""
    (tmp_path / "s.yaml").write_text(SPEC)
    res = CliRunner().invoke(app, ["run", "--model", MODEL, "--workload-spec", str(tmp_path / "s.yaml"),
                                   "--format", "json"], prog_name="blis-simpy")
    assert res.exit_code == 0, res.stderr


def test_a_fifo_without_a_writer_reads_as_empty_not_forever(tmp_path):
    """Found by CLI fuzzing: `validate`, `run --scenario`, `plan`, `sweep` and `convert
    inference-perf` on a FIFO that nobody writes waited in open() forever. The open does not
    block now; with no writer the file is empty. (Runs in a thread with a join timeout so a
    regression fails instead of hanging the suite.)"""
    import os
    import threading

    from blis_simpy.yaml_input import read_text
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    out = []
    t = threading.Thread(target=lambda: out.append(read_text(str(fifo))), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():     # unblock the stuck open() so the thread ends
        with open(fifo, "w"):
            pass
        t.join(10)
        raise AssertionError("read_text blocked on a FIFO with no writer")
    assert out == [""]
