"""Trace replay: TraceV2 rows → simulator requests (docs/workloads.md, "TraceV2").

A trace holds token *counts*, not token IDs, so replay synthesises IDs. The RNG is a NumPy
Generator seeded directly from ``--seed`` (not a partitioned stream, docs/determinism.md) via
:func:`blis_simpy.rng.numpy_rng`. Draw order:

1. for each prefix group, in order of first appearance among the records with a non-empty
   ``prefix_group`` and a positive ``prefix_length``, draw that many prefix token IDs
   (the first such record fixes the group's length);
2. per record, in record order: ``input_tokens`` suffix IDs then ``output_tokens`` output
   IDs. For speed the IDs of :data:`DRAW_BLOCK` consecutive records come from one
   vectorised draw, consumed in exactly that order (the values depend on the seed only).

Every request whose group has a prefix gets it prepended (as a
:class:`~blis_simpy.request.SharedPrefix`, so the prefix's block hashes are computed once per
group, not once per request). IDs are uniform in [0, 128000).
Requests are named ``request_<request_id>`` and returned stably sorted by arrival (µs).

A record that carries real prompt IDs (the ``input_token_ids`` column, docs/workloads.md)
replays with exactly those IDs as its whole prompt (prefix included), so prompts that share
real tokens share them in the replay. The draws above are made all the same — such a record
simply does not use its group prefix or its suffix draw — so the random IDs of every other
record (and every output) do not depend on which rows carry IDs: a trace without IDs
replays bit-identically to BLIS's order, and giving some rows their IDs changes nothing
for the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

import numpy as np

from blis_simpy.request import Request, SharedPrefix
from blis_simpy.rng import numpy_rng
from blis_simpy.units import MAX_INT64
from blis_simpy.workload.tracev2 import TraceRecord

VOCAB_SIZE = 128_000
ALL_AT_ZERO_HORIZON_US = 600_000_000
DRAW_BLOCK = 256  # records per vectorised token draw (changing it changes the token IDs)


def replay_prefixes(records: Sequence[TraceRecord], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Step 1: the prefix token IDs of every group with a positive ``prefix_length``."""
    prefixes: dict[str, np.ndarray] = {}
    for r in records:
        if r.prefix_group and r.prefix_length > 0 and r.prefix_group not in prefixes:
            prefixes[r.prefix_group] = rng.integers(0, VOCAB_SIZE, size=r.prefix_length,
                                                    dtype=np.int32)
    return prefixes


def trace_requests(records: Sequence[TraceRecord], seed: int) -> list[Request]:
    """Synthesize one :class:`Request` per trace row (see the module docstring).

    ``seed`` is the replay seed (``--seed``, int64). Arrival and deadline are the row's
    ``arrival_time_us`` / ``deadline_us`` (µs; deadline 0 = none); ``max_output_len`` is
    the row's ``output_tokens``; metadata (client, tenant, SLO class, session, round,
    prefix group/length, streaming, model, reason ratio, modality token counts) is copied.
    """
    rng = numpy_rng(seed)
    prefixes = replay_prefixes(records, rng)
    reqs = list(iter_trace_requests(records, rng, prefixes))
    reqs.sort(key=lambda q: q.arrival_us)  # stable: ties keep record order
    return reqs


def iter_trace_requests(records: Iterable[TraceRecord], rng: np.random.Generator,
                        prefixes: dict[str, np.ndarray]) -> Iterator[Request]:
    """Step 2: the requests of ``records`` in record order, drawn block by block from
    ``rng`` (after step 1 drew ``prefixes``); only one block of records is held."""
    integers = rng.integers
    concat = np.concatenate
    shared: dict[str, SharedPrefix] = {}    # group -> its prefix, block hashes memoised
    it = iter(records)
    while True:
        block = list(islice(it, DRAW_BLOCK))
        if not block:
            return
        ids = integers(0, VOCAB_SIZE, size=sum(r.input_tokens + r.output_tokens for r in block),
                       dtype=np.int32)
        pos = 0
        for r in block:
            mid = pos + r.input_tokens
            end = mid + r.output_tokens
            sp = None
            if r.input_token_ids is not None:       # real prompt: the draws go unused
                inp = r.input_token_ids
            else:
                prefix = prefixes.get(r.prefix_group) if r.prefix_group else None
                if prefix is None:
                    inp = ids[pos:mid]
                else:
                    inp = concat((prefix, ids[pos:mid]))
                    sp = shared.get(r.prefix_group)
                    if sp is None:
                        sp = shared[r.prefix_group] = SharedPrefix(prefix)
            pos = end
            yield Request(
                f"request_{r.request_id}", r.arrival_time_us, inp, ids[mid:end],
                max_output_len=r.output_tokens, deadline_us=r.deadline_us,
                tenant_id=r.tenant_id, slo_class=r.slo_class, session_id=r.session_id,
                round_index=r.round_index, client_id=r.client_id, prefix_group=r.prefix_group,
                prefix_length=r.prefix_length, streaming=r.streaming, model=r.model,
                reason_ratio=r.reason_ratio, text_tokens=r.text_tokens,
                image_tokens=r.image_tokens, audio_tokens=r.audio_tokens,
                video_tokens=r.video_tokens, shared_prefix=sp)


def default_replay_horizon(records: Sequence[TraceRecord]) -> int:
    """Replay's default horizon in µs: 2 × the latest arrival; 600 000 000 if every request
    arrives at 0; unbounded (MAX_INT64) for an empty trace."""
    if not records:
        return MAX_INT64
    last = max(r.arrival_time_us for r in records)
    if last <= 0:
        return ALL_AT_ZERO_HORIZON_US
    return min(2 * last, MAX_INT64)
