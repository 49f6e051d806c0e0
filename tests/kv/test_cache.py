"""GPU-tier KV cache with prefix caching (docs/kv-cache.md, INV-4).

Block IDs are popped from the LRU head; a fresh cache's free list is 0, 1, 2, ... so the
expected block IDs below are worked out by hand. Token IDs are small distinct integers so
each test's prefix sharing is explicit.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_simpy.kv.cache import KVCache
from blis_simpy.request import Request, hash_block, hash_chain

BS = 4


def req(rid, prompt, output=(), *, pi=0):
    r = Request(rid, 0, list(prompt), list(output))
    r.pi = pi
    return r


def toks(start, n):
    return list(range(start, start + n))


def H(tokens, j, bs=BS):
    """Chained hash of block j of ``tokens`` (hashed from scratch, independent of the cache)."""
    return hash_chain(np.asarray(tokens[:(j + 1) * bs], dtype=np.int32), bs)[j]


def snapshot(c, *reqs):
    return copy.deepcopy({
        "ref": list(c.ref), "block_hash": list(c.block_hash), "hash_to_block": dict(c.hash_to_block),
        "free": list(c.free), "used": c.used, "hits": c.cache_hits, "misses": c.cache_misses,
        "reqs": [(list(r.kv_blocks), r.kv_len, r.kv_base, r.pi) for r in reqs],
    })


def admit(c, r):
    """What the engine does in Phase 2: look up the cached prefix, allocate the rest."""
    cached = c.get_cached_blocks(r)
    start = len(cached) * c.block_size
    return c.allocate(r, start, r.input_len, cached), cached


# ---------------------------------------------------------------------------- construction
def test_fresh_cache():
    c = KVCache(5, 4)
    assert list(c.free) == [0, 1, 2, 3, 4]
    assert c.used == 0 and c.free_blocks == 5 and c.utilization() == 0.0
    assert c.cache_hit_rate() == 0.0
    assert c.hash_to_block == {} and c.block_hash == [b""] * 5 and c.ref == [0] * 5
    c.check_invariants()


@pytest.mark.parametrize(("total", "bs"), [(0, 16), (-1, 16), (10, 0), (10, -4)])
def test_construction_validation(total, bs):
    with pytest.raises(ValueError):
        KVCache(total, bs)


def test_single_tier_stubs():
    c = KVCache(3, 2)
    assert c.kv_thrashing_rate() == 0.0
    assert c.consume_pending_transfer_latency() == 0
    assert c.mirror_to_cpu([]) is None


# ---------------------------------------------------------------------------- basic prefill
def test_prefill_allocation_hashes_full_prompt_blocks_only():
    c = KVCache(10, BS)
    a = req("a", toks(100, 10), toks(900, 3))           # 2 full blocks + 2 tokens
    assert c.allocate(a, 0, 10)
    assert a.kv_blocks == [0, 1, 2] and a.kv_len == 10 and a.kv_base == 0
    assert c.block_hash[0] == H(a.tokens, 0)
    assert c.block_hash[1] == H(a.tokens, 1)
    assert c.block_hash[2] == b""                        # partial: not hashed
    assert c.hash_to_block == {H(a.tokens, 0): 0, H(a.tokens, 1): 1}
    assert c.ref[:4] == [1, 1, 1, 0]
    assert c.used == 3 and c.cache_misses == 3 and c.cache_hits == 0
    assert list(c.free) == [3, 4, 5, 6, 7, 8, 9]
    c.check_invariants()


def test_block_hash_is_chained_sha256_over_int32_bytes():
    import hashlib
    t = [1, 2, 3, 4, 5, 6, 7, 8]
    b0 = np.asarray(t[:4], dtype=np.int32).tobytes()
    b1 = np.asarray(t[4:], dtype=np.int32).tobytes()
    h0 = hashlib.sha256(b0).digest()
    h1 = hashlib.sha256(h0 + b1).digest()
    assert hash_chain(np.asarray(t, dtype=np.int32), 4) == [h0, h1]
    assert hash_block(h0, np.asarray(t[4:], dtype=np.int32)) == h1
    # same second block after a different first block: different hash (chaining)
    other = [9, 2, 3, 4, 5, 6, 7, 8]
    assert hash_chain(np.asarray(other, dtype=np.int32), 4)[1] != h1


# ---------------------------------------------------------------------------- prefix hits
def test_prefix_hits_after_release():
    c = KVCache(10, BS)
    a = req("a", toks(100, 10), toks(900, 3))
    assert c.allocate(a, 0, 10)
    c.release(a)
    # released blocks keep their hash; tail first: 2, 1, 0 appended in that order
    assert a.kv_blocks == [] and a.kv_len == 0 and a.kv_base == 0
    assert c.used == 0 and list(c.free) == [3, 4, 5, 6, 7, 8, 9, 2, 1, 0]
    assert c.hash_to_block == {H(a.tokens, 0): 0, H(a.tokens, 1): 1}
    assert c.block_hash[0] and c.block_hash[1]

    # b shares a's first 8 tokens, then diverges: 8 + 5 = 13 tokens
    b = req("b", toks(100, 8) + toks(500, 5), toks(950, 2))
    hits_before = (c.cache_hits, c.cache_misses)
    assert c.get_cached_blocks(b) == [0, 1]
    assert (c.cache_hits, c.cache_misses) == hits_before      # the lookup is pure
    ok, cached = admit(c, b)
    assert ok and cached == [0, 1]
    # cached blocks committed (taken off the free list), then 2 fresh from the head: 3, 4
    assert b.kv_blocks == [0, 1, 3, 4] and b.kv_len == 13 and b.kv_base == 0
    assert c.cache_hits == 2 and c.cache_misses == 3 + 2
    assert list(c.free) == [5, 6, 7, 8, 9, 2]
    assert c.block_hash[3] == H(b.tokens, 2) and c.block_hash[4] == b""
    assert c.used == 4
    c.check_invariants()


def test_cached_blocks_in_use_by_another_request_are_shared():
    c = KVCache(10, BS)
    a = req("a", toks(100, 8), [1])
    assert c.allocate(a, 0, 8)
    b = req("b", toks(100, 8) + toks(200, 2), [1])
    ok, cached = admit(c, b)
    assert ok and cached == [0, 1]
    assert b.kv_blocks == [0, 1, 2]
    assert c.ref[:3] == [2, 2, 1]
    assert c.used == 3                    # shared blocks count once
    assert c.cache_hits == 2 and c.cache_misses == 3
    c.release(a)
    assert c.ref[:3] == [1, 1, 1] and c.used == 3 and 0 not in c.free
    c.release(b)
    # b releases 2, 1, 0 (last first)
    assert c.used == 0 and list(c.free)[-3:] == [2, 1, 0]
    c.check_invariants()


def test_get_cached_blocks_only_full_blocks_longest_prefix():
    c = KVCache(10, BS)
    a = req("a", toks(100, 12), [1])
    assert c.allocate(a, 0, 12)
    # identical 11-token prompt: only 2 full blocks can match
    assert c.get_cached_blocks(req("x", toks(100, 11))) == [0, 1]
    # diverges inside block 1: only block 0
    assert c.get_cached_blocks(req("y", toks(100, 5) + [7, 7, 7, 7, 7, 7, 7])) == [0]
    # same tokens as a's block 1 but at block 0: chaining makes it a miss
    assert c.get_cached_blocks(req("z", toks(104, 8))) == []
    # prompt shorter than a block
    assert c.get_cached_blocks(req("w", toks(100, 3))) == []


def test_cache_hit_rate_formula():
    c = KVCache(10, BS)
    a = req("a", toks(100, 10), [1])
    assert c.allocate(a, 0, 10)           # 3 misses
    assert c.cache_hit_rate() == 0.0
    c.release(a)
    b = req("b", toks(100, 8) + toks(300, 4), [1])
    assert admit(c, b)[0]                 # 2 hits, 1 miss
    assert (c.cache_hits, c.cache_misses) == (2, 4)
    assert c.cache_hit_rate() == 2 / 6
    b.pi = 12
    assert c.allocate(b, 12, 13)          # decode: a fresh block, one more miss
    assert c.cache_hit_rate() == 2 / 7


# ---------------------------------------------------------------------------- LRU eviction
def test_lru_victim_order_tail_blocks_evicted_first():
    c = KVCache(10, BS)
    a = req("a", toks(100, 10), [1])                   # blocks 0, 1 (hashed), 2 (partial)
    assert c.allocate(a, 0, 10)
    c.release(a)
    assert list(c.free) == [3, 4, 5, 6, 7, 8, 9, 2, 1, 0]
    h0, h1 = H(a.tokens, 0), H(a.tokens, 1)

    filler = req("f", toks(5000, 28), [1])              # 7 blocks: the never-used ones
    assert c.allocate(filler, 0, 28)
    assert filler.kv_blocks == [3, 4, 5, 6, 7, 8, 9]
    assert c.get_cached_blocks(a) == [0, 1]

    d = req("d", toks(6000, 4), [1])
    assert c.allocate(d, 0, 4)
    assert d.kv_blocks == [2]                           # a's (unhashed) tail block goes first
    assert c.get_cached_blocks(a) == [0, 1]

    e = req("e", toks(7000, 4), [1])
    assert c.allocate(e, 0, 4)
    assert e.kv_blocks == [1]                           # then a's last hashed block
    assert h1 not in c.hash_to_block                    # its old hash is gone from the index
    assert c.block_hash[1] == H(e.tokens, 0)            # and replaced by e's
    assert c.hash_to_block[H(e.tokens, 0)] == 1
    assert c.get_cached_blocks(a) == [0]                # the prefix shrank from the end

    g = req("g", toks(8000, 2), [1])
    assert c.allocate(g, 0, 2)
    assert g.kv_blocks == [0]
    assert h0 not in c.hash_to_block and c.block_hash[0] == b""   # partial: no new hash
    assert c.get_cached_blocks(a) == []
    assert not c.free and c.used == 10
    c.check_invariants()


def test_pop_of_hashed_free_block_in_decode_removes_its_hash():
    c = KVCache(3, BS)
    a = req("a", toks(100, 4), [1])
    assert c.allocate(a, 0, 4)
    c.release(a)
    assert list(c.free) == [1, 2, 0]
    b = req("b", toks(200, 8), toks(900, 3), pi=0)
    assert c.allocate(b, 0, 8)                           # blocks 1, 2
    b.pi = 8
    assert c.allocate(b, 8, 9)                           # decode: pops block 0
    assert b.kv_blocks == [1, 2, 0]
    assert H(a.tokens, 0) not in c.hash_to_block
    assert c.block_hash[0] == b""                        # fresh decode block: not hashed
    assert set(c.hash_to_block.values()) == {1, 2}
    c.check_invariants()


def test_release_frees_last_block_first_and_keeps_hashes():
    c = KVCache(6, BS)
    a = req("a", toks(100, 8), [1])
    b = req("b", toks(200, 12), [1])
    assert c.allocate(a, 0, 8) and c.allocate(b, 0, 12)
    assert a.kv_blocks == [0, 1] and b.kv_blocks == [2, 3, 4]
    c.release(b)
    c.release(a)
    assert list(c.free) == [5, 4, 3, 2, 1, 0]
    assert len(c.hash_to_block) == 5
    c.release(a)                                         # releasing again is harmless
    assert c.used == 0 and c.ref == [0] * 6
    c.check_invariants()


def test_unconditional_hash_delete_on_pop_quirk():
    """Two blocks can carry the same hash (the second allocation did not ask for hits);
    popping one deletes the index entry even if it points to the other (BLIS's
    pop_free deletes the hash unconditionally). The lookup then stops at that first miss
    although the next block's hash is still indexed."""
    c = KVCache(4, BS)
    a = req("a", toks(100, 8), [1])
    b = req("b", toks(100, 4), [1])                      # a's first block, allocated apart
    assert c.allocate(a, 0, 8)                           # blocks 0, 1
    assert c.allocate(b, 0, 4)                           # no cached blocks passed: block 2
    h0, h1 = H(a.tokens, 0), H(a.tokens, 1)
    assert c.block_hash[0] == c.block_hash[2] == h0
    assert c.hash_to_block == {h0: 2, h1: 1}             # the later one wins
    assert c.get_cached_blocks(a) == [2, 1]
    c.release(b)
    c.release(a)
    assert list(c.free) == [3, 2, 1, 0]
    x = req("x", toks(300, 8), [1])
    assert c.allocate(x, 0, 8)                           # pops 3, then 2 (hash h0)
    assert x.kv_blocks == [3, 2]
    assert h0 not in c.hash_to_block                     # block 0 still holds h0, unindexed
    assert c.block_hash[0] == h0
    assert c.hash_to_block[h1] == 1                      # block 1 is still indexed ...
    assert c.get_cached_blocks(a) == []                  # ... but the prefix walk stops at 0



