"""Output files written all-or-nothing (docs/cli.md, "Output files").

Every file the tool writes goes through a :class:`Staged` output: the bytes go to a temporary
file beside the target (``.NAME.PID.N.tmp``, same directory, so the final rename is atomic),
and :meth:`Staged.commit` renames it over the target; :meth:`Staged.abort` removes it. The
target is then either the complete new file or untouched — never half-written.

A target that exists and is not a regular file (``/dev/null``, ``/dev/full``, a FIFO, a
terminal) is not replaced by a regular file: its bytes are staged in an anonymous temporary
file and written through to it at commit (a write error such as ``ENOSPC`` on ``/dev/full``
is then a :class:`~blis_simpy.errors.ConfigError` naming the target). A FIFO with no reader is
refused rather than waited on. A directory is refused when the output is staged.

Several outputs of one command commit together through :class:`Batch`: every file is
complete (closed, write errors seen) before the first rename, and a failure removes every
temporary file still pending. :func:`atomic_write` is the one-file form (a context manager).

Errors are :class:`~blis_simpy.errors.ConfigError` naming the user's path (never the
temporary name) and the flag or key that set it. A write that fails while the file is being
filled (a full disk, a size limit: the OS gives no file name) raises an ``OSError`` whose
``filename`` is the user's path, whoever called ``write``, so it is never taken for a failure
of stdout (cli/app.py ``_write_failure``).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator

from blis_simpy.errors import ConfigError

__all__ = ["Batch", "Staged", "atomic_write", "check_out_dir", "check_target"]


def check_target(path: str | os.PathLike, *, field: str | None = None) -> None:
    """Refuse, before a long computation, an output path that cannot be written: its folder
    missing or not a folder, the path itself a directory, or the folder not writable
    (:class:`~blis_simpy.errors.ConfigError` naming ``path`` and ``field``). Writing can still
    fail later (a full disk); the write itself stays all-or-nothing."""
    path = os.fspath(path)
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise ConfigError("no such folder for the output file", file=path, field=field)
    if os.path.isdir(path):
        raise ConfigError("is a directory, expected a file path", file=path, field=field)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write in the folder {parent}", file=path, field=field)


def check_out_dir(path: str | os.PathLike, *, field: str | None = None,
                  subdirs: tuple[str, ...] = ()) -> None:
    """Refuse an output folder (and its ``subdirs`` the command writes into) that is a
    symbolic link, or a path that exists and is not a folder (:class:`ConfigError` naming
    ``path`` and ``field``). An output file is never written through a link either: the
    rename of :class:`Staged` replaces the link itself, never the file it points at."""
    path = os.fspath(path)
    for p in (path, *(os.path.join(path, s) for s in subdirs)):
        if os.path.islink(p):
            raise ConfigError(f"is a symbolic link (to {os.readlink(p)}): output folders are not "
                              "written through links; give the folder itself", file=p, field=field)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError("exists and is not a directory", file=path, field=field)


def _problem(what: str, exc: OSError) -> str:
    return f"{what}: {exc.strerror or exc}"


class Staged:
    """One output file being written to ``path`` (``field``: the flag or key that named it,
    for errors; ``what``: the start of the error text, e.g. ``"cannot write results"``).

    ``binary`` selects the :attr:`file` mode (``"wb"`` or text ``"w"`` with ``encoding`` and
    ``newline``); ``perm`` is the new file's mode before the umask (Go's ``os.WriteFile``
    uses 0644); ``fsync`` flushes the data to disk before the rename."""

    def __init__(self, path: str | os.PathLike, *, field: str | None = None,
                 what: str = "cannot write", binary: bool = True, encoding: str = "utf-8",
                 newline: str | None = "", perm: int = 0o644, fsync: bool = False):
        self.path = os.fspath(path)
        self.field = field
        self.what = what
        self.fsync = fsync
        self.tmp: str | None = None          # the temporary sibling (None: write-through)
        self.done = False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise self.error(exc) from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise ConfigError("is a directory, expected a file", file=self.path, field=field)
        self.through = st is not None and not stat.S_ISREG(st.st_mode)
        try:
            if self.through:                            # copied to the device at commit
                raw = _NamedRandom(tempfile.TemporaryFile(buffering=0), self.path)
            else:
                raw = _NamedWriter(io.FileIO(self._create_sibling(perm), "wb"), self.path)
        except OSError as exc:
            raise self.error(exc) from None
        self.file = raw if binary else _text(raw, encoding, newline)

    def _create_sibling(self, perm: int) -> int:
        directory = os.path.dirname(os.path.abspath(self.path))
        base = os.path.basename(self.path)
        for attempt in range(100):
            tmp = os.path.join(directory, f".{base}.{os.getpid()}.{attempt}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, perm)
            except FileExistsError:
                continue
            self.tmp = tmp
            return fd
        raise FileExistsError(17, "cannot create a temporary file next to it")

    def error(self, exc: OSError) -> ConfigError:
        """``exc`` as the one-line error naming the user's path."""
        return ConfigError(_problem(self.what, exc), file=self.path, field=self.field)

    # ------------------------------------------------------------------ ending
    def finish(self) -> None:
        """Flush and (``fsync``) sync the staged bytes; write errors surface here."""
        f = self.file
        if f.closed:
            return
        try:
            f.flush()
            if self.fsync and not self.through:
                os.fsync(f.fileno())
            if not self.through:
                f.close()
        except OSError as exc:
            raise self.error(exc) from None

    def commit(self) -> None:
        """Put the staged bytes at the path: rename over it, or write through to it."""
        self.finish()
        try:
            if self.through:
                self._write_through()
            else:
                os.replace(self.tmp, self.path)
                self.tmp = None
        except OSError as exc:
            raise self.error(exc) from None
        finally:
            self.done = True
        self.abort()

    def _write_through(self) -> None:
        src = self.file.buffer if hasattr(self.file, "buffer") else self.file
        src.seek(0)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)   # a FIFO without reader: ENXIO
        except OSError as exc:
            if exc.errno == 6:      # ENXIO
                raise OSError(exc.errno, "no process is reading the FIFO") from None
            raise
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst)

    def abort(self) -> None:
        """Drop the staged bytes; the path is left as it was. Safe to call twice."""
        with contextlib.suppress(OSError, ValueError):
            self.file.close()
        if self.tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
            self.tmp = None
        self.done = True


