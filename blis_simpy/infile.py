"""Opening a file a user names for reading, without hanging on a FIFO.

``open()`` of a FIFO (named pipe) waits until some process opens it for writing: a path to a
FIFO that nothing writes made a command hang in ``open()`` for ever. :func:`open_input` opens
with ``O_NONBLOCK`` (which returns at once), then switches the descriptor back to blocking
reads: a pipe that has a writer (``--scenario <(cat x.yaml)``) reads whole, and one that has
none reads as empty (end of file at once), which each reader reports as its usual error for
an empty file. Everything else is :func:`open`'s: a directory is an ``IsADirectoryError``, a
missing file a ``FileNotFoundError``.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO, Any


def open_input(path: str | os.PathLike, mode: str = "r", **kw: Any) -> IO[Any]:
    """``open(path, mode, **kw)`` for reading (``mode`` "r" or "rb"), that does not block on
    a FIFO with no writer (see the module docstring)."""
    if mode not in ("r", "rb"):
        raise ValueError(f"open_input reads only ('r' or 'rb'), not {mode!r}")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):      # open() refuses a directory; os.open does not
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        os.set_blocking(fd, True)
        return open(fd, mode, **kw)
    except BaseException:
        os.close(fd)
        raise


def read_input_text(path: str | os.PathLike, encoding: str = "utf-8") -> str:
    """``Path(path).read_text(encoding)`` through :func:`open_input`."""
    with open_input(path, encoding=encoding) as f:
        return f.read()


__all__ = ["open_input", "read_input_text"]
