"""The router-side prefix cache index (docs/control-plane.md, "The router's prefix
index").

Per instance, an LRU set of prompt block hashes (capacity 10 000 by default). The hashes
are the engine's chained block hashes (``Request.prompt_block_hashes``), so the router and
the instances' KV caches agree on what a prefix is. It is an approximation of the real
caches: it never sees evictions or completions, only the router's own placements.
"""

from __future__ import annotations

from collections import OrderedDict

from blis_simpy.snapshot import leading_run

DEFAULT_CAPACITY = 10_000


class PrefixIndex:
    """Instance ID → LRU set of block hashes."""

    __slots__ = ("capacity", "_sets")

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity <= 0:
            raise ValueError(f"prefix index capacity must be > 0, got {capacity}")
        self.capacity = capacity
        self._sets: dict[str, OrderedDict] = {}

    def match(self, hashes, instance_id: str) -> int:
        """Number of leading ``hashes`` present for ``instance_id`` (stops at the first miss).

        Does not refresh recency.
        """
        s = self._sets.get(instance_id)
        return leading_run(hashes, s) if s else 0

    def record(self, hashes, instance_id: str) -> None:
        """Insert (or refresh to most-recently-used) every hash, evicting the LRU when full.

        An LRU set after any sequence of uses holds the ``capacity`` most recently used
        distinct hashes in recency order, however the evictions interleave; so when none of
        ``hashes`` is present (and they are distinct) they are appended in one go and the
        oldest trimmed after, which leaves exactly what the hash-by-hash loop leaves."""
        s = self._sets.get(instance_id)
        if s is None:
            s = self._sets[instance_id] = OrderedDict()
        cap = self.capacity
        if not isinstance(hashes, (list, tuple)):
            hashes = list(hashes)
        if s.keys().isdisjoint(hashes):
            fresh = dict.fromkeys(hashes)
            if len(fresh) == len(hashes):
                s.update(fresh)
                pop = s.popitem
                for _ in range(len(s) - cap):
                    pop(last=False)
                return
        for h in hashes:
            if h in s:
                s.move_to_end(h)
            else:
                s[h] = None
                if len(s) > cap:
                    s.popitem(last=False)

    def size(self, instance_id: str) -> int:
        s = self._sets.get(instance_id)
        return len(s) if s else 0

    def contains(self, h, instance_id: str) -> bool:
        s = self._sets.get(instance_id)
        return s is not None and h in s
