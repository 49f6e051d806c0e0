"""The lazy ledger: decoding requests advanced all at once (the ``fast`` engine).

In a typical step most of the running batch is decoding: every such request takes one
token, one KV slot and one ITL sample, and nothing else about it changes. Doing that
request by request costs O(batch) Python work per step. :class:`LazyLedger` keeps those
requests in a *decode set* U and advances all of them at once:

* ``T`` counts executed steps (ticks). For ``r`` in U the stored ``r.pi`` / ``r.kv_len``
  are its values at the start of tick ``r.g0`` (before that tick's KV slot); the true
  values at tick ``T`` are ``stored + (T - r.g0)``. :meth:`LazyLedger._materialize` makes
  them true (``g0 = T``) at any time without changing anything else.
* A decoder touches the KV cache only when its slot opens a fresh block (every
  ``block_size`` ticks) or fills its last block (which then gets hashed). Decoders are
  bucketed by ``(g0 - kv_len) mod block_size``, so a tick visits just those buckets.
* Each request's ITL samples are the tick durations over a few contiguous tick segments;
  prefix sums give its ITL sum, a coverage difference array gives ``all_itls``.
* Completions are bucketed by the tick at which they happen.
* The token that ends a vLLM recompute after a preemption has an ITL sample off the tick
  grid (the gap since the request's previous token); it is kept per request as
  ``(tick, µs)`` in ``itl_extra``. ``tick_end`` holds each tick's end time (µs).
* The per-tick arrays keep only ticks from ``base`` on (:meth:`LazyLedger._compact`): every
  :data:`COMPACT_TICKS` ticks, the ticks no request can read any more — before the oldest
  segment, lazy clock or latest token of a request still holding them — are folded into
  ``all_itls`` and dropped, so a long run's memory does not grow with its steps.

When a step is not uniform — the token budget or the KV cache cannot serve everybody —
:meth:`LazyLedger.serve_all` declines and the batching policy runs its literal, ordered
loop over :meth:`LazyLedger.batch` (every decoder materialised); the decoders that got no
token are then re-based. :class:`~blis_simpy.engine.ledger.EagerLedger` is the literal
reference; tests check that both give identical results, and that hooks see identical
request state under both (:meth:`LazyLedger.materialise`).
"""

from __future__ import annotations

import heapq
from array import array
from itertools import chain, islice
from operator import attrgetter, itemgetter

import numpy as np

from blis_simpy.engine.ledger import Ledger, completion_pi, last_token_pi, split_completed
from blis_simpy.latency.base import BatchView
from blis_simpy.request import COMPLETED, DROPPED, TIMED_OUT

_by_pos = attrgetter("batch_pos")
_tick = itemgetter(0)
#: ticks between two attempts to drop the per-tick history no request can read any more
COMPACT_TICKS = 1 << 16


