"""GPU + CPU tiered KV cache: BLIS's vLLM-v1 "mirror" model (docs/kv-cache.md, "CPU tier").

The GPU tier is :class:`~blis_simpy.kv.cache.KVCache` unchanged: it keeps its prefix cache
across releases. The CPU tier is a content-addressed LRU **mirror** of full, hashed GPU
blocks that makes prefixes outlive their GPU blocks:

* after every step's Execute the engine calls :meth:`TieredKVCache.mirror_to_cpu` with the
  running batch: every full hashed block of every request is touched on the CPU tier, or
  stored there (``mirror_count``; a store into a full tier evicts the LRU entry,
  ``cpu_evictions``);
* when a GPU allocation fails, the prompt's blocks that are on the CPU but no longer on the
  GPU are *reloaded* into free GPU blocks (``cpu_hits``; each costs
  ``base_latency + ceil(block_size / bandwidth)`` µs, added to the current step), and the
  allocation is retried on the longer cached prefix; nothing to reload is a ``cpu_miss``.

The CPU tier holds hashes only: a hash identifies the whole token prefix up to its block
(chained hashing), so it *is* the content reference, and a reloaded block's
tokens are those of whichever request later commits it.

Block contents. The GPU tier stores no tokens: block ``j`` of a request holds the sequence
positions ``[kv_base + j*bs, ...)``. BLIS stores tokens, and after a reload commit its block
map can run ahead of the engine's progress (the committed prefix reaches past the chunk, or
a failed allocation leaves committed blocks behind); the next tokens are then appended
after the committed blocks, not at their sequence positions. This class keeps that exact:
before each allocation it re-bases ``kv_base`` so that the next slot holds the token being
allocated (:meth:`_realign`), and a partially filled last block that receives tokens out of
sequence remembers its first tokens so its eventual hash is BLIS's (:meth:`_block_hash_for`).
On the normal path (``kv_base + kv_len == start``) none of this does anything.

Units: blocks, token slots, µs (1 tick = 1 µs); bandwidth in blocks per µs.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from functools import partial
from itertools import chain

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.kv.cache import KVCache
from blis_simpy.request import hash_block
from blis_simpy.units import ceil_div

log = logging.getLogger("blis_simpy.kv")


def offload_threshold_warning(threshold: float) -> str:
    """BLIS's warning for the deprecated, ignored ``--kv-offload-threshold``."""
    return ("KVOffloadThreshold is deprecated in vLLM v1 mirror model and will be ignored. GPU "
            "prefix cache is now preserved on release; the CPU tier mirrors full hashed blocks "
            f"(threshold {threshold:g})")


def check_tier_params(cpu_blocks: int, transfer_bandwidth: float, transfer_base_latency_us: int,
                      offload_threshold: float) -> None:
    """Validate the CPU-tier parameters (docs/kv-cache.md, "CPU tier"); raises ValueError."""
    if isinstance(cpu_blocks, bool) or int(cpu_blocks) != cpu_blocks or cpu_blocks <= 0:
        raise ValueError(f"CPU KV blocks must be an integer > 0 for a tiered cache, got {cpu_blocks!r}")
    bw = float(transfer_bandwidth)
    if not math.isfinite(bw) or bw <= 0:
        raise ValueError(f"KV transfer bandwidth must be finite and > 0 blocks/µs, got {transfer_bandwidth!r}")
    base = transfer_base_latency_us
    if isinstance(base, bool) or int(base) != base or base < 0:
        raise ValueError(f"KV transfer base latency must be an integer >= 0 µs, got {base!r}")
    thr = float(offload_threshold)
    if not math.isfinite(thr) or not 0.0 <= thr <= 1.0:
        raise ValueError(f"KV offload threshold must be finite and in [0, 1], got {offload_threshold!r}")


