"""GPU-tier paged KV cache with vLLM-v1-style prefix caching (docs/kv-cache.md, "GPU tier").

Blocks hold ``block_size`` token slots. A request's blocks are kept on the request itself
(``req.kv_blocks``, in order) together with ``req.kv_len`` (slots filled) and ``req.kv_base``
(sequence position of slot 0, normally 0). Every block but the last is full, so block ``j``
of a request holds the sequence positions ``[kv_base + j*bs, kv_base + (j+1)*bs)``; token
contents are therefore never copied: a block's hash is computed from the request's tokens.

Free blocks (reference count 0) sit on an LRU list, head = next victim. Released blocks keep
their hash, so they remain prefix-cache hits until reused. Allocation is all-or-nothing: a
failed call leaves every block's reference count, hash and the request exactly as before
(INV-4); as in BLIS, cached blocks it had taken off the free list go back to
the free list's *tail*, so only their LRU position can change. Unlike BLIS, whose decode-phase
rollback forgets the request's earlier blocks (a leak that ends in a livelock), rollback here
restores the request's own block list too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import ClassVar

import numpy as np

from blis_simpy.plugins import Pluggable
from blis_simpy.request import _sha256, hash_block
from blis_simpy.units import ceil_div


class KVCache(Pluggable, family="kv cache", name="gpu"):
    """Single-tier (GPU) KV block store. Units: blocks and token slots.

    KV caches are a registry (``engine.kv_cache``): this one is ``gpu``,
    :class:`~blis_simpy.kv.tiered.TieredKVCache` is ``tiered``. A subclass declared with
    ``name="..."`` (and optionally a pydantic ``Params``) is selectable by that name; it is
    built as ``cls(total_blocks, block_size, params=params)`` (see :meth:`factory_for`).
    """

    #: does the engine drive transfers of this cache (advance, end_step, KV loads)?
    #: (:class:`~blis_simpy.kv.offload.OffloadKVCache`)
    async_transfers = False
    own_claims = ("short_path_safe",)
    #: the class's own claim (a subclass that does not set it gets False:
    #: :attr:`~blis_simpy.plugins.Pluggable.own_claims`): in a step in which every running
    #: request decodes one token, its :meth:`consume_pending_transfer_latency` adds nothing
    #: and :meth:`mirror_to_cpu` does nothing, so the fast engine's pure-decode short path
    #: may leave them out (docs/performance.md, "Step coalescing")
    short_path_safe: ClassVar[bool] = True

    def __init__(self, total_blocks: int, block_size: int = 16, *, params=None):
        self.params = params if params is not None else type(self).Params()
        if total_blocks <= 0:
            raise ValueError(f"total KV blocks must be > 0, got {total_blocks}")
        if block_size <= 0:
            raise ValueError(f"block size must be > 0, got {block_size}")
        self.total_blocks = int(total_blocks)
        self.block_size = int(block_size)
        # The block pool is built lazily: blocks 0, 1, 2, ... are *fresh* until first taken,
        # and ``_ref`` / ``_block_hash`` cover only the blocks taken so far (``_next`` of them).
        # The LRU free list is the fresh blocks in ascending order (the head: the next victim)
        # followed by the released ones in release order (``_lru``, insertion = LRU order):
        # exactly the list ``0 .. total-1`` every block starts on, without building it.
        self._ref: list[int] = []
        self._block_hash: list[bytes] = []
        self.hash_to_block: dict[bytes, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._next = 0
        self.used = 0
        self.cache_hits = 0
        self.cache_misses = 0
        # a subclass may hash some blocks its own way (TieredKVCache does)
        self._plain_hash = type(self)._block_hash_for is KVCache._block_hash_for

    @classmethod
    def factory_for(cls, params) -> Callable[[int, int], KVCache]:
        """A ``kv_factory(total_blocks, block_size)`` building this kind with validated
        ``params`` (an instance of :attr:`Params`); raises ValueError for bad ones."""
        return partial(cls, params=params)

    # ------------------------------------------------------------------ queries
    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used

    @property
    def ref(self) -> list[int]:
        """Reference count of every block (a copy, for inspection; fresh blocks 0)."""
        return self._ref + [0] * (self.total_blocks - self._next)

    @property
    def block_hash(self) -> list[bytes]:
        """Hash of every block, ``b""`` when it has none (a copy, for inspection)."""
        return self._block_hash + [b""] * (self.total_blocks - self._next)

    @property
    def free(self) -> FreeList:
        """The LRU free list, head first (a read-only view: fresh blocks, then released ones)."""
        return FreeList(self)

    def _take_head(self) -> int:
        """Take the LRU head off the free list (a fresh block while any is left): its ID.
        The caller has checked that a block is free."""
        b = self._next
        if b < self.total_blocks:
            self._next = b + 1
            self._ref.append(0)
            self._block_hash.append(b"")
            return b
        return self._lru.popitem(last=False)[0]

    def _take_block(self) -> int:
        """Take the LRU head for a request (the caller has checked that a block is free):
        reference count 1, its old hash's index entry deleted (unconditionally, as in BLIS:
        docs/kv-cache.md). Returns its ID; ``used`` and the counters are the caller's."""
        b = self._take_head()
        h = self._block_hash[b]
        if h:
            self.hash_to_block.pop(h, None)
            self._block_hash[b] = b""
        self._ref[b] = 1
        return b

    def utilization(self) -> float:
        return self.used / self.total_blocks

    def cache_hit_rate(self) -> float:
        n = self.cache_hits + self.cache_misses
        return self.cache_hits / n if n else 0.0

    def kv_thrashing_rate(self) -> float:
        return 0.0

    def consume_pending_transfer_latency(self) -> int:
        return 0

    def mirror_to_cpu(self, batch) -> None:
        return None

    def get_cached_blocks(self, req) -> list[int]:
        """Longest cached prefix of the prompt's *full* blocks, as block IDs (pure lookup)."""
        h2b = self.hash_to_block
        out = []
        for h in req.prompt_block_hashes(self.block_size):
            b = h2b.get(h)
            if b is None:
                break
            out.append(b)
        return out

    # ------------------------------------------------------------------ internals
    def _block_hash_for(self, req, j: int) -> bytes:
        """Chained hash of block ``j`` of ``req`` (which must be full)."""
        bs = self.block_size
        if req.kv_base == 0 and (j + 1) * bs <= req.input_len:
            return req.prompt_block_hashes(bs)[j]
        prev = self._block_hash[req.kv_blocks[j - 1]] if j > 0 else b""
        a = req.kv_base + j * bs
        return hash_block(prev, req.tokens[a:a + bs])

    # ------------------------------------------------------------------ allocation
    def blocks_needed(self, req, count: int) -> int:
        """Fresh blocks a prefill of ``count`` more tokens of ``req`` takes (the KV room
        rule): what the room left in its partly filled last block cannot hold, in whole
        blocks. :meth:`allocate` refuses a prefill that needs more than are free; the fast
        engine asks it to know whether a whole step fits."""
        blocks = req.kv_blocks
        if blocks:
            bs = self.block_size
            room = len(blocks) * bs - req.kv_len
            if 0 < room < bs:
                count -= room if room < count else count
        return ceil_div(count, self.block_size) if count > 0 else 0

    def allocate(self, req, start: int, end: int, cached: list[int] | tuple = ()) -> bool:
        """Reserve slots for sequence positions ``[start, end)`` of ``req`` (all or nothing).

        While the request is in prefill (``req.pi < req.prefill_to``) these are prompt tokens
        (or, recomputing after a preemption, prompt and output tokens); otherwise exactly one
        output token. The first allocation of a request commits the
        ``cached`` prefix blocks. Returns False on failure, with the cache unchanged except
        the LRU position of committed cached blocks (back at the tail, as in BLIS).
        """
        bs = self.block_size
        in_prefill = req.pi < req.prefill_to
        count = end - start
        blocks = req.kv_blocks
        if in_prefill and self.blocks_needed(req, count) > self.total_blocks - self.used:
            return False
        if count <= 0:
            return True
        if not in_prefill:
            if not self.append_token(req, start, req.kv_len):
                return False
            req.kv_len += 1
            return True

        # Prefill. Undo log for an exact rollback (only the cached-block commits and a
        # partial-block fill can precede the one failure point, the fresh-block count).
        old_len = req.kv_len
        old_base = req.kv_base
        n_old = len(blocks)
        committed: list[tuple[int, bool]] = []                  # (block, was_in_use)
        registered: list[tuple[int, bytes, int | None]] = []    # (block, hash, old owner)
        ref = self._ref
        if not blocks and cached:
            lru = self._lru
            for b in cached:
                was_in_use = ref[b] > 0
                ref[b] += 1
                if not was_in_use:
                    self.used += 1
                    del lru[b]
                blocks.append(b)
                committed.append((b, was_in_use))
            self.cache_hits += len(cached)
            req.kv_len = len(cached) * bs
            req.kv_base = 0
        elif not blocks:
            req.kv_base = start
            req.kv_len = 0

        remaining = count
        room = len(blocks) * bs - req.kv_len
        if room > 0:                      # fill the partial last block first
            k = room if room < remaining else remaining
            req.kv_len += k
            remaining -= k
            if k == room:                 # it became full: hash it
                self._register(req, len(blocks) - 1, registered)
        if remaining > 0:
            nb = ceil_div(remaining, bs)
            if nb > self.total_blocks - self.used:
                self._rollback(req, n_old, old_len, old_base, committed, registered)
                return False
            block_hash = self._block_hash
            take = self._lru.popitem
            h2b = self.hash_to_block
            hashes = req.prompt_block_hashes(bs) if req.kv_base == 0 else None
            n_prompt_blocks = req.input_len // bs
            total = self.total_blocks
            for _ in range(nb):
                b = self._next
                if b < total:                 # a fresh block (the LRU head while any is left)
                    self._next = b + 1
                    ref.append(1)
                    block_hash.append(b"")
                else:
                    b = take(last=False)[0]
                    hb = block_hash[b]
                    if hb:
                        # BLIS deletes the hash entry unconditionally (docs/kv-cache.md).
                        h2b.pop(hb, None)
                        block_hash[b] = b""
                    ref[b] = 1
                j = len(blocks)
                blocks.append(b)
                if remaining >= bs:
                    remaining -= bs
                    req.kv_len += bs
                    h = hashes[j] if hashes is not None and j < n_prompt_blocks else self._block_hash_for(req, j)
                    block_hash[b] = h
                    h2b[h] = b
                else:
                    req.kv_len += remaining
                    remaining = 0
            self.used += nb
            self.cache_misses += nb
        return True

    def _rollback(self, req, n_old: int, old_len: int, old_base: int, committed: list,
                  registered: list) -> None:
        """Restore exactly the state before a failed :meth:`allocate`."""
        for b, h, prev_owner in reversed(registered):
            self._block_hash[b] = b""
            if prev_owner is None:
                self.hash_to_block.pop(h, None)
            else:
                self.hash_to_block[h] = prev_owner
        for b, was_in_use in reversed(committed):
            self._ref[b] -= 1
            self.cache_hits -= 1
            if not was_in_use and self._ref[b] == 0:
                self.used -= 1
                self._lru[b] = None
        del req.kv_blocks[n_old:]
        req.kv_len = old_len
        req.kv_base = old_base

    def append_token(self, req, pos: int, kv_len: int) -> bool:
        """Reserve the slot of one output token at sequence position ``pos``.

        ``kv_len`` is the number of slots the request holds now; ``req.kv_len`` is *not*
        updated (the engine's lazy decode bookkeeping owns it). Filling the last block
        hashes it; otherwise one fresh block is taken from the LRU head (never hashed here).
        Returns False, with nothing changed, when no block is free.
        """
        return self._append_slots(((req, pos, kv_len),)) is None

    def append_tokens(self, slots) -> object | None:
        """:meth:`append_token` for each ``(req, pos, kv_len)`` of ``slots``, in order; returns
        the first request that got no slot (those after it are not tried), or None.

        One call for the decoders of a step whose slot opens or fills a block. A subclass
        that overrides :meth:`append_token` has it called for every slot."""
        if type(self).append_token is not KVCache.append_token:
            append = self.append_token
            for req, pos, kv_len in slots:
                if not append(req, pos, kv_len):
                    return req
            return None
        return self._append_slots(slots)

    def _append_slots(self, slots) -> object | None:
        """The GPU tier's :meth:`append_tokens` (never dispatches to an override)."""
        bs = self.block_size
        total = self.total_blocks
        block_hash = self._block_hash
        h2b = self.hash_to_block
        plain = self._plain_hash
        taken = 0                         # blocks taken by this call
        free = total - self.used
        failed = None
        for req, pos, kv_len in slots:
            blocks = req.kv_blocks
            n = len(blocks)
            room = n * bs - kv_len
            if room > 0:
                if room == 1:             # this token fills the last block: hash it
                    j = n - 1
                    base = req.kv_base
                    if plain and (base or n * bs > req.input_len):
                        # an output block (the common case), hashed inline
                        view = req.kv_view
                        if view is None:
                            view = req.kv_view = memoryview(np.ascontiguousarray(req.tokens))
                        a = base + j * bs
                        h = _sha256((block_hash[blocks[j - 1]] if j else b"")
                                    + view[a:a + bs]).digest()
                    else:
                        h = self._block_hash_for(req, j)
                    b = blocks[j]
                    block_hash[b] = h
                    h2b[h] = b
                continue
            if taken == free:
                failed = req
                break
            taken += 1
            b = self._take_block()
            if not n:
                req.kv_base = pos
            blocks.append(b)
        self.used += taken
        self.cache_misses += taken
        return failed

    def _commit_blocks(self, req, blocks: list[int]) -> None:
        """Append cached blocks to the request's map: ref+1, off the free list if they were
        free, one GPU hit each."""
        ref = self._ref
        lru = self._lru
        mine = req.kv_blocks
        for b in blocks:
            if ref[b] == 0:
                self.used += 1
                del lru[b]
            ref[b] += 1
            mine.append(b)
        self.cache_hits += len(blocks)

    def _register(self, req, j: int, registered: list | None) -> None:
        b = req.kv_blocks[j]
        h = self._block_hash_for(req, j)
        if registered is not None:
            registered.append((b, h, self.hash_to_block.get(h)))
        self._block_hash[b] = h
        self.hash_to_block[h] = b

    def release(self, req) -> None:
        """Drop the request's references, last block first; freed blocks keep their hash."""
        ref = self._ref
        lru = self._lru
        n_freed = 0
        for b in reversed(req.kv_blocks):
            r = ref[b] - 1
            ref[b] = r
            if not r:
                lru[b] = None
                n_freed += 1
        self.used -= n_freed
        req.kv_blocks = []
        req.kv_len = 0
        req.kv_base = 0
        req.kv_view = None

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """INV-4: allocated + free = total, and the free list holds exactly the free blocks."""
        in_use = sum(1 for r in self._ref if r > 0)
        n_free = len(self._lru) + self.total_blocks - self._next
        if in_use != self.used or n_free != self.total_blocks - self.used:
            raise AssertionError(
                f"KV conservation broken: used={self.used} in_use={in_use} "
                f"free_list={n_free} total={self.total_blocks}")
        ref = self._ref
        for b in self._lru:
            if ref[b] != 0:
                raise AssertionError(f"block {b} on the free list with ref {ref[b]}")


class FreeList:
    """Read-only view of a cache's LRU free list, head first: the fresh blocks (never taken
    yet, ascending), then the released ones in release order. ``len``, iteration,
    ``in`` and truth value; the cache itself changes it."""

    __slots__ = ("_kv",)

    def __init__(self, kv: KVCache):
        self._kv = kv

    def __len__(self) -> int:
        kv = self._kv
        return kv.total_blocks - kv._next + len(kv._lru)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self):
        kv = self._kv
        yield from range(kv._next, kv.total_blocks)
        yield from list(kv._lru)

    def __contains__(self, b: int) -> bool:
        kv = self._kv
        return kv._next <= b < kv.total_blocks or b in kv._lru
