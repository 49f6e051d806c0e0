"""Trace replay token synthesis and default horizon (docs/workloads.md, "TraceV2")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_simpy.request import Request, SharedPrefix, hash_chain
from blis_simpy.units import MAX_INT64
from blis_simpy.workload.replay import (
    DRAW_BLOCK,
    default_replay_horizon,
    replay_prefixes,
    trace_requests,
)
from blis_simpy.workload.tracev2 import TraceRecord
from blis_simpy.workload.tracev2_read import read_trace_records


def rec(i, arrival, n_in, n_out, group="", plen=0, **kw):
    return TraceRecord(request_id=i, arrival_time_us=arrival, input_tokens=n_in,
                       output_tokens=n_out, prefix_group=group, prefix_length=plen, **kw)


def test_prefix_shared_within_group_and_lengths():
    records = [rec(0, 0, 5, 3, "a", 16), rec(1, 10, 7, 0, "b", 8), rec(2, 20, 0, 4, "a", 16),
               rec(3, 30, 9, 2)]
    reqs = {r.id: r for r in trace_requests(records, 42)}
    r0, r1, r2, r3 = (reqs[f"request_{i}"] for i in range(4))
    assert (r0.input_len, r0.output_len, r0.max_output_len) == (21, 3, 3)
    assert (r1.input_len, r1.output_len) == (15, 0)
    assert (r2.input_len, r2.output_len) == (16, 4)
    assert (r3.input_len, r3.output_len) == (9, 2)
    assert np.array_equal(r0.input_tokens[:16], r2.input_tokens)      # same group prefix
    assert not np.array_equal(r0.input_tokens[:8], r1.input_tokens[:8])
    assert r0.prefix_length == 16 and r3.prefix_length == 0
    for r in (r0, r1, r2, r3):
        toks = r.tokens
        assert toks.dtype == np.int32 and toks.min(initial=0) >= 0 and toks.max(initial=0) < 128000



@pytest.mark.parametrize("bs", [1, 4, 5, 16])
def test_group_prefix_hashes_are_those_of_each_prompt_alone(bs):
    """Replayed group members share one memoised hash chain for their prefix; each
    request's prompt hashes equal those of hashing its own tokens from scratch, also when
    the prefix does not end on a block boundary or the prompt is the prefix alone."""
    records = [rec(0, 0, 9, 1, "a", 18), rec(1, 5, 0, 1, "a", 18), rec(2, 7, 30, 1, "a", 18),
               rec(3, 9, 3, 1)]
    reqs = trace_requests(records, 3)
    for r in reqs:
        n = r.input_len // bs
        alone = hash_chain(np.array(r.input_tokens[: n * bs]), bs)
        assert len(alone) == n and r.prompt_block_hashes(bs) == alone
    assert reqs[0].prompt_block_hashes(bs)[: 18 // bs] == reqs[2].prompt_block_hashes(bs)[: 18 // bs]


def test_shared_prefix_hint_ignored_unless_the_prompt_starts_with_it():
    p = SharedPrefix([1, 2, 3, 4])
    good = Request("g", 0, [1, 2, 3, 4, 9], [], shared_prefix=p)
    bad = Request("b", 0, [1, 2, 3, 5, 9], [], shared_prefix=p)
    short = Request("s", 0, [1, 2], [], shared_prefix=p)
    for r in (good, bad, short):
        n = r.input_len // 2
        assert r.prompt_block_hashes(2) == hash_chain(np.array(r.input_tokens[: 2 * n]), 2)
    assert p.chain(2) == good.prompt_block_hashes(2)[:2]
    assert bad.prompt_block_hashes(2)[1] != p.chain(2)[1]


def test_group_prefix_fixed_by_first_positive_length_and_applied_to_all_rows():
    records = [rec(0, 0, 4, 1, "g", 0), rec(1, 5, 4, 1, "g", 12), rec(2, 6, 4, 1, "g", 30)]
    reqs = trace_requests(records, 1)
    assert [r.input_len for r in reqs] == [16, 16, 16]
    assert np.array_equal(reqs[0].input_tokens[:12], reqs[2].input_tokens[:12])
    assert [r.prefix_length for r in reqs] == [0, 12, 30]              # metadata from the row


def test_prefixes_drawn_first_in_record_order():
    records = [rec(0, 0, 3, 3, "x", 10), rec(1, 0, 3, 3, "y", 5)]
    rng = np.random.default_rng(7)
    pre = replay_prefixes(records, rng)
    expected_x = np.random.default_rng(7).integers(0, 128000, size=10, dtype=np.int32)
    assert list(pre) == ["x", "y"]
    assert np.array_equal(pre["x"], expected_x)
    reqs = trace_requests(records, 7)
    assert np.array_equal(reqs[0].input_tokens[:10], expected_x)


def test_metadata_copied_from_row():
    r = rec(17, 500, 2, 2, "g", 4, client_id="c", tenant_id="t", slo_class="batch",
            session_id="s", round_index=3, streaming=True, model="m", reason_ratio=0.25,
            text_tokens=1, image_tokens=2, audio_tokens=3, video_tokens=4, deadline_us=900)
    (q,) = trace_requests([r], 0)
    assert (q.id, q.arrival_us, q.deadline_us, q.client_id, q.tenant_id, q.slo_class,
            q.session_id, q.round_index, q.prefix_group, q.prefix_length, q.streaming, q.model,
            q.reason_ratio, q.text_tokens, q.image_tokens, q.audio_tokens, q.video_tokens) == (
        "request_17", 500, 900, "c", "t", "batch", "s", 3, "g", 4, True, "m", 0.25, 1, 2, 3, 4)


def test_stable_sort_by_arrival():
    records = [rec(0, 30, 1, 1), rec(1, 10, 1, 1), rec(2, 30, 1, 1), rec(3, 10, 1, 1), rec(4, 0, 1, 1)]
    assert [r.id for r in trace_requests(records, 3)] == [
        "request_4", "request_1", "request_3", "request_0", "request_2"]


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 10**6)),
                      min_size=1, max_size=DRAW_BLOCK + 40),
       seed=st.integers(-(2**63), 2**63 - 1))
def test_deterministic_for_a_seed_and_lengths_exact(sizes, seed):
    records = [rec(i, t, a, b, "g" if i % 3 == 0 else "", 6 if i % 3 == 0 else 0)
               for i, (a, b, t) in enumerate(sizes)]
    one, two = trace_requests(records, seed), trace_requests(records, seed)
    assert [r.id for r in one] == [r.id for r in two]
    assert all(np.array_equal(x.tokens, y.tokens) for x, y in zip(one, two, strict=True))
    by_id = {r.id: r for r in one}
    for i, (a, b, _) in enumerate(sizes):
        q = by_id[f"request_{i}"]
        assert (q.input_len, q.output_len, q.max_output_len) == (a + (6 if i % 3 == 0 else 0), b, b)
    assert [r.arrival_us for r in one] == sorted(t for _, _, t in sizes)


def test_different_seeds_differ():
    records = [rec(0, 0, 50, 50)]
    a, b = trace_requests(records, 1)[0].tokens, trace_requests(records, 2)[0].tokens
    assert not np.array_equal(a, b)


def test_default_horizon():
    assert default_replay_horizon([]) == MAX_INT64
    assert default_replay_horizon([rec(0, 0, 1, 1), rec(1, 0, 1, 1)]) == 600_000_000
    assert default_replay_horizon([rec(0, 7, 1, 1), rec(1, 1234, 1, 1)]) == 2468
    assert default_replay_horizon([rec(0, 2**62 + 5, 1, 1)]) == MAX_INT64


def test_replay_of_conformance_trace(conformance_dir):
    records = read_trace_records(conformance_dir / "A08_prefix_cache" / "trace.csv")
    reqs = trace_requests(records, 42)
    assert len(reqs) == len(records)
    by_id = {r.id: r for r in reqs}
    groups: dict[str, np.ndarray] = {}
    for row in records:
        q = by_id[f"request_{row.request_id}"]
        assert q.input_len == row.prefix_length + row.input_tokens
        assert q.output_len == row.output_tokens
        pre = q.input_tokens[:row.prefix_length]
        assert np.array_equal(groups.setdefault(row.prefix_group, pre), pre)
    assert len(groups) > 1
    assert default_replay_horizon(records) == 2 * max(r.arrival_time_us for r in records)


@pytest.mark.parametrize("n", [DRAW_BLOCK - 1, DRAW_BLOCK, DRAW_BLOCK + 1])
def test_block_boundaries_keep_every_record(n):
    records = [rec(i, i, i % 5, (i + 1) % 3) for i in range(n)]
    reqs = trace_requests(records, 11)
    assert [(r.input_len, r.output_len) for r in reqs] == [(i % 5, (i + 1) % 3) for i in range(n)]
    # no two requests share the same token block (the IDs are consumed, not reused)
    flat = [tuple(r.tokens.tolist()) for r in reqs if r.input_len + r.output_len >= 4]
    assert len(set(flat)) == len(flat)


@pytest.mark.parametrize("inp, out", [([1, -2], [3]), ([1, 2], [3, -1]), ([-1], [])])
def test_request_refuses_negative_token_ids(inp, out):
    with pytest.raises(ValueError, match="request r: token IDs must be non-negative"):
        Request("r", 0, inp, out)
