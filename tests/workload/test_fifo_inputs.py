"""A FIFO (named pipe) that nothing writes, given where a user's file is read, is one error,
not a command that waits in ``open()`` for ever. Found by CLI fuzzing: ``convert servegen``
and a ``servegen_data`` workload spec (both chunk files), ``calibrate`` / ``fit`` of a
converted PREFIX (the trace CSV), ``--hardware-config``, ``--coefficients`` and a model
``config.json`` hung. Each read runs in a thread joined with a timeout, so a regression fails
instead of hanging the suite."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from blis_simpy.catalog.hardware import read_hardware_json
from blis_simpy.catalog.hfconfig import load_hf_json
from blis_simpy.errors import ConfigError
from blis_simpy.infile import open_input
from blis_simpy.latency.coefficient_sets import read_set
from blis_simpy.workload.convert import servegen_workload
from blis_simpy.workload.tracev2_read import read_trace_records


def _call(fn, fifos: list[Path]):
    """``fn()``'s result or exception; fails if it is still blocked after 10 s."""
    out: list = []

    def target():
        try:
            out.append(fn())
        except BaseException as exc:    # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():     # open each FIFO for writing so a stuck open() returns and the thread ends
        for f in fifos:
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(10)
        raise AssertionError("blocked on a FIFO with no writer")
    return out[0]


def _servegen(tmp_path: Path, fifo_name: str) -> tuple[Path, Path]:
    d = tmp_path / "sg"
    d.mkdir()
    (d / "chunk-a-trace.csv").write_text("0,2.0,1.5,Gamma\n")
    (d / "chunk-a-dataset.json").write_text(
        json.dumps({"0": {"input_tokens": "{64: 1}", "output_tokens": "{8: 1}"}}))
    (d / fifo_name).unlink()
    os.mkfifo(d / fifo_name)
    return d, d / fifo_name


@pytest.mark.parametrize("name", ["chunk-a-dataset.json", "chunk-a-trace.csv"])
def test_servegen_chunk_fifo(tmp_path, name):
    d, fifo = _servegen(tmp_path, name)
    got = _call(lambda: servegen_workload(str(d)), [fifo])
    assert isinstance(got, ConfigError), got


@pytest.mark.parametrize(("read", "problem"), [
    (read_trace_records, "missing CSV header row"),
    (read_hardware_json, "invalid JSON"),
    (load_hf_json, "invalid JSON"),
    (read_set, "a coefficient set must be a mapping"),
])
def test_user_file_fifo(tmp_path, read, problem):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    got = _call(lambda: read(str(fifo)), [fifo])
    assert isinstance(got, ConfigError) and problem in str(got), got
    assert got.file == str(fifo)


def test_open_input_reads_a_pipe_with_a_writer_whole(tmp_path):
    """``--scenario <(cat x.yaml)``: a pipe that a process writes is read to its end."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    text = b"x" * 200_000          # more than a pipe buffer: the reader must wait for the rest
    fd = os.open(fifo, os.O_RDWR)   # a writer already there (O_RDWR does not wait for a reader)

    def write():
        view = memoryview(text)
        while view:
            view = view[os.write(fd, view):]
        os.close(fd)

    w = threading.Thread(target=write, daemon=True)
    w.start()

    def read():
        with open_input(fifo, "rb") as f:
            return f.read()
    assert _call(read, [fifo]) == text
    w.join(10)


def test_open_input_refuses_a_directory_like_open(tmp_path):
    with pytest.raises(IsADirectoryError):
        open_input(tmp_path)