class TieredKVCache(KVCache, name="tiered"):
    """GPU tier (:class:`KVCache`) plus a CPU mirror tier of ``cpu_blocks`` blocks.

    ``transfer_bandwidth`` is in blocks per µs, ``transfer_base_latency_us`` in µs per
    reloaded block. ``offload_threshold`` is validated and ignored, as in BLIS (a warning is
    logged when it is non-zero). Registered as KV cache kind ``tiered``; its :attr:`Params`
    are the same four values.
    """

    #: its reloads add step time and it mirrors every step's blocks: no short path
    short_path_safe = False

    class Params(BaseModel):
        """The CPU tier: blocks, reload bandwidth (blocks/µs), reload cost per block (µs)."""

        model_config = ConfigDict(extra="forbid")
        cpu_blocks: int = Field(gt=0)
        transfer_bandwidth: float = Field(100.0, gt=0, allow_inf_nan=False)
        transfer_base_latency_us: int = Field(0, ge=0)
        offload_threshold: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)

    def __init__(self, total_blocks: int, block_size: int = 16, *, cpu_blocks: int,
                 transfer_bandwidth: float = 100.0, transfer_base_latency_us: int = 0,
                 offload_threshold: float = 0.0, params=None):
        super().__init__(total_blocks, block_size,
                         params=params if params is not None else self.Params.model_construct())
        check_tier_params(cpu_blocks, transfer_bandwidth, transfer_base_latency_us, offload_threshold)
        if params is None:
            self.params = self.Params(cpu_blocks=cpu_blocks, transfer_bandwidth=transfer_bandwidth,
                                      transfer_base_latency_us=transfer_base_latency_us,
                                      offload_threshold=offload_threshold)
        self.cpu_capacity = int(cpu_blocks)
        self.transfer_bandwidth = float(transfer_bandwidth)
        self.transfer_base_latency_us = int(transfer_base_latency_us)
        self.offload_threshold = float(offload_threshold)
        #: µs one reloaded block adds to the step: base + ceil(block_size / bandwidth)
        self.reload_cost_us = self.transfer_base_latency_us + math.ceil(self.block_size / self.transfer_bandwidth)
        # CPU tier: hash -> None, insertion order = LRU order, head = next victim.
        self.cpu: OrderedDict[bytes, None] = OrderedDict()
        self.cpu_hits = 0
        self.cpu_misses = 0
        self.cpu_evictions = 0
        self.mirror_count = 0
        self.pending_latency_us = 0
        # request -> (block index, its first tokens) for a partial last block whose next
        # tokens are not its sequence continuation (see the module docstring)
        self._irregular: dict = {}
        # request -> [its block list, n, hashes of its first n blocks (hashed ones only)]
        self._settled: dict = {}

    @classmethod
    def factory(cls, *, cpu_blocks: int, transfer_bandwidth: float = 100.0,
                transfer_base_latency_us: int = 0, offload_threshold: float = 0.0):
        """A ``kv_factory(total_blocks, block_size)``; the tier parameters are checked now.
        A non-zero ``offload_threshold`` (given only when the user set it) is ignored with one
        warning here, not one per instance."""
        check_tier_params(cpu_blocks, transfer_bandwidth, transfer_base_latency_us, offload_threshold)
        if offload_threshold != 0:
            log.warning("%s", offload_threshold_warning(offload_threshold))
        return partial(cls, cpu_blocks=cpu_blocks, transfer_bandwidth=transfer_bandwidth,
                       transfer_base_latency_us=transfer_base_latency_us,
                       offload_threshold=offload_threshold)

    @classmethod
    def factory_for(cls, params) -> partial:
        return partial(cls.factory(cpu_blocks=params.cpu_blocks,
                                   transfer_bandwidth=params.transfer_bandwidth,
                                   transfer_base_latency_us=params.transfer_base_latency_us,
                                   offload_threshold=params.offload_threshold), params=params)

    # ------------------------------------------------------------------ metrics
    def cache_hit_rate(self) -> float:
        """``gpu_hits / (gpu_hits + gpu_misses + cpu_misses)`` (0 when nothing counted)."""
        n = self.cache_hits + self.cache_misses + self.cpu_misses
        return self.cache_hits / n if n else 0.0

    def kv_thrashing_rate(self) -> float:
        """``cpu_evictions / mirror_count`` (0 when nothing was mirrored)."""
        return self.cpu_evictions / self.mirror_count if self.mirror_count else 0.0

    def consume_pending_transfer_latency(self) -> int:
        """Reload time (µs) accrued since the last call, then reset."""
        t = self.pending_latency_us
        self.pending_latency_us = 0
        return t

    # ------------------------------------------------------------------ CPU tier
    def _cpu_store(self, h: bytes) -> None:
        cpu = self.cpu
        if len(cpu) >= self.cpu_capacity:
            cpu.popitem(last=False)
            self.cpu_evictions += 1
        cpu[h] = None
        self.mirror_count += 1

    def mirror_to_cpu(self, batch) -> None:
        """Copy every full hashed block of the batch's requests to the CPU tier, in batch
        order: touch it if present, else store it (docs/kv-cache.md, "CPU tier").

        ``batch`` is any iterable of requests. Two things keep this cheap although it visits
        every block of every running request at every step:

        * a held block's hash never changes once another block follows it (only a map's
          last block receives tokens), so each request's hashes up to its last block are
          kept between steps and only new blocks and the last one are read;
        * the walk runs at C speed: ``move_to_end`` touches each hash and raises KeyError
          at the first hash the tier lacks; that hash is stored and the walk resumes.
        """
        bh = self._block_hash
        seen = self._settled
        parts = []
        for req in batch:
            blocks = req.kv_blocks
            k = len(blocks) - 1
            if k < 0:
                continue
            ent = seen.get(req)
            if ent is None or ent[0] is not blocks:
                ent = seen[req] = [blocks, 0, []]
            if ent[1] < k:
                ent[2].extend(filter(None, map(bh.__getitem__, blocks[ent[1]:k])))
                ent[1] = k
            parts.append(ent[2])
            h = bh[blocks[k]]
            if h:
                parts.append((h,))
        hashes = chain.from_iterable(parts)
        touch = self.cpu.move_to_end
        store = self._cpu_store
        while True:
            try:
                deque(map(touch, hashes), maxlen=0)
                return
            except KeyError as exc:
                store(exc.args[0])

    # ------------------------------------------------------------------ allocation
    def allocate(self, req, start: int, end: int, cached: list[int] | tuple = ()) -> bool:
        """GPU allocation; on failure, reload the prompt's prefix from the CPU tier and retry
        (docs/kv-cache.md, "CPU tier"). Returns False when the tokens cannot be placed."""
        if req.kv_blocks and req.kv_base + req.kv_len != start:
            self._realign(req, start)
        if self._gpu_allocate(req, start, end, cached):
            return True
        if not self._reload(req):
            self.cpu_misses += 1
            return False
        bs = self.block_size
        cached2 = self.get_cached_blocks(req)
        nc = len(cached2)
        ns = nc * bs
        if ns > start:
            lo = ceil_div(start, bs) if req.kv_blocks else 0
            if ns >= end:
                self._commit(req, cached2[lo:min(ceil_div(end, bs), nc)], end)
                return True
            self._commit(req, cached2[lo:nc], ns)
            return self._gpu_allocate(req, ns, end, cached2)
        return self._gpu_allocate(req, start, end, cached)

    def append_token(self, req, pos: int, kv_len: int) -> bool:
        """The fast engine's decode slot: GPU first, then the tier logic. A decode slot fails
        only when no GPU block is free, so nothing can be reloaded: a CPU miss."""
        if KVCache.append_token(self, req, pos, kv_len):
            return True
        if not self._reload(req):
            self.cpu_misses += 1
            return False
        return KVCache.append_token(self, req, pos, kv_len)  # pragma: no cover - needs a free block

    def _gpu_allocate(self, req, start: int, end: int, cached) -> bool:
        """The GPU tier's allocate, without re-entering :meth:`append_token` for decode."""
        if req.pi < req.prefill_to:
            return KVCache.allocate(self, req, start, end, cached)
        if end <= start:
            return True
        if KVCache.append_token(self, req, start, req.kv_len):
            req.kv_len += 1
            return True
        return False

    def _reload(self, req) -> int:
        """Step 1 of a failed allocation: bring the prompt's prefix blocks back from the CPU tier.

        Walks the prompt's full blocks; skips those indexed on the GPU; stops at the first
        one missing on the CPU or after as many reloads as there were free GPU blocks.
        Each reload takes the free-list head (dropping its old hash), gives it the block's
        hash and leaves it free at the LRU tail. Returns the number of reloaded blocks.
        """
        n_free = self.total_blocks - self.used
        if n_free <= 0:
            return 0
        h2b = self.hash_to_block
        cpu = self.cpu
        lru = self._lru
        block_hash = self._block_hash
        n = 0
        for h in req.prompt_block_hashes(self.block_size):
            if h in h2b:
                continue
            if h not in cpu or n >= n_free:
                break
            b = self._take_head()
            old = block_hash[b]
            if old:
                h2b.pop(old, None)
            block_hash[b] = h
            h2b[h] = b
            lru[b] = None
            cpu.move_to_end(h)
            n += 1
        self.cpu_hits += n
        self.pending_latency_us += n * self.reload_cost_us
        return n

    def _commit(self, req, blocks: list[int], next_pos: int) -> None:
        """Append cached blocks to the request's map (ref++, off the free list, hits++);
        the next token the engine allocates goes to sequence position ``next_pos``."""
        if blocks:
            self._commit_blocks(req, blocks)
            req.kv_len = len(req.kv_blocks) * self.block_size   # the last block is a full one now
        self._realign(req, next_pos)

    # ------------------------------------------------------------------ block contents
    def _realign(self, req, pos: int) -> None:
        """Make the request's next slot hold sequence position ``pos`` (BLIS appends the
        allocated tokens after whatever its block map holds)."""
        blocks = req.kv_blocks
        if not blocks or req.kv_base + req.kv_len == pos:
            return
        bs = self.block_size
        j = len(blocks) - 1
        k = req.kv_len - j * bs             # slots used in the last block
        if k < bs:                          # partial: keep its tokens, continue at pos
            self._irregular[req] = (j, self._block_tokens(req, j, k))
        req.kv_base = pos - req.kv_len

    def _block_tokens(self, req, j: int, k: int) -> np.ndarray:
        """The first ``k`` tokens held by block ``j`` of the request."""
        a = req.kv_base + j * self.block_size
        rec = self._irregular.get(req)
        if rec is not None and rec[0] == j:
            head = rec[1]
            n = len(head)
            if k <= n:
                return head[:k]
            return np.concatenate((head, req.tokens[a + n:a + k]))
        return req.tokens[a:a + k].copy()

    def _block_hash_for(self, req, j: int) -> bytes:
        if self._irregular:
            rec = self._irregular.get(req)
            if rec is not None and rec[0] == j:
                prev = self._block_hash[req.kv_blocks[j - 1]] if j > 0 else b""
                return hash_block(prev, self._block_tokens(req, j, self.block_size))
        return KVCache._block_hash_for(self, req, j)

    def release(self, req) -> None:
        """GPU release only (nothing is offloaded on release)."""
        KVCache.release(self, req)
        self._settled.pop(req, None)
        if self._irregular:
            self._irregular.pop(req, None)

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """INV-4 on the GPU tier; the CPU tier never exceeds its capacity."""
        super().check_invariants()
        if len(self.cpu) > self.cpu_capacity:
            raise AssertionError(f"CPU KV tier holds {len(self.cpu)} blocks, capacity {self.cpu_capacity}")
