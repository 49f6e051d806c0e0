"""Output safety (docs/cli.md, "Output files"): devices are written through, never replaced;
every output of a run is written all-or-nothing; a full stdout is one line, exit 2; a closed
stdout exits 141 quietly; Ctrl-C prints the partial summary and exits 130."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from blis_simpy.atomic import Batch, Staged, atomic_write
from blis_simpy.errors import ConfigError

from .support import QUICKSTART

BLIS = [sys.executable, "-m", "blis_simpy"]
ENOSPC = os.strerror(28)


def _one_line(res, code=2) -> str:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def _left(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


# ------------------------------------------------------------------ devices as targets
def test_results_to_dev_null_keeps_the_device(cli, small_scenario):
    res = cli("run", "--scenario", small_scenario, "--results-path", "/dev/null", "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_results_to_dev_full_is_one_line_and_writes_nothing(cli, small_scenario, tmp_path):
    res = cli("run", "--scenario", small_scenario, "--results-path", "/dev/full",
              "--trace-output", tmp_path / "tr", "--requests-out", tmp_path / "rows.jsonl",
              "--timeline", tmp_path / "tl.csv", "--format", "json")
    assert _one_line(res) == f"error: /dev/full: --results-path: cannot write results: {ENOSPC}"
    assert res.stdout == ""
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert _left(tmp_path) == ["small.yaml"]          # no trace pair, rows, timeline or temp


# ------------------------------------------------------------------ all or nothing
def test_a_failing_results_path_leaves_no_trace_pair(cli, small_scenario, tmp_path):
    (tmp_path / "r.json").mkdir()
    res = cli("run", "--scenario", small_scenario, "--results-path", tmp_path / "r.json",
              "--trace-output", tmp_path / "tr")
    assert _one_line(res) == f"error: {tmp_path / 'r.json'}: --results-path: is a directory, expected a file"
    assert _left(tmp_path) == ["r.json", "small.yaml"]


@pytest.mark.parametrize("fmt, renderer", [("json", "blis_simpy.metrics.report.render_json"),
                                           ("table", "blis_simpy.metrics.tables.render_tables")])
def test_a_summary_that_cannot_be_rendered_leaves_no_file(cli, small_scenario, tmp_path,
                                                          monkeypatch, fmt, renderer):
    # the summary is rendered before the files commit: a report that fails (a NaN no JSON
    # can hold, say) must not leave a results file of a run that then exits non-zero
    def fail(*a, **k):
        raise ValueError("Out of range float values are not JSON compliant")
    monkeypatch.setattr(renderer, fail)
    res = cli("run", "--scenario", small_scenario, "--results-path", tmp_path / "r.json",
              "--requests-out", tmp_path / "rows.jsonl", "--format", fmt)
    assert res.exit_code != 0 and "Out of range float" in res.stderr
    assert _left(tmp_path) == ["small.yaml"]


def test_one_file_of_the_trace_pair_never_alone(cli, small_scenario, tmp_path):
    (tmp_path / "tr.csv").mkdir()
    res = cli("run", "--scenario", small_scenario, "--trace-output", tmp_path / "tr")
    # the user's path and flag, never our temporary file
    assert _one_line(res) == f"error: {tmp_path / 'tr.csv'}: --trace-output: is a directory, expected a file"
    assert _left(tmp_path) == ["small.yaml", "tr.csv"]


def test_outputs_replace_old_files_together(cli, small_scenario, tmp_path):
    for name in ("tr.yaml", "tr.csv", "r.json"):
        (tmp_path / name).write_text("old\n")
    res = cli("run", "--scenario", small_scenario, "--results-path", tmp_path / "r.json",
              "--trace-output", tmp_path / "tr")
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / "tr.yaml").read_text().startswith("trace_version: 2\n")
    assert len((tmp_path / "tr.csv").read_text().splitlines()) == 25      # header + 24 rows
    assert json.loads((tmp_path / "r.json").read_text())["completed_requests"] == 24
    assert _left(tmp_path) == ["r.json", "small.yaml", "tr.csv", "tr.yaml"]


#: output flags that cannot all be written: (flags, the error line after ``error: ``)
REFUSED_OUTPUTS = {
    # the rows file is already staged when the timeline path is refused: its temporary went
    "a later output refused": (["--requests-out", "q.jsonl", "--timeline", "t.txt"],
                               "t.txt: --timeline: unknown suffix '.txt': expected .csv or .parquet"),
    # one would silently replace the other (the run used to exit 0 with the rows lost)
    "two outputs, one file": (["--results-path", "x.jsonl", "--requests-out", "x.jsonl"],
                              "x.jsonl: --results-path: is also the path of --requests-out: each "
                              "output needs its own file"),
    "trace pair and results": (["--trace-output", "x", "--results-path", "x.csv"],
                               "x.csv: --results-path: is also the path of --trace-output: each "
                               "output needs its own file"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_OUTPUTS))
def test_refused_outputs_leave_nothing(cli, small_scenario, tmp_path, monkeypatch, case):
    flags, line = REFUSED_OUTPUTS[case]
    monkeypatch.chdir(tmp_path)
    res = cli("run", "--scenario", small_scenario, *flags, "--format", "json")
    assert _one_line(res) == f"error: {line}"
    assert _left(tmp_path) == ["small.yaml"]          # no output, no temporary file


def test_staged_outputs(tmp_path):
    # atomic_write replaces the file only when the block ends cleanly
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target, binary=False) as f:
        f.write("half")
        raise RuntimeError("stop")
    assert target.read_text() == "old" and _left(tmp_path) == ["a.txt"]
    with atomic_write(target, binary=False) as f:
        f.write("new")
    assert target.read_text() == "new"
    # a batch renames nothing when one of its files fails
    batch = Batch()
    batch.open(tmp_path / "b.txt").file.write(b"b")
    batch.open("/dev/full", field="--out").file.write(b"x")
    with pytest.raises(ConfigError, match=f"^/dev/full: --out: cannot write: {ENOSPC}$"):
        batch.commit()
    assert _left(tmp_path) == ["a.txt"]
    # a FIFO nobody reads is refused, not waited on
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    s = Staged(fifo, field="--out")
    s.file.write(b"x")
    with pytest.raises(ConfigError, match="no process is reading the FIFO"):
        s.commit()
    s.abort()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


# ------------------------------------------------------------------ stdout
#: every way of printing to stdout: a command's output (rich tables, JSON, plain lines), its
#: help, and the top level's own (--version, --help, completion, bare ``blis-simpy``)
STDOUT_WRITERS = [
    ["run", "--scenario", str(QUICKSTART), "--num-requests", "20", "--format", "json"],
    ["run", "--scenario", str(QUICKSTART), "--num-requests", "20"],            # rich tables
    ["validate", str(QUICKSTART)],
    ["catalog"],
    ["catalog", "models"],
    ["catalog", "--format", "json"],
    ["run", "--help"],
    ["--version"],
    ["--help"],
    ["--show-completion"],
    [],
]


def _command(args):
    """The command line of ``args``. ``--show-completion`` prints the script of the shell it
    finds among its parent processes (typer uses shellingham; a SHELL argument is not read),
    so that case runs under bash: pytest's own parent need not be a shell."""
    if args[:1] == ["--show-completion"]:
        return ["bash", "-c", '"$@"; exit $?', "bash", *BLIS, *args]
    return BLIS + args