class LazyLedger(Ledger):
    """A ledger whose decoding requests cost O(1) per step in the common case."""

    kind = "fast"

    def __init__(self, inst):
        super().__init__(inst)
        self.running: dict = {}    # request -> None, in batch order
        self.prefilling = {}       # running requests with pi < prefill_to, batch order
        self.T = 0                 # executed steps (ticks)
        self.tick_cum = array("q", [0])   # prefix sums of tick ITL values (step_us + OTPT)
        self.cov = array("q", [0])        # coverage difference array over ticks
        self.tick_end = array("q")        # end time of each tick, µs
        self.base = 0                     # the arrays' first tick (earlier ones compacted)
        self._held: dict = {}             # requests whose ITL segments are not summarised yet
        self._next_compact = COMPACT_TICKS
        self._tick0_end = 0               # tick 0's end, kept when tick 0 is compacted
        self.classes = [set() for _ in range(self.kv.block_size)]
        self.comp_at: dict[int, list] = {}
        self.u_count = 0
        self.u_pi_off = 0          # sum over U of (pi - g0): sum of true pi = off + count*T
        self._skipped: list = []   # decoders in U that got no token in this step
        self._finished_prefill: list = []
        self._joiners: list = []   # requests that joined U at this step's completion pass
        self._literal = False      # this step: the policy walks the materialised batch
        self._uniform = False      # this step: serve_all served everybody

    # ================================================================= decode-set plumbing
    def _join_u(self, r, g0: int) -> None:
        """Add a decoding request; its stored pi/kv_len are its values at tick ``g0``."""
        r.g0 = g0
        r.seg_start = g0
        if r.itl_segments is None:
            r.itl_segments = []
            self._held[r] = None
        c = (g0 - r.kv_len) % self.kv.block_size
        r.res_class = c
        self.classes[c].add(r)
        self.u_count += 1
        self.u_pi_off += r.pi - g0
        d = completion_pi(r, self.limits.max_model_len) - r.pi
        r.comp_tick = g0 + (d if d > 1 else 1)
        self.comp_at.setdefault(r.comp_tick, []).append(r)

    def _leave_u(self, r) -> None:
        self.classes[r.res_class].discard(r)
        r.res_class = -1
        self.u_count -= 1
        self.u_pi_off -= r.pi - r.g0

    def _materialize(self, r) -> None:
        d = self.T - r.g0
        if d:
            r.pi += d
            r.kv_len += d
            r.g0 = self.T

    def _close_segment(self, r, end: int) -> None:
        if end > r.seg_start:
            r.itl_segments.append((r.seg_start, end))
        r.seg_start = end

    def add(self, req, decoding: bool) -> None:
        self.running[req] = None
        if decoding:
            req.kv_len -= 1           # stored values are "before this tick's slot"
            self._join_u(req, self.T)
        else:
            self.prefilling[req] = None

    def remove(self, req) -> None:
        del self.running[req]
        self.prefilling.pop(req, None)
        if req.res_class >= 0:
            self._materialize(req)
            self._close_segment(req, self.T)
            self._leave_u(req)
        if self.inst.observed:
            self._sync_itl(req)

    # ================================================================= batch formation
    def start_batching(self) -> None:
        self._skipped = []
        self._literal = False
        self._uniform = False

    def serve_all(self, chunk, budget_tokens: int) -> int | None:
        """Is the step uniform (nobody limited by the budget or the KV cache)? Then only
        prefill chunks and the decoders whose slot opens or fills a block touch the KV
        cache, in batch order."""
        if self._literal:
            return None
        kv = self.kv
        bs = kv.block_size
        T = self.T
        chunks = []
        demand = self.u_count
        fresh = self.classes[T % bs]
        need = len(fresh)
        for r in self.prefilling:
            n = chunk(r.prefill_to - r.pi, r.pi, budget_tokens)
            if n is None:
                return None
            chunks.append(n)
            demand += n
            need += kv.blocks_needed(r, n)
        if demand > budget_tokens or need > kv.total_blocks - kv.used:
            return None
        self._uniform = True
        for r, n in zip(self.prefilling, chunks, strict=True):
            r.num_new_tokens = n
        items = self._boundary(T)
        if self.prefilling:
            items.extend(self.prefilling)
        if len(items) > 1:
            items.sort(key=_by_pos)
        slots = []                    # decoders' KV slots, their lazy positions made true
        for r in items:
            if r.res_class < 0:       # prefilling: the decoders before it first
                if slots:
                    self._append(slots)
                    slots = []
                n = r.num_new_tokens
                if not kv.allocate(r, r.pi, r.pi + n):  # pragma: no cover - guarded above
                    raise AssertionError(f"uniform step could not allocate {n} slots for {r.id}")
                r.computed_tokens += n
            else:
                d = T - r.g0
                slots.append((r, r.pi + d, r.kv_len + d))
        if slots:
            self._append(slots)
        return budget_tokens - demand

    def _append(self, slots: list) -> None:
        """The KV slots of decoders served in a uniform step (``(req, pos, kv_len)``, in
        batch order), taken in one call; the step was checked to have room for them."""
        r = self.kv.append_tokens(slots)
        if r is not None:             # pragma: no cover - uniform_ready / serve_all checked
            raise AssertionError(f"uniform step found no free block for {r.id}")

    # ================================================================= pure-decode ticks
    def uniform_ready(self) -> bool:
        """Can tick ``T`` be a *pure-decode tick*: every running request decoding (nobody
        prefilling), all of them within the token budget, none completing at its end, and
        the KV cache able to supply the fresh blocks of those whose slot opens one? (With
        nothing waiting, such a step is what :meth:`serve_uniform` and
        :meth:`advance_uniform` do.)"""
        u = self.u_count
        if not u or u != len(self.running) or u > self.limits.max_num_scheduled_tokens:
            return False
        T = self.T
        kv = self.kv
        return (T + 1 not in self.comp_at
                and len(self.classes[T % kv.block_size]) <= kv.total_blocks - kv.used)

    def serve_uniform(self) -> int:
        """Batch formation of a pure-decode tick (:meth:`uniform_ready`): :meth:`serve_all`
        with nobody prefilling — one token for each decoder, of which only those whose slot
        opens or fills a block touch the KV cache, in batch order. Returns the decoders'
        summed true ``pi`` (what the latency model's decode function reads)."""
        self._skipped = []
        self._literal = False
        self._uniform = True
        T = self.T
        items = self._boundary(T)
        if len(items) > 1:
            items.sort(key=_by_pos)
        if items:
            self._append([(r, r.pi + T - r.g0, r.kv_len + T - r.g0) for r in items])
        return self.u_pi_off + self.u_count * T

    def advance_uniform(self, now_us: int, step_us: int) -> None:
        """Execute and complete the pure-decode tick served by :meth:`serve_uniform`, begun at
        ``now_us`` and lasting ``step_us`` µs: every decoder's token, the tick's end and ITL
        value (:meth:`execute` and :meth:`complete` of such a tick: nobody finishes a
        prefill, is skipped or completes)."""
        self.tick_end.append(now_us + step_us)
        self.metrics.total_output_tokens += self.u_count
        self._finished_prefill = []
        self._joiners = []
        self._next_tick(step_us)

    def _boundary(self, T: int) -> list:
        """The decoders whose slot at tick ``T`` opens a fresh block or fills their last one
        (the only ones that touch the KV cache in a uniform step), unordered."""
        classes = self.classes
        bs = self.kv.block_size
        items = list(classes[T % bs])
        if bs > 1:
            fill = classes[(T + 1) % bs]
            if fill:
                items.extend(fill)
        return items

    def _next_tick(self, step_us: int) -> None:
        """Close tick ``T`` that lasted ``step_us`` µs: its ITL value, its coverage slot."""
        self.T += 1
        self.tick_cum.append(self.tick_cum[-1] + step_us + self.otpt_us)
        self.cov.append(0)
        if self.T >= self._next_compact:
            self._compact()

    def batch(self) -> list:
        order = list(self.running)
        if self._literal:
            return order
        self._literal = True
        uniform = self._uniform
        for r in order:
            if r.res_class >= 0:
                self._materialize(r)
                if uniform:           # served by serve_all: its token of this step
                    r.num_new_tokens = 1
                    r.computed_tokens = r.pi + 1
            if not uniform:
                r.num_new_tokens = 0
        return order

    def alloc(self, req, n_tokens: int) -> bool:
        if not self._literal:
            self.batch()
        if req.res_class >= 0:        # a (materialised) decoder: its slot, kv_len stays lazy
            return self.kv.append_token(req, req.pi, req.kv_len)
        return self.kv.allocate(req, req.pi, req.pi + n_tokens)

    def end_batching(self) -> None:
        if not self._uniform:
            if not self._literal:     # the policy served nobody this step
                self.batch()
            self._skipped = [r for r in self.running if r.res_class >= 0 and r.num_new_tokens == 0]

    def sync_last_emit(self, req) -> None:
        """The end time of the request's latest token: its last explicit one (first token,
        end of a recompute) or its last lazy decode tick, whichever came later."""
        t = req.last_emit_tick
        segs = req.itl_segments
        if segs and segs[-1][1] - 1 > t:
            t = segs[-1][1] - 1
        if t >= self.base:
            req.last_emit_us = self.tick_end[t - self.base]
        elif t == 0:                  # tick 0's end outlives its compaction (_compact)
            req.last_emit_us = self._tick0_end
        else:                         # pragma: no cover - _compact keeps every other such tick
            raise AssertionError(f"{req.id}: tick {t} was compacted (base {self.base})")

    # ================================================================= latency view
    def view(self) -> BatchView:
        v = BatchView(decode_count=self.u_count,
                      decode_tokens=self.u_count - len(self._skipped),
                      decode_pi_sum=self.u_pi_off + self.u_count * self.T,
                      size=len(self.running), entries_fn=self._entries)
        for r in self.prefilling:
            if r.pi < r.prefill_to:
                v.prefill.append(r)
            elif r.output_len >= 1:
                v.decode_count += 1
                v.decode_pi_sum += r.pi
                v.decode_tokens += r.num_new_tokens
        return v

    def _entries(self):
        """Per-request view of the batch in batch order (for order-sensitive latency models)."""
        T = self.T
        skipped = set(self._skipped)
        for r in self.running:
            if r.res_class >= 0:
                yield False, r.pi + T - r.g0, 0 if r in skipped else 1, r.input_len
            elif r.pi < r.prefill_to:
                yield True, r.pi, r.num_new_tokens, r.input_len
            elif r.output_len >= 1:
                yield False, r.pi, r.num_new_tokens, r.input_len

    # ================================================================= execute
    def execute(self, now_us: int, step_us: int) -> None:
        met = self.metrics
        end = now_us + step_us
        first_tok = end + self.otpt_us
        T = self.T
        self.tick_end.append(end)
        finished = []
        mml = self.limits.max_model_len
        for r in self.prefilling:
            r.pi = r.computed_tokens
            if r.pi == r.prefill_to:
                if r.pi > r.input_len:    # a vLLM recompute done: its next output token
                    if r.itl_extra is None:
                        r.itl_extra = []
                    r.itl_extra.append((T, self._recompute_done(r, end)))
                else:
                    self._first_token(r, first_tok)
                    self.first_tokens += 1
                r.last_emit_tick = T
                finished.append(r)
            elif mml > 0 and r.pi >= completion_pi(r, mml):
                # length-capped mid-prompt (at M - 1, which no chunk passes): a PD decode
                # sub-request with a prompt over its pool's MaxModelLen, restarted as a
                # prefill. It completes now, as every request at its completion pi does
                finished.append(r)
        for r in finished:
            del self.prefilling[r]
        self._finished_prefill = finished
        skipped = self._skipped
        met.total_output_tokens += self.u_count - len(skipped)
        for r in skipped:            # literal quirk: TTFT re-recorded while pi == input
            if r.pi == r.input_len:
                self._first_token(r, first_tok)
                r.last_emit_tick = T
        self._next_tick(step_us)
        bs = self.kv.block_size
        for r in skipped:            # no token this tick: shift its lazy clock by one
            self._close_segment(r, T)
            r.seg_start = T + 1
            self.classes[r.res_class].discard(r)
            r.g0 += 1
            self.u_pi_off -= 1
            r.res_class = (r.g0 - r.kv_len) % bs
            self.classes[r.res_class].add(r)
            r.comp_tick += 1
            self.comp_at.setdefault(r.comp_tick, []).append(r)

    # ================================================================= completion
    def complete(self) -> list:
        T = self.T
        if self._finished_prefill:
            done, joiners = split_completed(self._finished_prefill, self.limits.max_model_len)
        else:
            done, joiners = [], []
        for r in self.comp_at.pop(T, ()):
            if r.res_class >= 0 and r.comp_tick == T:
                self._materialize(r)
                self._close_segment(r, T)
                self._leave_u(r)
                r.length_capped = r.pi < last_token_pi(r)
                r.computed_tokens = r.pi
                if self._uniform:     # served by serve_all in its last step
                    r.num_new_tokens = 1
                done.append(r)
        if len(done) > 1:
            done.sort(key=_by_pos)
        running = self.running
        for r in done:
            del running[r]
        for r in joiners:
            self._join_u(r, T)
        self._joiners = joiners
        return done

    def itl_summary(self, req) -> tuple[int, int, int | None]:
        self._held.pop(req, None)
        segs = req.itl_segments or ()
        cum = self.tick_cum
        cov = self.cov
        b = self.base
        itl_sum = 0
        n_itl = 0
        first = None
        extra = req.itl_extra
        if segs and not (extra and extra[0][0] < segs[0][0]):
            s0 = segs[0][0] - b
            first = cum[s0 + 1] - cum[s0]
        elif extra:
            first = extra[0][1]
        if extra:
            hist = self.metrics.all_itls
            for _, v in extra:
                itl_sum += v
                hist[v] += 1
            n_itl += len(extra)
        for s, e in segs:
            s -= b
            e -= b
            itl_sum += cum[e] - cum[s]
            n_itl += e - s
            cov[s] += 1
            cov[e] -= 1
        return itl_sum, n_itl, first

    def forget(self, completed: list) -> None:
        for req in completed:         # the heavy part of a finished request
            req.tokens = None
            req.drop_prompt_hashes()

    # ================================================================= materialisation
    def materialise(self, extra=()) -> None:
        fix_tokens = self._uniform
        joined = set(self._joiners) if fix_tokens else ()
        for r in self.running:
            if r.res_class >= 0:
                self._materialize(r)
                r.computed_tokens = r.pi
                if fix_tokens and r not in joined:
                    r.num_new_tokens = 1
            self._sync_itl(r)
        for r in extra:
            self._sync_itl(r)

    def samples(self, r) -> int:
        """How many ITL samples ``r`` has: its segments' ticks (the open one up to now) and
        its samples off the tick grid, listed in ``r.itl`` or not yet; O(segments)."""
        segs = r.itl_segments
        n = sum(e - s for s, e in segs) if segs else 0
        if r.res_class >= 0 and self.T > r.seg_start:
            n += self.T - r.seg_start
        extra = r.itl_extra
        return n + len(extra) if extra else n

    def _sync_itl(self, r) -> None:
        """Append to ``r.itl`` the ITL samples it has beyond those already listed."""
        missing = self.samples(r) - len(r.itl)
        if missing <= 0:
            return
        segs = r.itl_segments
        spans = list(segs) if segs else []
        if r.res_class >= 0 and self.T > r.seg_start:
            spans.append((r.seg_start, self.T))
        extra = r.itl_extra or ()
        cum = self.tick_cum
        b = self.base
        ticks = ((t, cum[t + 1 - b] - cum[t - b]) for s, e in reversed(spans)
                 for t in range(e - 1, s - 1, -1))
        latest = heapq.merge(ticks, reversed(extra), key=_tick, reverse=True)
        r.itl.extend(v for _, v in reversed(list(islice(latest, missing))))

    # ================================================================= end of run
    def finalize(self, met) -> None:
        for r in met.registry.values():   # unfinished requests: spell out their ITL samples
            if r.state != COMPLETED and r.itl_segments is not None:
                if r.res_class >= 0:
                    self._close_segment(r, self.T)
                self._spell_itl(r)
        self._fold(self.T - self.base, met.all_itls)

    def _spell_itl(self, r) -> None:
        """``r.itl``: every ITL sample of its (final) segments and recompute gaps, in order."""
        cum = self.tick_cum
        b = self.base
        pairs = [(t, cum[t + 1 - b] - cum[t - b]) for s, e in r.itl_segments for t in range(s, e)]
        if r.itl_extra:
            pairs = sorted(pairs + r.itl_extra)
        r.itl = [v for _, v in pairs]

    def _fold(self, n: int, hist) -> None:
        """Add to ``hist`` the ITL samples of the arrays' first ``n`` ticks: each tick's value
        times the requests covering it (``cov``'s running sum from the array start)."""
        if n <= 0:
            return
        counts = np.cumsum(np.frombuffer(self.cov, dtype=np.int64)[:n])
        cum = np.frombuffer(self.tick_cum, dtype=np.int64)
        vals = cum[1: n + 1] - cum[:n]
        mask = counts > 0
        if mask.any():
            uniq, inv = np.unique(vals[mask], return_inverse=True)
            tot = np.bincount(inv, weights=counts[mask].astype(np.float64))
            for v, c in zip(uniq.tolist(), tot.tolist(), strict=True):
                hist[v] += int(c)

    def _compact(self) -> None:
        """Drop the ticks before the oldest one a request can still read (its first unsummarised
        segment, its lazy clock, its latest token); their ITL samples, final by then, go to
        ``all_itls`` and their coverage is carried into the first kept tick. A request that
        left for good without completing (timed out, dropped as hopeless: segments final,
        never summarised) has its samples spelled out first — recompute gaps included — and
        lets go."""
        self._next_compact = self.T + COMPACT_TICKS
        keep = self.T
        for r in list(self._held):
            if r.res_class < 0 and (r.state == TIMED_OUT or r.state == DROPPED):
                self._spell_itl(r)
                r.itl_segments = None
                del self._held[r]
        for r in chain(self._held, self.running):
            segs = r.itl_segments
            if segs and segs[0][0] < keep:            # read by itl_summary / _spell_itl
                keep = segs[0][0]
            if r.res_class >= 0 and r.seg_start < keep:
                keep = r.seg_start
            if r.ttft_set or r.pi > r.input_len:      # sync_last_emit may read its latest token
                t = r.last_emit_tick
                if segs and segs[-1][1] - 1 > t:
                    t = segs[-1][1] - 1
                if 0 < t < keep:                      # tick 0's end is kept apart
                    keep = t
        n = keep - self.base
        if n < COMPACT_TICKS // 2:        # not worth a copy yet
            return
        self._fold(n, self.metrics.all_itls)
        if self.base == 0:
            self._tick0_end = self.tick_end[0]
        carry = sum(self.cov[:n])
        self.cov = self.cov[n:]
        self.cov[0] += carry
        self.tick_cum = self.tick_cum[n:]
        self.tick_end = self.tick_end[n:]
        self.base = keep
