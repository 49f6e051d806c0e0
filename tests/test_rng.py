"""Partitioned RNG (docs/determinism.md, "Random streams")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blis_simpy.rng import (
    RngStreams,
    child_seed,
    derive_seed,
    fnv1a64,
    numpy_rng,
    to_signed64,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _fnv_reference(data: bytes) -> int:
    """Independent FNV-1a 64 (numpy uint64 arithmetic wraps mod 2^64)."""
    h = np.uint64(14695981039346656037)
    with np.errstate(over="ignore"):
        for b in data:
            h = np.uint64(h ^ np.uint64(b)) * np.uint64(1099511628211)
    return int(h.astype(np.int64))


@pytest.mark.parametrize("text, unsigned", [
    ("", 0xCBF29CE484222325),          # published FNV-1a 64 test vectors
    ("a", 0xAF63DC4C8601EC8C),
    ("foobar", 0x85944171F73967E8),
])
def test_fnv1a64_published_vectors(text, unsigned):
    expected = unsigned - 2**64 if unsigned >= 2**63 else unsigned
    assert fnv1a64(text) == expected


@pytest.mark.parametrize("name", ["router", "prefill-router", "decode-router", "workload-gen",
                                  "node-provisioning", "instance-loading", "ünïcode"])
def test_fnv1a64_matches_reference_and_xor_derivation(name):
    h = _fnv_reference(name.encode("utf-8"))
    assert fnv1a64(name) == h
    assert -(2**63) <= h < 2**63
    # seed XOR hash, as signed int64
    assert derive_seed(42, name) == to_signed64(42 ^ (h & (2**64 - 1)))


def test_router_seed_value():
    h = fnv1a64("router")
    assert h == _fnv_reference(b"router")
    assert derive_seed(42, "router") == h ^ 42          # XOR of two's-complement ints
    assert derive_seed(0, "router") == h


@given(INT64)
def test_workload_stream_uses_master_seed(seed):
    assert derive_seed(seed, "workload") == seed


@given(INT64, st.text(max_size=20))
def test_derived_seed_is_int64_and_involutive(seed, name):
    d = derive_seed(seed, name)
    assert -(2**63) <= d < 2**63
    if name != "workload":
        assert derive_seed(d, name) == seed


def test_streams_cached_independent_and_reproducible():
    a, b = RngStreams(42), RngStreams(42)
    ga = a.get("router")
    assert a.get("router") is ga
    assert "router" in a and "decode-router" not in a
    x = ga.integers(0, 2**62, size=8)
    assert np.array_equal(x, b.get("router").integers(0, 2**62, size=8))
    y = a.get("decode-router").integers(0, 2**62, size=8)
    assert not np.array_equal(x, y)
    assert a.seed_for("workload-gen") == derive_seed(42, "workload-gen")
    # the Generator is exactly numpy_rng(derived seed)
    assert np.array_equal(RngStreams(7).get("router").random(4),
                          numpy_rng(derive_seed(7, "router")).random(4))


def test_negative_seed_maps_to_unsigned():
    assert np.array_equal(numpy_rng(-1).random(3), np.random.default_rng(2**64 - 1).random(3))


def test_child_seed_range_and_determinism():
    g1, g2 = numpy_rng(5), numpy_rng(5)
    seeds = [child_seed(g1) for _ in range(200)]
    assert seeds == [child_seed(g2) for _ in range(200)]
    assert all(0 <= s < 2**63 for s in seeds)
    assert len(set(seeds)) == 200


def test_global_rng_untouched():
    before = np.random.get_state()[1].copy()
    RngStreams(1).get("router").random(10)
    child_seed(numpy_rng(3))
    assert np.array_equal(before, np.random.get_state()[1])
