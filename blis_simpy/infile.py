"""Opening a file a user names for reading, without hanging on a FIFO.

``open()`` of a FIFO (named pipe) waits until some process opens it for writing: a path to a
FIFO that nothing writes made a command hang in ``open()`` for ever. :func:`open_input` opens
with ``O_NONBLOCK`` (which returns at once), then switches the descriptor back to blocking
reads: a pipe that has a writer (``--scenario <(cat x.yaml)``) reads whole, and one that has
none reads as empty (end of file at once), which each reader reports as its usual error for
an empty file. Everything else is :func:`open`'s: a directory is an ``IsADirectoryError``, a
missing file a ``FileNotFoundError``.

Numbers too long to read: Python converts text to ``int`` only up to
:data:`MAX_INT_DIGITS` digits (``sys.get_int_max_str_digits()``) and raises a ValueError
naming no file past that. Every reader of a file a user names refuses such an integer
itself, located: :func:`json_loads` (JSON, as a ``json.JSONDecodeError`` at the number),
:func:`too_many_digits` (a CSV cell, a YAML scalar: :mod:`blis_simpy.yaml_input`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import IO, Any

#: the most digits an integer in any input file may have: Python's default limit on
#: converting text to int (every cap of ours on an integer is far below it)
MAX_INT_DIGITS = 4300
#: the problem text of a longer one
TOO_MANY_DIGITS = f"an integer of more than {MAX_INT_DIGITS} digits"


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


def too_many_digits(text: str) -> bool:
    """``text`` (an integer as written: sign, digits, ``_`` or a ``0x`` prefix) has more than
    :data:`MAX_INT_DIGITS` digits, so ``int(text)`` would raise."""
    return len(text) > MAX_INT_DIGITS and sum(c.isdigit() for c in text) > MAX_INT_DIGITS


class _HugeInt(Exception):
    def __init__(self, digits: str):
        self.digits = digits


def _parse_int(text: str) -> int:
    if too_many_digits(text):
        raise _HugeInt(text)
    return int(text)


def json_loads(text: str | bytes) -> Any:
    """``json.loads(text)``; an integer of more than :data:`MAX_INT_DIGITS` digits is a
    ``json.JSONDecodeError`` located at it (``exc.lineno``), as a syntax error is, so every
    JSON reader reports it as its own "not JSON: ..." line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError:       # json's own int(): "Exceeds the limit (4300 digits) ..."
        pass
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    try:        # again, slower, to find the number (json gives no position for it)
        return json.loads(text, parse_int=_parse_int)
    except _HugeInt as exc:
        raise json.JSONDecodeError(TOO_MANY_DIGITS, text, max(text.find(exc.digits), 0)) from None


__all__ = ["MAX_INT_DIGITS", "TOO_MANY_DIGITS", "json_loads", "open_input", "read_input_text",
           "too_many_digits"]
