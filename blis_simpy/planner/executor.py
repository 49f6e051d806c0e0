"""Run a function over many items on Dask distributed (docs/planning.md, "Sweeps").

::

    with Executor() as ex:                       # a LocalCluster: one process per core
        rows = ex.map(run_point, points)         # results in input order

    with Executor(scheduler="tcp://host:8786") as ex:   # an existing cluster
        ...

By default the executor starts a :class:`dask.distributed.LocalCluster` sized to the machine:
one worker **process** per core (``n_workers``), one thread each — a simulation is pure
Python, so threads would only contend for the GIL. With ``scheduler`` it connects a
:class:`dask.distributed.Client` to a running scheduler (``dask scheduler`` / ``dask worker``
on other machines) and leaves that cluster running when it closes.

:meth:`Executor.map` submits one future per item and consumes them with
:func:`dask.distributed.as_completed`. An item whose function raises (or whose worker dies)
comes back as an error row ``{"status": "error", "error": "<one line>", ...}``: never lost,
never fatal to the others. A rich progress bar with an ETA is drawn on stderr when it is a
terminal.

The function is pickled **by reference** when it lives at module level of an importable
module (e.g. :func:`blis_simpy.run.point.run_point`): every worker must have blis_simpy
installed, the same version as the client.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterable

from blis_simpy.errors import ConfigError

__all__ = ["MAX_WORKERS", "Executor", "check_options", "error_row"]

#: a local cluster's worker processes at most (each is a Python process of ~100 MB)
MAX_WORKERS = 256
#: seconds to wait for a remote scheduler to answer
CONNECT_TIMEOUT_S = 10


def error_row(item, exc: BaseException) -> dict:
    """The row of an item whose function raised: status, one-line error, and the item's
    ``config_hash`` when it has one."""
    text = str(exc).strip() or type(exc).__name__
    if not isinstance(exc, ConfigError) and type(exc).__name__ != "ConfigError":
        text = f"{type(exc).__name__}: {text}"
    row = {"status": "error", "error": " ".join(text.split()), "wall_s": None,
           "config_hash": item.get("config_hash") if isinstance(item, dict) else None}
    return row


def check_options(scheduler: str | None, n_workers: int | None) -> None:
    """The executor's options, checked without starting or connecting anything (a caller
    checks them before its own work): ``n_workers`` in [1, :data:`MAX_WORKERS`], and
    ``scheduler`` a Dask address of a known scheme (``tcp://host:8786``, ``host:8786``)."""
    if n_workers is not None and not 1 <= n_workers <= MAX_WORKERS:
        raise ConfigError(f"must be in [1, {MAX_WORKERS}], got {n_workers}", field="--workers")
    if not scheduler:
        return
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend
    try:
        scheme, loc = parse_address(scheduler)
        get_backend(scheme)
        if scheme in ("tcp", "tls", "ws", "wss") and not 0 < parse_host_port(loc)[1] < 65536:
            raise ValueError("the port must be in [1, 65535]")
    except ValueError as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"not a Dask scheduler address (tcp://host:8786): {msg}",
                          field="--scheduler") from None


class Executor:
    """A Dask client over a local cluster (default) or a running scheduler.

    ``scheduler``: address of a running scheduler (``tcp://host:8786``); ``n_workers``: worker
    processes of the local cluster (default: the machine's cores; ignored with ``scheduler``).
    """

    def __init__(self, scheduler: str | None = None, n_workers: int | None = None):
        check_options(scheduler, n_workers)
        from dask.distributed import Client
        self.cluster = None
        self.scheduler = scheduler
        if scheduler:
            try:
                self.client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError, ValueError) as exc:
                msg = " ".join(str(exc).split()) or type(exc).__name__
                raise ConfigError(f"cannot connect to the Dask scheduler {scheduler}: {msg}",
                                  field="--scheduler") from None
            return
        from dask.distributed import LocalCluster
        n = n_workers or os.cpu_count() or 1
        self.cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                    dashboard_address=":0", silence_logs=logging.ERROR)
        self.client = Client(self.cluster)

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the client, and the local cluster when this executor started it."""
        client, self.client = getattr(self, "client", None), None
        if client is not None:
            client.close()
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.close()

    @property
    def n_workers(self) -> int:
        """Workers connected right now."""
        return len(self.client.scheduler_info().get("workers", {}))

    # ------------------------------------------------------------------ map
    def map(self, fn: Callable, items: Iterable, *, progress: bool = True,
            on_result: Callable[[int, object], None] | None = None) -> list:
        """``[fn(item) for item in items]``, computed on the cluster; results in input order.

        ``on_result(index, result)`` is called in the client as each item completes (in
        completion order). If it raises, the items not yet finished are cancelled and the
        exception propagates (the results already passed to it are the caller's to keep).
        An item whose ``fn`` raises gives :func:`error_row` instead of a result.
        """
        from dask.distributed import as_completed
        items = list(items)
        results: list = [None] * len(items)
        if not items:
            return results
        name = getattr(fn, "__name__", "task")
        token = uuid.uuid4().hex[:12]
        futures = [self.client.submit(fn, item, pure=False, key=f"{name}-{token}-{i}")
                   for i, item in enumerate(items)]
        index = {f.key: i for i, f in enumerate(futures)}
        bar, task = _progress_bar(len(items)) if progress else (None, None)
        failed = 0
        try:
            if bar is not None:
                bar.start()
            for fut in as_completed(futures):
                i = index[fut.key]
                try:
                    res = fut.result()
                except Exception as exc:   # the function raised, or its worker died
                    res = error_row(items[i], exc)
                fut.release()
                results[i] = res
                if isinstance(res, dict) and res.get("status") == "error":
                    failed += 1
                if bar is not None:
                    bar.update(task, advance=1,
                               description=f"points ({failed} failed)" if failed else "points")
                if on_result is not None:
                    on_result(i, res)
        except BaseException:
            self.client.cancel([f for f in futures if not f.done()])
            raise
        finally:
            if bar is not None:
                bar.stop()
        return results


def _progress_bar(total: int):
    """A rich progress bar on stderr (None when stderr is not a terminal)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    console = Console(stderr=True)
    if not console.is_terminal:
        return None, None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                   console=console, transient=True)
    return bar, bar.add_task("points", total=total, start=True)