def test_fresh_block_hashed_like_a_later_victim_is_indexed_then_dropped():
    """A prefill's fresh blocks are handled one by one: drop the popped block's old hash,
    then index its new one. When a new hash is the old hash of a block popped *later* in
    the same allocation, that later drop removes it (the unconditional delete again), so
    the index keeps neither."""
    c = KVCache(4, BS)
    a = req("a", toks(100, 8), [1])
    b = req("b", toks(200, 8), [1])
    assert c.allocate(a, 0, 8) and c.allocate(b, 0, 8)   # a: 0, 1; b: 2, 3
    c.release(b)
    c.release(a)
    assert list(c.free) == [3, 2, 1, 0]
    x = req("x", toks(100, 12), [1])                     # a's prompt and one more block
    assert c.allocate(x, 0, 12)                          # no hits asked for: pops 3, 2, 1
    h0, h1, h2 = (H(x.tokens, j) for j in range(3))
    assert x.kv_blocks == [3, 2, 1]
    assert [c.block_hash[b] for b in (3, 2, 1, 0)] == [h0, h1, h2, h0]
    assert c.hash_to_block == {h0: 3, h2: 1}             # h1 went with block 1's old hash
    assert c.get_cached_blocks(x) == [3]
    c.check_invariants()


def test_prefill_of_many_blocks_indexes_each_prompt_block_in_order():
    """The common prefill: every fresh block but a partial last one gets its prompt hash."""
    c = KVCache(8, BS)
    a = req("a", toks(100, 22), [1])                     # 5 full blocks and 2 tokens
    assert c.allocate(a, 0, 22)
    assert a.kv_blocks == [0, 1, 2, 3, 4, 5] and a.kv_len == 22
    hs = [H(a.tokens, j) for j in range(5)]
    assert c.block_hash[:6] == hs + [b""]
    assert c.hash_to_block == dict(zip(hs, range(5), strict=True))
    assert c.ref[:6] == [1] * 6 and c.used == 6 and c.cache_misses == 6
    assert list(c.free) == [6, 7]