def _text(raw, encoding: str, newline: str | None):
    return io.TextIOWrapper(raw, encoding=encoding, newline=newline)


class _Named:
    """A staged file's buffer whose write and flush errors carry the user's ``path``."""

    def __init__(self, raw, path: str):
        super().__init__(raw)
        self._user_path = path

    def _named(self, exc: OSError) -> OSError:
        if exc.filename:
            return exc
        return OSError(exc.errno, exc.strerror or str(exc), self._user_path)

    def write(self, data):
        try:
            return super().write(data)
        except OSError as exc:
            raise self._named(exc) from None

    def flush(self):
        try:
            return super().flush()
        except OSError as exc:
            raise self._named(exc) from None


class _NamedWriter(_Named, io.BufferedWriter):
    pass


class _NamedRandom(_Named, io.BufferedRandom):
    pass


class Batch:
    """Outputs that commit together (see the module docstring)."""

    def __init__(self) -> None:
        self.staged: list[Staged] = []

    def add(self, staged: Staged) -> Staged:
        """Add ``staged``; two outputs of one batch aimed at the same file (one would silently
        replace the other) are refused, and nothing is left behind. Devices are exempt."""
        if not staged.through:
            real = os.path.realpath(staged.path)
            other = next((s for s in self.staged if not s.through and os.path.realpath(s.path) == real), None)
            if other is not None:
                staged.abort()
                self.abort()
                raise ConfigError(f"is also the path of {other.field or 'another output'}: each output needs "
                                  "its own file", file=staged.path, field=staged.field)
        self.staged.append(staged)
        return staged

    def open(self, path: str | os.PathLike, **kw) -> Staged:
        """A new :class:`Staged` output (keyword arguments as :class:`Staged`) in the batch."""
        try:
            return self.add(Staged(path, **kw))
        except BaseException:
            self.abort()
            raise

    def commit(self) -> None:
        """Finish every output, then write through the devices, then rename the files. Any
        failure removes every temporary file left and re-raises."""
        try:
            for s in self.staged:
                s.finish()
            for s in sorted(self.staged, key=lambda s: not s.through):
                s.commit()
        finally:
            self.abort()

    def abort(self) -> None:
        for s in self.staged:
            s.abort()
        self.staged.clear()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, *, batch: Batch | None = None, **kw) -> Iterator:
    """``with atomic_write(path, field=..., what=...) as f:`` — write ``f`` (binary unless
    ``binary=False``). When the block ends without an exception the path is replaced now, or,
    with ``batch``, staged to commit with the batch's other outputs. On any exception nothing
    is left behind; an OSError while writing becomes the output's ConfigError (naming
    ``path`` and ``field``). Keyword arguments as :class:`Staged`."""
    s = Staged(path, **kw)
    try:
        yield s.file
    except OSError as exc:
        s.abort()
        raise s.error(exc) from None
    except BaseException:
        s.abort()
        raise
    if batch is not None:
        batch.add(s)
        return
    try:
        s.commit()
    except BaseException:
        s.abort()
        raise
