"""Paged KV cache: blocks, prefix caching by chained block hashes, LRU free list (docs/kv-cache.md).

Pure code: knows nothing of SimPy, testable and reusable alone.
"""

from blis_simpy.kv.cache import KVCache

__all__ = ["KVCache"]
