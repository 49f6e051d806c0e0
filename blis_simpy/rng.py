"""Partitioned random number generation (docs/determinism.md, "Random streams").

One master seed (``--seed``, default 42) is split into independent streams by subsystem
name: the derived seed is the master seed itself for ``"workload"`` and
``seed XOR fnv1a64(name)`` otherwise, reinterpreted as a signed 64-bit integer. Each stream
is a :class:`numpy.random.Generator`, created lazily and cached, and must be used by exactly
one consumer. The global NumPy / ``random`` generators are never used.

Bit-parity with Go's ``math/rand`` is not a goal: only the stream structure and the draw order
of the workload generator (docs/workloads.md, "The workload-spec v2") are kept. A Go
``Int63()`` child-seed draw is
:func:`child_seed`; a Go ``Intn(n)`` is ``gen.integers(0, n)``; ``Float64`` is
``gen.random()``; ``ExpFloat64`` is ``gen.standard_exponential()``; ``NormFloat64`` is
``gen.standard_normal()``.
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3

def to_signed64(x: int) -> int:
    """Wrap an arbitrary Python int to a signed 64-bit integer (two's complement)."""
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


def fnv1a64(name: str) -> int:
    """FNV-1a 64-bit hash of the UTF-8 bytes of ``name``, as a signed int64."""
    h = _FNV_OFFSET
    for b in name.encode("utf-8"):
        h ^= b
        h = (h * _FNV_PRIME) & _MASK64
    return to_signed64(h)


def derive_seed(seed: int, name: str) -> int:
    """The seed of stream ``name``: ``seed`` for ``"workload"``, else ``seed ^ fnv1a64(name)``.

    ``seed`` is first wrapped to int64; the result is a signed int64.
    """
    seed = to_signed64(seed)
    if name == "workload":
        return seed
    return to_signed64(seed ^ fnv1a64(name))


def numpy_rng(seed: int) -> np.random.Generator:
    """A fresh NumPy Generator for a signed or unsigned 64-bit seed (mapped to unsigned)."""
    return np.random.default_rng(int(seed) & _MASK64)


def child_seed(gen: np.random.Generator) -> int:
    """Go's ``rng.Int63()``: a non-negative int64 in ``[0, 2^63)``, used to seed child RNGs."""
    return int(gen.integers(0, 1 << 63))


class RngStreams:
    """The partitioned RNG of one run: one cached Generator per subsystem name.

    >>> streams = RngStreams(42)
    >>> g = streams.get("router")          # seeded from derive_seed(42, "router")
    >>> g is streams.get("router")
    True
    """

    def __init__(self, seed: int):
        self.seed = to_signed64(seed)
        self._streams: dict[str, np.random.Generator] = {}

    def seed_for(self, name: str) -> int:
        """The derived (signed int64) seed of stream ``name``."""
        return derive_seed(self.seed, name)

    def get(self, name: str) -> np.random.Generator:
        """The Generator of stream ``name``, created on first use and cached."""
        gen = self._streams.get(name)
        if gen is None:
            gen = numpy_rng(self.seed_for(name))
            self._streams[name] = gen
        return gen

    def __contains__(self, name: object) -> bool:
        return name in self._streams

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"RngStreams(seed={self.seed}, streams={sorted(self._streams)})"