# ---------------------------------------------------------------------------- partial blocks
def test_prefill_partial_block_filled_then_hashed():
    c = KVCache(10, BS)
    a = req("a", toks(100, 11), [1])
    assert c.allocate(a, 0, 2)                 # chunk 1: [0, 2)
    assert a.kv_blocks == [0] and a.kv_len == 2 and c.block_hash[0] == b""
    a.pi = 2
    assert c.allocate(a, 2, 5)                 # chunk 2: fills block 0 (2 slots), 1 fresh
    assert a.kv_blocks == [0, 1] and a.kv_len == 5
    assert c.block_hash[0] == H(a.tokens, 0) and c.hash_to_block[H(a.tokens, 0)] == 0
    assert c.block_hash[1] == b""
    assert c.cache_misses == 2
    a.pi = 5
    assert c.allocate(a, 5, 11)                # fills block 1 (3 slots), block 2 with 3
    assert a.kv_blocks == [0, 1, 2] and a.kv_len == 11
    assert c.block_hash[1] == H(a.tokens, 1) and c.block_hash[2] == b""
    assert c.hash_to_block == {H(a.tokens, 0): 0, H(a.tokens, 1): 1}
    assert c.cache_misses == 3 and c.used == 3
    c.check_invariants()


def test_prefill_chunk_within_partial_block_takes_no_fresh_block():
    c = KVCache(10, BS)
    a = req("a", toks(100, 8), [1])
    assert c.allocate(a, 0, 1)
    a.pi = 1
    assert c.allocate(a, 1, 3)                 # room 3, 2 tokens: stays partial
    assert a.kv_blocks == [0] and a.kv_len == 3 and c.block_hash[0] == b""
    a.pi = 3
    assert c.allocate(a, 3, 4)                 # exactly fills it
    assert a.kv_blocks == [0] and a.kv_len == 4 and c.block_hash[0] == H(a.tokens, 0)
    assert c.used == 1 and c.cache_misses == 1


