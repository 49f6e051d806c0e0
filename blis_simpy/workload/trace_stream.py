"""Trace replay as a stream (docs/performance.md, "Very long runs").

:func:`~blis_simpy.workload.replay.trace_requests` builds every request of a trace, token
IDs included, before the simulation starts: about 2.6 KB of tokens per request, 26 GB for ten
million. :class:`TraceRequestStream` gives the same requests — same IDs, same token IDs,
same order — one draw block at a time, as the arrival process reaches them:

1. a first pass over the CSV checks every row (the same located errors as
   :func:`~blis_simpy.workload.tracev2_read.read_trace_records`, before the run starts) and
   keeps only the row count, the arrival times (8 bytes a row, for the horizon checks) and
   the first row of each prefix group;
2. iterating the stream draws the group prefixes, then re-reads the CSV and synthesises the
   requests block by block (:func:`~blis_simpy.workload.replay.iter_trace_requests`).

The stream needs the rows in arrival order (replay sorts them otherwise): :attr:`sorted` says
whether they are; callers fall back to :func:`trace_requests` when it is False.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator

import numpy as np

from blis_simpy.request import Request
from blis_simpy.rng import numpy_rng
from blis_simpy.units import MAX_INT64
from blis_simpy.workload.replay import (
    ALL_AT_ZERO_HORIZON_US,
    iter_trace_requests,
    replay_prefixes,
)
from blis_simpy.workload.tracev2 import TraceRecord
from blis_simpy.workload.tracev2_read import iter_trace_records

__all__ = ["TraceRequestStream"]


class TraceRequestStream:
    """The requests of the TraceV2 data file ``data_path`` replayed with ``seed``, built
    lazily. ``len()`` is the row count; each iteration re-reads the file."""

    def __init__(self, data_path: str | os.PathLike, seed: int):
        self.path = os.fspath(data_path)
        self.seed = seed
        arrivals = array("q")
        firsts: list[TraceRecord] = []       # first row of each prefix group, in file order
        groups: set[str] = set()
        in_order = True
        last = -1
        for r in iter_trace_records(self.path):
            t = r.arrival_time_us
            arrivals.append(t)
            if t < last:
                in_order = False
            last = max(last, t)
            g = r.prefix_group
            if g and r.prefix_length > 0 and g not in groups:
                groups.add(g)
                firsts.append(TraceRecord(prefix_group=g, prefix_length=r.prefix_length))
        self._arrivals = np.frombuffer(arrivals, dtype=np.int64) if arrivals else np.zeros(0, np.int64)
        self._firsts = firsts
        #: rows already in arrival order (the stream's order is then replay's order)
        self.sorted = in_order
        #: latest arrival (µs); -1 for an empty trace
        self.last_arrival_us = int(last)

    def __len__(self) -> int:
        return len(self._arrivals)

    def __iter__(self) -> Iterator[Request]:
        rng = numpy_rng(self.seed)
        prefixes = replay_prefixes(self._firsts, rng)
        # the first pass checked the IDs: the re-read keeps no ID set (~100 bytes a row)
        return iter_trace_requests(iter_trace_records(self.path, unique_ids=False), rng, prefixes)

    def count_arriving_after(self, t_us: int) -> int:
        """Requests arriving strictly after ``t_us`` (µs)."""
        return int(np.count_nonzero(self._arrivals > t_us))

    def default_horizon_us(self) -> int:
        """:func:`~blis_simpy.workload.replay.default_replay_horizon` of the trace."""
        if not len(self):
            return MAX_INT64
        if self.last_arrival_us <= 0:
            return ALL_AT_ZERO_HORIZON_US
        return min(2 * self.last_arrival_us, MAX_INT64)