@pytest.mark.parametrize("args", STDOUT_WRITERS, ids=" ".join)
def test_full_stdout_is_one_line_exit_2(args):
    with open("/dev/full", "w") as full:
        p = subprocess.run(_command(args), stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [f"error: stdout: cannot write: {ENOSPC}"]


@pytest.mark.parametrize("args", STDOUT_WRITERS, ids=" ".join)
def test_closed_stdout_exits_141_quietly(args):
    # the reader is gone before the first write (as `| head -1` after its line): exit 141,
    # the status of a Unix tool killed by SIGPIPE, and nothing on stderr
    p = subprocess.Popen(_command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141, err
    assert err == b""


@pytest.mark.parametrize("args", [["--version"], ["catalog"]], ids=" ".join)
def test_stdout_closed_from_the_start_is_one_line_exit_2(args):
    # `blis-simpy --version >&-`: Python starts with sys.stdout = None
    p = subprocess.run(BLIS + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=120, preexec_fn=lambda: os.close(1))
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [f"error: stdout: cannot write: {os.strerror(9)}"]


# ------------------------------------------------------------------ Ctrl-C
def test_ctrl_c_prints_the_partial_summary_and_exits_130(tmp_path):
    rows = tmp_path / "rows.jsonl"
    p = subprocess.Popen(BLIS + ["run", "--scenario", str(QUICKSTART), "--num-requests", "300",
                                 "--output-tokens", "20000", "--output-tokens-max", "40000",
                                 "--output-tokens-stdev", "100",
                                 "--format", "json", "--requests-out", str(rows),
                                 "--results-path", str(tmp_path / "r.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the rows file's temporary appears just before the simulation starts
        while not any(f.name.endswith(".tmp") for f in tmp_path.iterdir()) and p.poll() is None:
            time.sleep(0.05)
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted at simulated time "), err
    assert lines[0].endswith("the summary covers the run until then; no output file written")
    cluster = json.loads(out)["cluster"]           # the partial summary, in the chosen format
    assert cluster["injected_requests"] > 0
    assert cluster["completed_requests"] < 300
    assert _left(tmp_path) == []                   # no rows, no results, no temporary file