def test_decode_fills_prompt_block_then_hashes_it_fresh_decode_blocks_start_unhashed():
    c = KVCache(10, BS)
    a = req("a", toks(100, 6), toks(900, 6))   # positions 0..5 prompt, 6..11 output
    assert c.allocate(a, 0, 6)
    assert a.kv_blocks == [0, 1] and c.block_hash[1] == b""
    a.pi = 6
    assert c.allocate(a, 6, 7)                 # slot 6: block 1 has 1 free slot left
    assert a.kv_len == 7 and c.block_hash[1] == b""
    a.pi = 7
    assert c.allocate(a, 7, 8)                 # slot 7 completes block 1 -> hashed
    assert a.kv_len == 8
    h1 = hash_block(c.block_hash[0], a.tokens[4:8])   # 2 prompt + 2 output tokens
    assert c.block_hash[1] == h1 == H(a.tokens, 1)
    assert c.hash_to_block[h1] == 1
    a.pi = 8
    assert c.allocate(a, 8, 9)                 # slot 8: fresh block, NOT hashed
    assert a.kv_blocks == [0, 1, 2] and c.block_hash[2] == b""
    assert c.cache_misses == 3
    for p in (9, 10):
        a.pi = p
        assert c.allocate(a, p, p + 1)
        assert c.block_hash[2] == b""
    a.pi = 11
    assert c.allocate(a, 11, 12)               # completes the decode block -> hashed
    assert c.block_hash[2] == hash_block(h1, a.tokens[8:12]) == H(a.tokens, 2)
    assert a.kv_len == 12 and c.used == 3 and c.cache_misses == 3
    c.check_invariants()




