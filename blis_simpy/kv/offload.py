"""CPU KV offload as vLLM's OffloadingConnector does it (docs/kv-cache.md, "CPU offload (vLLM
OffloadingConnector)").

The GPU tier is :class:`~blis_simpy.kv.cache.KVCache` unchanged. Beside it sits a CPU tier of
``cpu_blocks`` blocks, content-addressed by block hash with LRU eviction (vLLM's
``LRUOffloadingManager``), and two DMA queues over the host link, one per direction, each
serving its transfers in submission order (vLLM's ``SingleDirectionOffloadingHandler``):

* **Stores.** After each engine step the blocks the step filled (a request's full blocks
  from its next-to-store index on; vLLM's ``_get_reqs_to_store``) are offered to the CPU
  tier: those already there are skipped, room is made by evicting ready, unpinned blocks
  from the LRU head, and if there is not enough room nothing of that request is stored this
  step (tried again with the next step's blocks). The request's blocks are then touched
  (most recent: its first block); a request refused is offered again after every step it
  runs. One store job per request is queued on the GPU->CPU link
  at the end of the step (vLLM submits it at the start of the next one); its blocks become
  loadable when the job completes.
* **Loads.** When a waiting request is scheduled, its full prompt blocks beyond the GPU
  prefix hit are looked up on the CPU tier (ready blocks, in order); with at least one hit
  the engine calls :meth:`start_load`: the GPU hit is committed, fresh GPU blocks are taken
  for the hit blocks (not hashed until the load lands), the CPU blocks are pinned, and one
  load job is queued on the CPU->GPU link at the start of the step. The request waits in the
  queue (vLLM's ``WAITING_FOR_REMOTE_KVS``) and is scheduled from its loaded prefix at the
  first step that starts after the job completes (:meth:`loaded_tokens`).

Transfer time of ``n`` blocks: ``link_latency_us + ceil(n · block_bytes / bandwidth)`` µs,
``bandwidth`` = ``link_gbps`` · 10^9 B/s (exact integer arithmetic). ``block_bytes`` is one
block of all layers on one GPU: with tensor parallelism every rank moves its own shard over
its own link at the same time.

The cache knows nothing of SimPy: the engine passes times in (µs) — :meth:`advance` at the
start of every step, :meth:`end_step` after its execution — and reads back when loads land
(:meth:`next_load_done_us`) and how long a preemption waits for its in-flight stores
(:meth:`consume_pending_transfer_latency`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.kv.cache import KVCache
from blis_simpy.request import QUEUED

log = logging.getLogger("blis_simpy.kv")

#: CPU-tier block state: being stored (not loadable yet); >= 0: ready, pinned by that many loads
STORING = -1


def offload_blocks(cpu_gib: float, block_bytes: int, tp: int) -> int:
    """CPU blocks of a ``cpu_gib`` GiB tier, as vLLM's ``CPUOffloadingSpec`` sizes it:
    ``int(G · 2^30) // (block_bytes · tp)`` — ``kv_offloading_size`` GiB is the budget of the
    whole engine, split over its TP ranks (``block_bytes``: one block, all layers, one GPU)."""
    return int(cpu_gib * (1 << 30)) // (block_bytes * tp)


class OffloadKVCache(KVCache, name="offload"):
    """GPU tier plus a CPU tier of ``cpu_blocks`` blocks filled and read over the host link
    (module docstring). Registered as KV cache kind ``offload``."""

    #: the engine drives this cache's transfers (advance / end_step / loads)
    async_transfers = True
    #: no transfer latency, no mirror: the short path calls ``end_step`` itself
    short_path_safe = True

    class Params(BaseModel):
        """The CPU tier: blocks, bytes of one block on one GPU, host-link GB/s (10^9 B/s per
        direction) and fixed µs per transfer job."""

        model_config = ConfigDict(extra="forbid")
        cpu_blocks: int = Field(gt=0)
        block_bytes: int = Field(gt=0)
        link_gbps: float = Field(gt=0, allow_inf_nan=False)
        link_latency_us: int = Field(0, ge=0)

    def __init__(self, total_blocks: int, block_size: int = 16, *, params=None):
        if params is None:
            raise ValueError("an offload KV cache needs its Params (cpu_blocks, block_bytes, link_gbps)")
        super().__init__(total_blocks, block_size, params=params)
        self.cpu_capacity = int(params.cpu_blocks)
        self.block_bytes = int(params.block_bytes)
        self.link_latency_us = int(params.link_latency_us)
        # bytes per µs as an exact fraction num/den of the decimal given (0.7 GB/s is 700 B/µs,
        # not the binary float's 699.99...): transfer times are exact integers
        rate = Fraction(repr(float(params.link_gbps))) * 1000
        self._rate_num, self._rate_den = rate.numerator, rate.denominator
        #: CPU tier: hash -> STORING or the number of loads pinning it; order = LRU, head first
        self.cpu: OrderedDict[bytes, int] = OrderedDict()
        self._now = 0
        self._h2d_free_us = 0                   # when the CPU->GPU link has finished its queue
        self._d2h_free_us = 0
        self._store_jobs: deque = deque()       # [done_us, hashes, request], done order
        self._load_jobs: deque = deque()        # [done_us, hashes], done order
        self._being_loaded: set[bytes] = set()
        #: request -> [done_us, GPU-hit blocks, loaded blocks, registered?] while it waits
        #: for its load and until it is scheduled again
        self._loads: dict = {}
        self._next_store: dict = {}             # request -> index of its next block to store
        self._dirty: dict = {}                  # request -> full blocks after this step's slots
        self._stall_us = 0
        self.stats = {"lookups": 0, "lookup_hits": 0, "lookups_delayed": 0, "loads": 0,
                      "loaded_blocks": 0, "load_transfer_us": 0, "load_wait_us": 0,
                      "store_jobs": 0, "stored_blocks": 0, "store_transfer_us": 0,
                      "stores_refused": 0, "cpu_evictions": 0, "flush_stall_us": 0,
                      "peak_cpu_blocks": 0}

    # ------------------------------------------------------------------ time
    def transfer_us(self, n_blocks: int) -> int:
        """µs to move ``n_blocks`` blocks one way: latency + ceil(bytes / bandwidth)."""
        b = n_blocks * self.block_bytes * self._rate_den
        return self.link_latency_us + -(-b // self._rate_num)

    def advance(self, now_us: int) -> None:
        """Transfers that completed by ``now_us`` take effect: stored blocks become loadable,
        loaded blocks are unpinned."""
        self._now = now_us
        jobs = self._store_jobs
        cpu = self.cpu
        while jobs and jobs[0][0] <= now_us:
            for h in jobs.popleft()[1]:
                if cpu.get(h) == STORING:
                    cpu[h] = 0
        jobs = self._load_jobs
        while jobs and jobs[0][0] <= now_us:
            hashes = jobs.popleft()[1]
            for h in hashes:
                cpu[h] -= 1
            self._being_loaded.difference_update(hashes)

    def next_load_done_us(self, now_us: int) -> int | None:
        """When the first load of a waiting request lands after ``now_us`` (None: none)."""
        times = [rec[0] for rec in self._loads.values() if rec[0] > now_us]
        return min(times) if times else None

    def consume_pending_transfer_latency(self) -> int:
        """µs the current step waits, before it runs, for the in-flight stores of the requests
        it preempted (vLLM's ``handle_preemptions``); then reset."""
        t = self._stall_us
        self._stall_us = 0
        return t

    # ------------------------------------------------------------------ loads
    def lookup(self, req, n_gpu: int) -> int:
        """Scheduling a waiting request whose GPU prefix hit is ``n_gpu`` blocks: touch its
        prompt blocks on the CPU tier and count the ready ones that follow the hit, in order.
        -1: some of them are being loaded for another request (vLLM delays this one)."""
        hashes = req.prompt_block_hashes(self.block_size)
        cpu = self.cpu
        for h in reversed(hashes):
            if h in cpu:
                cpu.move_to_end(h)
        st = self.stats
        st["lookups"] += 1
        n = 0
        for h in hashes[n_gpu:]:
            s = cpu.get(h)
            if s is None or s < 0:
                break
            n += 1
        if n and self._being_loaded and not self._being_loaded.isdisjoint(hashes[n_gpu:n_gpu + n]):
            st["lookups_delayed"] += 1
            return -1
        if n:
            st["lookup_hits"] += 1
        return n

    def start_load(self, req, cached: list[int], n_ext: int, now_us: int) -> bool:
        """Commit the GPU hit ``cached``, take ``n_ext`` fresh GPU blocks for the CPU hits that
        follow and queue their load on the CPU->GPU link at ``now_us``. False, with nothing
        changed, when the GPU cannot hold them (vLLM's ``allocate_slots`` fails)."""
        ref = self._ref
        taken = sum(1 for b in cached if ref[b] == 0)
        if n_ext + taken > self.total_blocks - self.used:
            return False
        self._commit_blocks(req, cached)
        blocks = req.kv_blocks
        for _ in range(n_ext):
            blocks.append(self._take_block())   # as allocate: the old hash entry goes
        self.used += n_ext
        n_gpu = len(cached)
        req.kv_len = (n_gpu + n_ext) * self.block_size
        req.kv_base = 0
        hashes = req.prompt_block_hashes(self.block_size)[n_gpu:n_gpu + n_ext]
        cpu = self.cpu
        for h in hashes:
            cpu[h] += 1                 # pinned until the load completes
        self._being_loaded.update(hashes)
        start = max(now_us, self._h2d_free_us)
        t = self.transfer_us(n_ext)
        done = self._h2d_free_us = start + t
        self._load_jobs.append([done, hashes])
        self._loads[req] = [done, n_gpu, n_ext, False]
        self._next_store[req] = n_gpu + n_ext
        st = self.stats
        st["loads"] += 1
        st["loaded_blocks"] += n_ext
        st["load_transfer_us"] += t
        st["load_wait_us"] += done - now_us
        return True

    def waiting_for_load(self, req, now_us: int) -> bool:
        """Is ``req`` waiting for a load that has not landed by ``now_us``?"""
        rec = self._loads.get(req)
        return rec is not None and rec[0] > now_us

    def loaded_tokens(self, req) -> int | None:
        """Tokens ``req`` holds after its landed load (its GPU hit and the loaded blocks, now
        registered in the prefix cache), or None when it has no load."""
        rec = self._loads.get(req)
        if rec is None:
            return None
        if not rec[3]:
            rec[3] = True
            blocks, n_gpu = req.kv_blocks, rec[1]
            hashes = req.prompt_block_hashes(self.block_size)
            for j in range(n_gpu, n_gpu + rec[2]):
                b, h = blocks[j], hashes[j]
                self._block_hash[b] = h
                self.hash_to_block[h] = b
        return len(req.kv_blocks) * self.block_size

    def resumed(self, req) -> None:
        """``req`` was scheduled after its load: forget the load."""
        del self._loads[req]

    # ------------------------------------------------------------------ stores
    def allocate(self, req, start: int, end: int, cached: list[int] | tuple = ()) -> bool:
        if not KVCache.allocate(self, req, start, end, cached):
            return False
        full = req.kv_len // self.block_size
        if full > self._next_store.get(req, 0):
            self._dirty[req] = full
        return True

    def append_token(self, req, pos: int, kv_len: int) -> bool:
        if not KVCache.append_token(self, req, pos, kv_len):
            return False
        full, rest = divmod(kv_len + 1, self.block_size)
        if not rest and full > self._next_store.get(req, 0):
            self._dirty[req] = full
        return True

    def end_step(self, start_us: int, end_us: int) -> None:
        """The step that started at ``start_us`` ends at ``end_us``: store the blocks it filled
        (module docstring), requests in batch order, their jobs queued at ``end_us``."""
        if not self._dirty:
            return
        dirty = sorted(self._dirty.items(), key=lambda kv: kv[0].batch_pos)
        self._dirty = {}
        retry = self._dirty         # refused now: offered again after the next step, as vLLM does
        self.advance(start_us)
        cpu = self.cpu
        bh = self._block_hash
        nxt = self._next_store
        st = self.stats
        for req, full in dirty:
            lo = nxt.get(req, 0)
            blocks = req.kv_blocks
            new = [bh[b] for b in blocks[lo:full]]
            todo = [h for h in new if h not in cpu]
            short = len(todo) - (self.cpu_capacity - len(cpu))
            if short > 0:
                victims = []
                for h, s in cpu.items():
                    if s == 0:
                        victims.append(h)
                        if len(victims) == short:
                            break
                else:
                    st["stores_refused"] += 1
                    retry[req] = full
                    continue
                for h in victims:
                    del cpu[h]
                st["cpu_evictions"] += short
            nxt[req] = full
            if not todo:
                continue
            for h in todo:
                cpu[h] = STORING
            for b in reversed(blocks[:full]):     # touch: the first block most recent
                h = bh[b]
                if h in cpu:
                    cpu.move_to_end(h)
            start = max(end_us, self._d2h_free_us)
            t = self.transfer_us(len(todo))
            done = self._d2h_free_us = start + t
            self._store_jobs.append([done, todo, req])
            st["store_jobs"] += 1
            st["stored_blocks"] += len(todo)
            st["store_transfer_us"] += t
        if len(cpu) > st["peak_cpu_blocks"]:
            st["peak_cpu_blocks"] = len(cpu)

    # ------------------------------------------------------------------ release
    def release(self, req) -> None:
        """GPU release. A preempted request (back in the queue) keeps its next-to-store index,
        as vLLM does, and the step that preempted it waits for its in-flight stores, which
        then count as complete; any other release forgets the request."""
        KVCache.release(self, req)
        self._dirty.pop(req, None)
        self._loads.pop(req, None)
        if req.state != QUEUED:
            self._next_store.pop(req, None)
            return
        cpu = self.cpu
        last = self._now
        for done, hashes, owner in self._store_jobs:
            if owner is req and done > self._now:
                last = done
                for h in hashes:
                    if cpu.get(h) == STORING:
                        cpu[h] = 0
        if last > self._now:
            wait = last - self._now
            self.stats["flush_stall_us"] += wait
            if wait > self._stall_us:
                self._stall_us = wait

    # ------------------------------------------------------------------ metrics
    def kv_thrashing_rate(self) -> float:
        """CPU-tier evictions per block stored (0 when nothing was stored)."""
        st = self.stats
        return st["cpu_evictions"] / st["stored_blocks"] if st["stored_blocks"] else 0.0

    def offload_stats(self) -> dict:
        """The CPU tier's counters (docs/metrics.md, "kv_offload"): blocks, tokens, µs."""
        st = dict(self.stats)
        st["loaded_tokens"] = st["loaded_blocks"] * self.block_size
        st["cpu_blocks"] = self.cpu_capacity
        st["cpu_blocks_used"] = len(self.cpu)
        return st

    def check_invariants(self) -> None:
        """INV-4 on the GPU tier; the CPU tier within capacity, no negative pin count."""
        super().check_invariants()
        if len(self.cpu) > self.cpu_capacity:
            raise AssertionError(f"CPU KV tier holds {len(self.cpu)} blocks, capacity {self.cpu_capacity}")
        bad = [s for s in self.cpu.values() if s < STORING]
        if bad:
            raise AssertionError(f"CPU KV tier block pinned a negative number of times: {bad[0]}")
