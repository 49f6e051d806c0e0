"""The column view of routing candidates: the fast alternative to a
:class:`~blis_simpy.snapshot.RouterState` (docs/control-plane.md, "The column fast path").

A :class:`~blis_simpy.snapshot.RouterState` holds one frozen
:class:`~blis_simpy.snapshot.InstanceSnapshot` per candidate, built for every request. A
built-in policy that only needs a few fields (round-robin none, least-loaded the loads,
weighted the loads, the KV utilisations and the instance IDs) can decide from a
:class:`Candidates` view instead: the same values, read at the same instant, as plain lists
computed on first use. The cluster uses it only when the values are exactly those of the
snapshots — Immediate refresh (``snapshot_refresh_interval_us == 0``) and no decision trace
(which records the snapshots) — and only for a policy whose class says it can
(:func:`defined_together`); every other policy, plugins included, gets the
:class:`~blis_simpy.snapshot.RouterState` as before.

Like :class:`~blis_simpy.snapshot.SnapshotProvider`, the view reads engine instances (anything
with ``index``, ``id``, ``waitq``, ``running`` and ``kv``); policies only see its lists.
"""

from __future__ import annotations


class Candidates:
    """The candidates of one routing decision, in snapshot order (index order), as columns.

    ``insts`` are the candidate instances, ``inflight`` the cluster's in-flight count per
    instance index, ``clock_us`` the time of the decision (µs). Every column has one entry
    per candidate; the instance-side ones are read when first asked for, which the cluster
    guarantees is before anything changes (the decision is synchronous).
    """

    __slots__ = ("insts", "inflight", "clock_us", "_ids", "_indices", "_loads", "_util")

    def __init__(self, insts, inflight: list[int], clock_us: int):
        self.insts = insts
        self.inflight = inflight
        self.clock_us = clock_us
        self._ids = self._indices = self._loads = self._util = None

    def __len__(self) -> int:
        return len(self.insts)

    @property
    def ids(self) -> list[str]:
        """Instance IDs (``InstanceSnapshot.id``)."""
        if self._ids is None:
            self._ids = [inst.id for inst in self.insts]
        return self._ids

    @property
    def indices(self) -> list[int]:
        """Cluster indices (``InstanceSnapshot.index``)."""
        if self._indices is None:
            self._indices = [inst.index for inst in self.insts]
        return self._indices

    def loads(self) -> list[int]:
        """``effective_load``: queue depth + batch size + in-flight requests."""
        if self._loads is None:
            inflight = self.inflight
            self._loads = [len(inst.waitq) + len(inst.running) + inflight[inst.index]
                           for inst in self.insts]
        return self._loads

    def kv_utilization(self) -> list[float]:
        """``kv_utilization``: used / total KV blocks (0.0 with no block)."""
        if self._util is None:
            out = []
            for inst in self.insts:
                kv = inst.kv
                total = kv.total_blocks
                out.append(kv.used / total if total > 0 else 0.0)
            self._util = out
        return self._util


def defined_together(cls: type, *names: str) -> bool:
    """True if the first class in ``cls``'s MRO defining each of ``names`` is the same one.

    A policy's column method (``route_columns``, ``score_columns``, ``observe_columns``) is
    only trusted when it comes from the class that defines the per-snapshot method it mirrors:
    a subclass that overrides ``route`` (or ``score``) alone keeps the snapshot path.
    """
    owners = set()
    for name in names:
        for klass in cls.__mro__:
            if name in klass.__dict__:
                owners.add(klass)
                break
        else:
            return False
    return len(owners) == 1