def test_block_filled_by_a_slot_hashes_a_strided_token_array_like_a_list():
    """A request whose token IDs are a non-contiguous array (no outputs: no copy is made)
    hashes the block a slot fills exactly as the same IDs given as a list. Its blocks start
    at position 4 (first allocation from 4, nothing cached), so they are not prompt blocks."""
    ids = np.arange(100, 124, dtype=np.int32)[::2]       # 12 IDs, a strided view
    hashes = []
    for r in (Request("s", 0, ids, []), Request("l", 0, list(ids), [])):
        c = KVCache(4, BS)
        assert c.allocate(r, 4, 11)                      # positions 4..10: blocks 0, 1
        assert c.append_token(r, 11, 7)                  # position 11 fills block 1
        hashes.append([c.block_hash[b] for b in r.kv_blocks])
    seq = np.array(ids[4:])
    assert hashes[0] == hashes[1] == [H(seq, 0), H(seq, 1)]


def test_append_token_does_not_update_kv_len():
    c = KVCache(4, BS)
    a = req("a", toks(100, 4), toks(900, 5), pi=0)
    assert c.allocate(a, 0, 4)
    a.pi = 4
    assert c.append_token(a, 4, 4)             # block full: a fresh one
    assert a.kv_len == 4 and a.kv_blocks == [0, 1]
    assert c.append_token(a, 5, 5)             # room in block 1: nothing to take
    assert a.kv_len == 4 and a.kv_blocks == [0, 1] and c.used == 2
    # caller-supplied kv_len decides: with kv_len 7 the slot 7 completes block 1
    assert c.append_token(a, 7, 7)
    assert c.block_hash[1] == H(a.tokens, 1)


def test_decode_with_block_size_one_never_hashes():
    c = KVCache(10, 1)
    a = req("a", [5, 6], [7, 8, 9])
    assert c.allocate(a, 0, 2)
    assert c.block_hash[0] and c.block_hash[1]
    for p in (2, 3, 4):
        a.pi = p
        assert c.allocate(a, p, p + 1)
    assert a.kv_blocks == [0, 1, 2, 3, 4]
    assert c.block_hash[2:5] == [b"", b"", b""]


def test_decode_allocation_failure_changes_nothing():
    c = KVCache(1, BS)
    a = req("a", toks(100, 4), toks(900, 3))
    assert c.allocate(a, 0, 4)
    a.pi = 4
    before = snapshot(c, a)
    assert not c.allocate(a, 4, 5)
    assert snapshot(c, a) == before
    assert not c.append_token(a, 4, 4)
    assert snapshot(c, a) == before


def test_append_tokens_takes_a_steps_slots_in_order_like_append_token():
    """One call for the slots of a step: the same blocks, hashes and counts as one
    :meth:`append_token` per slot, in the order given. Three requests of 4 prompt tokens
    each hold blocks 0, 1, 2 (a fresh cache of 5 blocks, bs 4). The slot of ``a`` (position
    4, kv_len 4) opens block 3; ``b``'s (kv_len 3: one free slot in block 1) fills block 1
    and hashes it; ``c``'s opens block 4; a second slot for ``a`` finds no free block: the
    call returns ``a`` (nothing after it is tried) with everything else done."""
    def setup():
        c = KVCache(5, BS)
        rs = [req("a", toks(100, 4), toks(900, 3)), req("b", toks(200, 3), toks(800, 3)),
              req("c", toks(300, 4), toks(700, 3))]
        for r in rs:
            assert c.allocate(r, 0, r.input_len)
        return c, rs
    c1, (a, b, c) = setup()
    slots = [(a, 4, 4), (b, 3, 3), (c, 4, 4)]
    assert c1.append_tokens(slots) is None
    c2, (a2, b2, c2r) = setup()
    for r, pos, kv_len in [(a2, 4, 4), (b2, 3, 3), (c2r, 4, 4)]:
        assert c2.append_token(r, pos, kv_len)
    assert snapshot(c1, a, b, c) == snapshot(c2, a2, b2, c2r)
    assert a.kv_blocks == [0, 3] and b.kv_blocks == [1] and c.kv_blocks == [2, 4]
    assert c1.block_hash[1] == H(b.tokens, 0) and c1.hash_to_block[H(b.tokens, 0)] == 1
    assert c1.used == 5 and c1.cache_misses == 5
    before = snapshot(c1, a, b, c)
    assert c1.append_tokens([(a, 8, 8), (c, 8, 8)]) is a      # no block left for a
    assert snapshot(c1, a, b, c) == before


