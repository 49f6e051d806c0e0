"""Read-only views of instances that control-plane policies decide on (docs/control-plane.md,
"Snapshots and staleness").

Policies never see an :class:`~blis_simpy.engine.instance.Instance`; they get a
:class:`RouterState`: one :class:`InstanceSnapshot` per routable instance (index order) and
the clock. ``effective_load`` counts queued requests twice on purpose (queue depth plus the
synchronous in-flight count compensates stale snapshots).

A :class:`SnapshotProvider` builds the snapshots and implements the staleness rule of
INV-7: with ``refresh_interval_us == 0`` (Immediate) every field is re-read at every call;
with an interval ``I > 0`` (Periodic) the instance-side fields (queue depth, batch size,
KV utilisation / free blocks / cache-hit rate) of an instance are re-read only when
``clock − last_refresh >= I``. Last refresh starts at 0 and the cached values start at zero,
so before ``clock >= I`` policies see zeros. The in-flight count and the model are always
fresh (the cluster owns them).

An :class:`InstanceView` per instance (``RouterState.views``) answers what a snapshot does
not carry because it costs more than a field read: the prompt tokens waiting and running
on the instance and the blocks its KV cache holds for a prompt. It reads the instance now
(the scorers that use it document their own delay), through the instance's public
attributes only, and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    """One instance as policies see it. ``index`` is its position in the cluster."""

    id: str
    index: int
    queue_depth: int = 0
    batch_size: int = 0
    kv_utilization: float = 0.0
    free_kv_blocks: int = 0
    cache_hit_rate: float = 0.0
    in_flight_requests: int = 0
    model: str = ""

    @property
    def effective_load(self) -> int:
        return self.queue_depth + self.batch_size + self.in_flight_requests


def leading_run(hashes, held) -> int:
    """How many of ``hashes``, from the first, are in ``held`` (a set or mapping)."""
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n


class InstanceView:
    """A read-only view of one instance for scorers (docs/control-plane.md, "Weighted scoring").

    ``inst`` is an engine instance (anything with ``id``, ``index``, ``waitq``, ``running``
    and ``kv``, whose ``hash_to_block`` maps the chained hash of every block the GPU cache
    holds, in use or free but not yet reused, to its block). Token counts are in tokens.
    """

    __slots__ = ("_inst",)

    def __init__(self, inst):
        self._inst = inst

    @property
    def id(self) -> str:
        return self._inst.id

    @property
    def index(self) -> int:
        return self._inst.index

    def waiting_tokens(self) -> int:
        """Prompt tokens of the requests in the instance's wait queue."""
        return sum(r.input_len for r in self._inst.waitq)

    def running_tokens(self) -> int:
        """Prompt tokens of the requests in the instance's running batch."""
        return sum(r.input_len for r in self._inst.running)

    def cached_prefix_blocks(self, hashes) -> int:
        """How many of ``hashes`` (a prompt's chained full-block hashes, in order) the KV cache
        holds as a leading run: the longest cached prefix, in blocks."""
        return leading_run(hashes, self._inst.kv.hash_to_block)

    def cached_block_hashes(self) -> frozenset:
        """The hashes of every block the KV cache holds now (a copy)."""
        return frozenset(self._inst.kv.hash_to_block)


@dataclass(frozen=True, slots=True)
class RouterState:
    """What admission and routing policies see for one request. ``views``: the cluster's
    :class:`InstanceView` of every instance, by instance index (None when the caller has
    none: a hand-built state)."""

    snapshots: tuple[InstanceSnapshot, ...]
    clock_us: int
    views: tuple[InstanceView, ...] | None = None


def _snapshot_maker():
    """``make(id, index, queue_depth, batch_size, kv_utilization, free_kv_blocks,
    cache_hit_rate, in_flight_requests, model)`` → an :class:`InstanceSnapshot` equal to the
    one its constructor returns, built by its slot descriptors: the frozen dataclass's own
    ``__init__`` assigns each field through ``object.__setattr__`` and costs about twice as
    much, on a path that builds one snapshot per candidate instance per decision."""
    names = ("id", "index", "queue_depth", "batch_size", "kv_utilization", "free_kv_blocks",
             "cache_hit_rate", "in_flight_requests", "model")
    if tuple(f.name for f in fields(InstanceSnapshot)) != names:    # a field added: add it here
        raise TypeError("snapshot maker out of date with InstanceSnapshot's fields")
    d = InstanceSnapshot.__dict__
    (s_id, s_index, s_queue, s_batch, s_util, s_free, s_hit, s_inflight,
     s_model) = (d[f].__set__ for f in names)
    new = object.__new__
    cls = InstanceSnapshot

    def make(id_, index, queue_depth, batch_size, kv_utilization, free_kv_blocks,
             cache_hit_rate, in_flight_requests, model) -> InstanceSnapshot:
        snap = new(cls)
        s_id(snap, id_)
        s_index(snap, index)
        s_queue(snap, queue_depth)
        s_batch(snap, batch_size)
        s_util(snap, kv_utilization)
        s_free(snap, free_kv_blocks)
        s_hit(snap, cache_hit_rate)
        s_inflight(snap, in_flight_requests)
        s_model(snap, model)
        return snap

    return make


make_snapshot = _snapshot_maker()


class SnapshotProvider:
    """Per-instance snapshot cache with BLIS's Immediate / Periodic refresh (docs/control-plane.md).

    ``instances`` are engine instances (anything with ``index``, ``id``, ``waitq``,
    ``running`` and ``kv``); only the provider reads them, never a policy.
    """

    __slots__ = ("instances", "interval", "_cache", "_last")

    def __init__(self, instances, refresh_interval_us: int = 0):
        if refresh_interval_us < 0:
            raise ValueError(f"refresh interval must be >= 0, got {refresh_interval_us}")
        self.instances = instances
        self.interval = int(refresh_interval_us)
        # cached (queue_depth, batch_size, kv_utilization, free_kv_blocks, cache_hit_rate)
        self._cache = [(0, 0, 0.0, 0, 0.0) for _ in instances]
        self._last = [0] * len(instances)

    @staticmethod
    def read(inst) -> tuple[int, int, float, int, float]:
        """The instance-side fields, read now."""
        kv = inst.kv
        total = kv.total_blocks
        used = kv.used
        util = used / total if total > 0 else 0.0
        return (len(inst.waitq), len(inst.running), util, total - used, kv.cache_hit_rate())

    def snapshot(self, inst, in_flight: int, clock_us: int) -> InstanceSnapshot:
        k = inst.index
        if self.interval == 0:   # the hot path, inlined
            kv = inst.kv
            total = kv.total_blocks
            used = kv.used
            return make_snapshot(inst.id, k, len(inst.waitq), len(inst.running),
                                 used / total if total > 0 else 0.0, total - used,
                                 kv.cache_hit_rate(), in_flight, inst.model)
        if clock_us - self._last[k] >= self.interval:
            fields = self._cache[k] = self.read(inst)
            self._last[k] = clock_us
        else:
            fields = self._cache[k]
        q, b, util, free, hit = fields
        return make_snapshot(inst.id, k, q, b, util, free, hit, in_flight, inst.model)
