"""A write that fails while an output file is being filled names that file, never stdout.

The OS reports a full disk (ENOSPC), an I/O error or a file-size limit (EFBIG) with no file
name, so without care such an error reads ``error: stdout: cannot write: ...``. Here the
failure is real: the CLI runs as a child process with ``RLIMIT_FSIZE`` set (and SIGXFSZ
ignored), so every write past the limit to a regular file fails with EFBIG, as on a full
disk. The limit does not touch a pipe, so stdout stays writable unless it is itself a file.
The child runs with stdout buffered (PYTHONUNBUFFERED unset) unless a test says otherwise.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

import pytest

from .support import QUICKSTART

BLIS = [sys.executable, "-m", "blis_simpy"]
EFBIG = os.strerror(27)
LIMIT_BYTES = 1000          # below every output of 200 requests, above nothing we rely on
RUN = ["run", "--scenario", str(QUICKSTART), "--num-requests", "200", "--format", "json"]


def _file_size_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # the write fails (EFBIG) instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def _blis(args: list[str], extra_env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONUNBUFFERED", None)
    env.update(extra_env or {})
    return subprocess.run(BLIS + args, stderr=subprocess.PIPE, text=True, timeout=120, env=env,
                          preexec_fn=_file_size_limit, **kw)


#: every output file of run/replay: (flag, file name, the file the error names, its wording)
OUTPUTS = [
    ("--requests-out", "rows.jsonl", "rows.jsonl", "cannot write"),       # streamed during the run
    ("--requests-out", "rows.parquet", "rows.parquet", "cannot write"),
    ("--results-path", "r.json", "r.json", "cannot write results"),
    ("--trace-output", "tr", "tr.csv", "cannot write trace"),
    ("--timeline", "tl.csv", "tl.csv", "cannot write the timeline"),
]


@pytest.mark.parametrize("flag, name, named, what", OUTPUTS, ids=[o[1] for o in OUTPUTS])
def test_a_failed_output_write_names_the_file_and_leaves_nothing(tmp_path, flag, name, named, what):
    p = _blis(RUN + [flag, str(tmp_path / name)], stdout=subprocess.PIPE)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [f"error: {tmp_path / named}: {flag}: {what}: {EFBIG}"]
    assert os.listdir(tmp_path) == []               # no partial file, no temporary
    assert p.stdout == ""                           # no summary for a run whose files failed


def test_a_failed_write_through_a_staged_file_names_it_whoever_writes(tmp_path):
    # a writer that does not convert the error itself (as a third-party library writing to
    # the staged file would): the OSError carries the user's path, not the temporary's
    code = ("import sys\nfrom blis_simpy.atomic import Staged\n"
            "s = Staged(sys.argv[1])\n"
            "try:\n    s.file.write(b'x' * 100_000)\nexcept OSError as e:\n"
            "    s.abort()\n    print(e.errno, e.filename, e.strerror)\n")
    target = tmp_path / "out.bin"
    p = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True,
                       timeout=60, preexec_fn=_file_size_limit)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split(" ", 2) == ["27", str(target), EFBIG + "\n"]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "PYTHONUNBUFFERED"])
def test_a_failed_stdout_write_still_names_stdout(tmp_path, unbuffered):
    # stdout is itself a file under the limit: that failure is stdout's. Unbuffered, Python's
    # text layer would drop the kernel's short write (output cut, exit 0); main() puts a
    # buffered writer under it, so the failure is reported the same way.
    out = tmp_path / "stdout.json"
    env = {"PYTHONUNBUFFERED": "1"} if unbuffered else {}
    with open(out, "w") as f:
        p = _blis(RUN, stdout=f, extra_env=env)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [f"error: stdout: cannot write: {EFBIG}"]
    assert os.path.getsize(out) <= LIMIT_BYTES