class _SpyAppend(KVCache, name="spy-append"):
    """Records every append_token call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def append_token(self, req, pos, kv_len):
        self.seen.append((req.id, pos, kv_len))
        return super().append_token(req, pos, kv_len)


def test_append_tokens_calls_an_overridden_append_token_for_every_slot():
    """A subclass that overrides append_token sees each slot of a bulk call, in order."""
    c = _SpyAppend(4, BS)
    seen = c.seen
    a, b = req("a", toks(100, 4), toks(900, 2)), req("b", toks(200, 4), toks(800, 2))
    for r in (a, b):
        assert c.allocate(r, 0, 4)
    assert c.append_tokens([(b, 4, 4), (a, 4, 4)]) is None
    assert seen == [("b", 4, 4), ("a", 4, 4)] and b.kv_blocks == [1, 2] and a.kv_blocks == [0, 3]
    assert c.append_tokens([(a, 8, 8), (b, 8, 8)]) is a and seen[-1] == ("a", 8, 8)
    assert len(seen) == 3


# ---------------------------------------------------------------------------- zero new tokens
def test_zero_new_tokens_commits_nothing_quirk():
    """BLIS quirk: a fully cached prompt that is a multiple of bs allocates 0 new
    tokens; the fill loop never runs so the cached blocks are NOT committed."""
    c = KVCache(6, BS)
    a = req("a", toks(100, 8), [1])
    assert c.allocate(a, 0, 8)
    c.release(a)
    free_before = list(c.free)
    assert free_before == [2, 3, 4, 5, 1, 0]
    b = req("b", toks(100, 8), toks(900, 5))
    ok, cached = admit(c, b)
    assert ok and cached == [0, 1]
    assert b.kv_blocks == [] and b.kv_len == 0
    assert c.used == 0 and c.ref == [0] * 6 and c.cache_hits == 0
    assert list(c.free) == free_before
    # decode then starts a fresh block at the request's current position
    b.pi = 8
    assert c.allocate(b, 8, 9)
    assert b.kv_blocks == [2] and b.kv_base == 8 and b.kv_len == 1
    assert c.block_hash[2] == b""
    assert c.hash_to_block[H(a.tokens, 0)] == 0         # a's blocks are still indexed
    for p in (9, 10, 11):
        b.pi = p
        assert c.allocate(b, p, p + 1)
    # the full decode block is hashed from its own tokens, chained from "" (first block
    # the request holds)
    assert c.block_hash[2] == hash_block(b"", b.tokens[8:12])
    c.check_invariants()


def test_zero_count_allocation_is_a_no_op_even_without_cache():
    c = KVCache(2, BS)
    a = req("a", toks(100, 4), [1])
    before = snapshot(c, a)
    assert c.allocate(a, 0, 0)
    assert snapshot(c, a) == before


# ---------------------------------------------------------------------------- all or nothing
def test_precheck_failure_leaves_everything_unchanged():
    c = KVCache(4, BS)
    x = req("x", toks(100, 12), [1])
    assert c.allocate(x, 0, 12)               # 3 of 4 blocks
    y = req("y", toks(200, 8), [1])
    before = snapshot(c, x, y)
    assert not c.allocate(y, 0, 8)            # needs 2, 1 free
    assert snapshot(c, x, y) == before


def test_precheck_failure_with_partial_block_leaves_request_unchanged():
    c = KVCache(3, BS)
    y = req("y", toks(200, 16), [1])
    assert c.allocate(y, 0, 2)                # block 0, kv_len 2 (room 2)
    y.pi = 2
    x = req("x", toks(100, 4), [1])
    assert c.allocate(x, 0, 4)                # block 1; 1 block left
    before = snapshot(c, x, y)
    # [2, 12): 10 tokens, 2 fit in the partial block, 8 need 2 fresh blocks > 1 free
    assert not c.allocate(y, 2, 12)
    assert snapshot(c, x, y) == before
    # [2, 9): 7 tokens, 2 + 5 -> 2 fresh blocks still too many
    assert not c.allocate(y, 2, 9)
    assert snapshot(c, x, y) == before
    # [2, 8): 6 tokens, 2 + 4 -> 1 fresh block: fits only because the partial block's room
    # is subtracted in the pre-check (ceil(6/4) = 2 would exceed the 1 free block)
    assert c.allocate(y, 2, 8)
    assert y.kv_blocks == [0, 2] and y.kv_len == 8
    assert c.block_hash[0] == H(y.tokens, 0) and c.block_hash[2] == H(y.tokens, 1)
    assert not c.free


def _released_prefix_cache():
    """6 blocks; a (10 tokens) allocated then released: free = [3, 4, 5, 2, 1, 0],
    blocks 0 and 1 hold a's two full-block hashes."""
    c = KVCache(6, BS)
    a = req("a", toks(100, 10), [1])
    assert c.allocate(a, 0, 10)
    c.release(a)
    assert list(c.free) == [3, 4, 5, 2, 1, 0]
    return c, a


def test_midway_failure_after_committing_free_cached_blocks_rolls_back_exactly():
    c, a = _released_prefix_cache()
    # b: a's 8-token prefix + 17 new tokens. Pre-check: ceil(17/4) = 5 <= 6 free -> passes;
    # committing the 2 cached blocks takes them off the free list -> 4 free < 5: rollback.
    b = req("b", toks(100, 8) + toks(500, 17), [1])
    cached = c.get_cached_blocks(b)
    assert cached == [0, 1]
    before = snapshot(c, a, b)
    assert not c.allocate(b, 8, 25, cached)
    assert snapshot(c, a, b) == before
    c.check_invariants()
    # one token fewer fits (16 -> 4 fresh blocks): the same cache state serves it
    b2 = req("b2", toks(100, 8) + toks(500, 16), [1])
    assert admit(c, b2)[0]
    assert b2.kv_blocks == [0, 1, 3, 4, 5, 2] and c.used == 6
    assert (c.cache_hits, c.cache_misses) == (2, 3 + 4)


def test_midway_failure_with_cached_block_in_use_elsewhere_rolls_back_exactly():
    c = KVCache(6, BS)
    a = req("a", toks(100, 8), [1])
    assert c.allocate(a, 0, 8)                           # blocks 0, 1
    p = req("p", toks(100, 4) + toks(300, 4), [1])
    assert admit(c, p)[0]                                # shares block 0, fresh block 2
    assert p.kv_blocks == [0, 2]
    c.release(a)                                         # block 1 -> free; block 0 still p's
    assert list(c.free) == [3, 4, 5, 1] and c.ref[0] == 1
    # q: a's 8 tokens + 13: pre-check ceil(13/4) = 4 <= 4 free; committing block 1 leaves 3
    q = req("q", toks(100, 8) + toks(600, 13), [1])
    cached = c.get_cached_blocks(q)
    assert cached == [0, 1]
    before = snapshot(c, p, q)
    assert not c.allocate(q, 8, 21, cached)
    assert snapshot(c, p, q) == before
    assert c.ref[0] == 1 and c.used == 2
    c.check_invariants()


def test_midway_failure_returns_cached_blocks_to_free_list_tail():
    """BLIS's rollback: committed cached blocks that were free "go back to the free-list
    tail". When they were not already at the tail this changes the LRU order (BLIS does the
    same); everything else is restored exactly."""
    c = KVCache(8, BS)
    a = req("a", toks(100, 8), [1])                      # blocks 0, 1
    z = req("z", toks(700, 4), [1])                      # block 2
    assert c.allocate(a, 0, 8) and c.allocate(z, 0, 4)
    c.release(a)
    c.release(z)
    assert list(c.free) == [3, 4, 5, 6, 7, 1, 0, 2]
    b = req("b", toks(100, 8) + toks(500, 25), [1])      # 7 fresh needed; 8 free, 6 after commit
    cached = c.get_cached_blocks(b)
    assert cached == [0, 1]
    before = snapshot(c, a, z, b)
    assert not c.allocate(b, 8, 33, cached)
    after = snapshot(c, a, z, b)
    assert list(c.free) == [3, 4, 5, 6, 7, 2, 1, 0]      # 1, 0 re-appended (reverse commit order)
    for k in before:
        if k != "free":
            assert after[k] == before[k], k
    c.check_invariants()


# ---------------------------------------------------------------------------- property test
@st.composite
def workloads(draw):
    bs = draw(st.sampled_from([1, 2, 4]))
    total = draw(st.integers(1, 24))
    prefixes = [draw(st.lists(st.integers(0, 3), min_size=0, max_size=12)) for _ in range(3)]
    reqs = []
    for i in range(draw(st.integers(1, 6))):
        pre = prefixes[draw(st.integers(0, 2))]
        suffix = draw(st.lists(st.integers(0, 3), max_size=10))
        prompt = pre + suffix
        if not prompt:
            prompt = [0]
        out = draw(st.lists(st.integers(0, 3), max_size=8))
        reqs.append(req(f"r{i}", prompt, out))
    ops = draw(st.lists(st.tuples(st.sampled_from(["step", "step", "step", "release"]),
                                  st.integers(0, len(reqs) - 1), st.integers(1, 12)),
                        max_size=60))
    return bs, total, reqs, ops


def _check_deep(c, reqs):
    c.check_invariants()
    bs = c.block_size
    expected_ref = [0] * c.total_blocks
    for r in reqs:
        assert len(set(r.kv_blocks)) == len(r.kv_blocks)
        for b in r.kv_blocks:
            expected_ref[b] += 1
        if r.kv_blocks:
            # every block but the last is full, the last holds at least one slot
            assert (len(r.kv_blocks) - 1) * bs < r.kv_len <= len(r.kv_blocks) * bs
        else:
            assert r.kv_len == 0
        seq = r.tokens[r.kv_base:]
        for j, b in enumerate(r.kv_blocks[: r.kv_len // bs]):
            h = c.block_hash[b]
            if h:
                assert h == hash_chain(seq[: (j + 1) * bs], bs)[j], (r.id, j)
            elif r.kv_base == 0 and (j + 1) * bs <= r.input_len:
                raise AssertionError(f"{r.id}: full prompt block {j} not hashed")
        for j in range(r.kv_len // bs, len(r.kv_blocks)):
            assert c.block_hash[r.kv_blocks[j]] == b""     # a partial block has no hash
    assert c.ref == expected_ref
    assert c.used == sum(1 for x in expected_ref if x)
    for h, b in c.hash_to_block.items():
        assert c.block_hash[b] == h


def _without(blocks, xs):
    return [b for b in blocks if b not in xs]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_interleavings_keep_inv4_and_never_leak(w):
    bs, total, reqs, ops = w
    c = KVCache(total, bs)
    n_alloc_calls = 0
    for op, i, n in ops:
        r = reqs[i]
        if op == "release":
            c.release(r)
            r.pi = 0
        elif r.pi < r.input_len:
            if r.kv_blocks or r.pi > 0:                  # continuing prefill: next chunk
                start, cached = r.pi, []
            else:                                         # admission: cached prefix first
                cached = c.get_cached_blocks(r)
                start = len(cached) * bs
            end = min(start + n, r.input_len)
            before = snapshot(c, *reqs)
            n_alloc_calls += 1
            if c.allocate(r, start, end, cached):
                r.pi = end
            else:
                after = snapshot(c, *reqs)
                # exact restoration, except that the cached blocks that were free went back
                # to the free-list tail (as in BLIS); the rest of the LRU order is kept
                for k in before:
                    if k != "free":
                        assert after[k] == before[k], k
                assert _without(after["free"], cached) == _without(before["free"], cached)
                assert sorted(after["free"]) == sorted(before["free"])
        elif r.pi < len(r.tokens):                       # decode one token
            before = snapshot(c, *reqs)
            if c.allocate(r, r.pi, r.pi + 1):
                r.pi += 1
            else:
                assert snapshot(c, *reqs) == before
        _check_deep(c, reqs)
        total_hits_misses = c.cache_hits + c.cache_misses
        assert total_hits_misses >= 0 and 0.0 <= c.cache_hit_rate() <= 1.0
    for r in reqs:
        c.release(r)
    c.check_invariants()
    assert c.used == 0 and c.ref == [0] * total and len(c.free) == total
    assert sorted(c.free) == list(range(total))
    for h, b in c.hash_to_block.items():
        assert c.block_hash[b] == h


def test_block_pool_is_built_lazily():
    """A huge pool costs nothing until used: fresh blocks are taken in ID order, released
    ones go to the LRU tail behind every fresh block, as on the eager free list 0..N-1."""
    c = KVCache(100_000_000, 4)
    assert len(c.free) == 100_000_000 and 99_999_999 in c.free and c._ref == []
    a, b = req("a", toks(0, 8)), req("b", toks(100, 4))
    assert c.allocate(a, 0, 8) and c.allocate(b, 0, 4)
    assert a.kv_blocks == [0, 1] and b.kv_blocks == [2] and len(c._ref) == 3
    c.release(a)
    assert 1 in c.free and 2 not in c.free and len(c.free) == 100_000_000 - 1
    it = iter(c.free)
    assert [next(it) for _ in range(2)] == [3, 4]          # fresh blocks stay at the head
    assert list(c._lru) == [1, 0]                           # released: tail, last block first
    c.check_invariants()
    small = KVCache(4, 4)
    for i in range(3):
        assert small.allocate(req(f"r{i}", toks(10 * i, 4)), 0, 4)
    assert list(small.free) == [3] and small.ref == [1, 1, 1, 0]
    assert not small.allocate(req("d", toks(50, 8)), 0, 8)  # needs 2, one free: refused
    assert small.allocate(req("e", toks(60, 4)), 0, 4) and not small.free
    small.check_invariants()
