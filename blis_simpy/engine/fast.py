"""The production engine: :class:`Instance` semantics with decode requests advanced lazily.

In a typical step most of the running batch is decoding: every such request takes one
token, one KV slot and one ITL sample, and nothing else about it changes. Doing that
request by request costs O(batch) Python work per step. :class:`FastInstance` keeps those
requests in a *decode set* U and advances all of them at once:

* ``T`` counts executed steps (ticks). For ``r`` in U the stored ``r.pi`` / ``r.kv_len``
  are its values at the start of tick ``r.g0`` (before that tick's KV slot); the true
  values at tick ``T`` are ``stored + (T - r.g0)``.
* A decoder touches the KV cache only when its slot opens a fresh block (every
  ``block_size`` ticks) or fills its last block (which then gets hashed). Decoders are
  bucketed by ``(g0 - kv_len) mod block_size``, so a tick visits just those buckets.
* Each request's ITL samples are the tick durations over a few contiguous tick segments;
  prefix sums give its ITL sum, a coverage difference array gives ``all_itls``.
* Completions are bucketed by the tick at which they happen.
* The token that ends a vLLM recompute after a preemption has an ITL sample off the tick
  grid (the gap since the request's previous token); it is kept per request as
  ``(tick, µs)`` in ``itl_extra``. ``tick_end`` holds each tick's end time (µs).

When a step is not uniform — the token budget or the KV cache cannot serve everybody —
the step falls back to BLIS's literal, ordered loop (preemption included), then re-bases
the decoders that got no token. :class:`~blis_simpy.engine.instance.Instance` is the
literal reference implementation; tests check that both give identical results.
"""

from __future__ import annotations

import logging
from array import array
from operator import attrgetter

import numpy as np

from blis_simpy.engine.instance import Instance
from blis_simpy.latency.base import BatchView
from blis_simpy.request import COMPLETED
from blis_simpy.units import ceil_div

log = logging.getLogger("blis_simpy.engine")
_by_pos = attrgetter("batch_pos")


class FastInstance(Instance):
    """An engine instance whose decoding requests cost O(1) per step in the common case."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.running = {}          # request -> None, in batch order
        self.prefilling = {}       # running requests with pi < prefill_to, batch order
        self.T = 0                 # executed steps (ticks)
        self.tick_cum = array("q", [0])   # prefix sums of tick ITL values (adv + OTPT)
        self.cov = array("q", [0])        # coverage difference array over ticks
        self.tick_end = array("q")        # end time of each tick, µs
        bs = self.kv.block_size
        self.classes = [set() for _ in range(bs)]
        self.comp_at: dict[int, list] = {}
        self.u_count = 0
        self.u_pi_off = 0          # sum over U of (pi - g0): sum of true pi = off + count*T
        self._skipped: list = []
        self._finished_prefill: list = []

    # ================================================================= decode-set plumbing
    def _join_u(self, r, g0: int) -> None:
        """Add a decoding request; its stored pi/kv_len are its values at tick ``g0``."""
        r.g0 = g0
        r.seg_start = g0
        if r.itl_segments is None:
            r.itl_segments = []
        c = (g0 - r.kv_len) % self.kv.block_size
        r.res_class = c
        self.classes[c].add(r)
        self.u_count += 1
        self.u_pi_off += r.pi - g0
        target = r.input_len + (r.output_len if r.output_len > 1 else 1) - 1
        d = target - r.pi
        mml = self.limits.max_model_len
        if mml > 0 and mml - 1 - r.pi < d:
            d = mml - 1 - r.pi
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

    def _remove_running(self, req) -> None:
        del self.running[req]
        self.prefilling.pop(req, None)
        if req.res_class >= 0:
            self._close_segment(req, self.T)
            self._leave_u(req)

    # ================================================================= batch formation
    def form_batch(self, now: int) -> list:
        kv = self.kv
        bs = kv.block_size
        T = self.T
        self._skipped = []
        self._preempted = False
        budget = self.limits.max_num_scheduled_tokens

        # Is the step uniform (nobody limited by the budget or the KV cache)?
        chunks = []
        demand = self.u_count
        fresh = self.classes[T % bs]
        need = len(fresh)
        for r in self.prefilling:
            n = self._chunk(r.prefill_to - r.pi, r.pi, budget)
            chunks.append(n)
            demand += n
            room = len(r.kv_blocks) * bs - r.kv_len
            eff = n - min(room, n) if 0 < room < bs else n
            if eff > 0:
                need += ceil_div(eff, bs)
        if demand <= budget and need <= kv.total_blocks - kv.used:
            self._budget = budget - demand
            self._uniform_phase1(T, fresh, chunks)
        else:
            self._budget = budget
            order = list(self.running)
            for r in order:
                r.num_new_tokens = 0
                if r.res_class >= 0:
                    self._materialize(r)
            self._phase1(order)
            self._skipped = [r for r in order if r.res_class >= 0 and r.num_new_tokens == 0]
        return self._admit_from_queue()

    def _uniform_phase1(self, T: int, fresh: set, chunks: list) -> None:
        """Phase 1 when everybody is served: only prefill chunks and the decoders whose
        slot opens or fills a block touch the KV cache, in batch order."""
        kv = self.kv
        bs = kv.block_size
        for r, n in zip(self.prefilling, chunks, strict=True):
            r.num_new_tokens = n
        items = list(self.prefilling)
        if fresh:
            items.extend(fresh)
        if bs > 1:
            fill = self.classes[(T + 1) % bs]
            if fill:
                items.extend(fill)
        if len(items) > 1:
            items.sort(key=_by_pos)
        for r in items:
            if r.res_class < 0:       # prefilling
                n = r.num_new_tokens
                if not kv.allocate(r, r.pi, r.pi + n):  # pragma: no cover - guarded above
                    raise AssertionError(f"uniform step could not allocate {n} slots for {r.id}")
                r.computed_tokens += n
            else:
                d = T - r.g0
                if not kv.append_token(r, r.pi + d, r.kv_len + d):  # pragma: no cover
                    raise AssertionError(f"uniform step found no free block for {r.id}")

    # hooks of the literal Phase 1 / Phase 2 (blis_simpy.engine.instance)
    def _alloc(self, req, n: int) -> bool:
        if req.res_class >= 0:        # a (materialised) decoder: its slot, kv_len stays lazy
            return self.kv.append_token(req, req.pi, req.kv_len)
        return self.kv.allocate(req, req.pi, req.pi + n)

    def _evict(self, victim) -> None:
        self._remove_running(victim)

    def _add_running(self, req) -> None:
        self.running[req] = None

    def _admitted_prefill(self, req) -> None:
        self.prefilling[req] = None

    def _admitted_decode_sub(self, req) -> None:
        req.kv_len -= 1               # stored values are "before this tick's slot"
        self._join_u(req, self.T)

    def _sync_last_emit(self, req) -> None:
        """The end time of the request's latest token: its last explicit one (first token,
        end of a recompute) or its last lazy decode tick, whichever came later."""
        t = req.last_emit_tick
        segs = req.itl_segments
        if segs and segs[-1][1] - 1 > t:
            t = segs[-1][1] - 1
        req.last_emit_us = self.tick_end[t]

    # ================================================================= latency view
    def batch_view(self) -> BatchView:
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
    def execute(self, now: int, adv: int) -> None:
        met = self.metrics
        otpt = self.otpt_us
        val = adv + otpt
        end = now + adv
        first_tok = end + otpt
        self.tick_end.append(end)
        finished = []
        for r in self.prefilling:
            r.pi = r.computed_tokens
            if r.pi == r.prefill_to:
                if r.pi > r.input_len:    # a vLLM recompute done: its next output token
                    met.total_output_tokens += 1
                    if r.itl_extra is None:
                        r.itl_extra = []
                    r.itl_extra.append((self.T, end - r.last_emit_us + otpt))
                    r.last_emit_tick = self.T
                    r.prefill_to = r.input_len
                else:
                    self._ttft(r, first_tok)
                finished.append(r)
        for r in finished:
            del self.prefilling[r]
        self._finished_prefill = finished
        met.total_output_tokens += self.u_count - len(self._skipped)
        T = self.T
        for r in self._skipped:      # literal quirk: TTFT re-recorded while pi == input
            if r.pi == r.input_len:
                self._ttft(r, first_tok)
        self.T = T + 1
        self.tick_cum.append(self.tick_cum[-1] + val)
        self.cov.append(0)
        bs = self.kv.block_size
        for r in self._skipped:      # no token this tick: shift its lazy clock by one
            self._close_segment(r, T)
            r.seg_start = T + 1
            self.classes[r.res_class].discard(r)
            r.g0 += 1
            self.u_pi_off -= 1
            r.res_class = (r.g0 - r.kv_len) % bs
            self.classes[r.res_class].add(r)
            r.comp_tick += 1
            self.comp_at.setdefault(r.comp_tick, []).append(r)

    def _ttft(self, r, first_tok: int) -> None:
        r.ttft_set = True
        r.last_emit_tick = self.T
        ttft = first_tok - r.arrival_us
        r.first_token_us = ttft
        met = self.metrics
        met.ttft_sum += ttft
        met.ttft[r.id] = ttft

    # ================================================================= completion
    def complete(self, now: int, adv: int) -> list:
        kv = self.kv
        mml = self.limits.max_model_len
        T = self.T
        done = []
        joiners = []
        for r in self._finished_prefill:
            L = r.output_len
            if r.pi >= r.input_len + (L if L > 1 else 1) - 1:
                done.append(r)
            elif mml > 0 and r.pi >= mml - 1:
                r.length_capped = True
                done.append(r)
            else:
                joiners.append(r)
        for r in self.comp_at.pop(T, ()):
            if r.res_class >= 0 and r.comp_tick == T:
                self._materialize(r)
                self._close_segment(r, T)
                self._leave_u(r)
                L = r.output_len
                if not r.pi >= r.input_len + (L if L > 1 else 1) - 1:
                    r.length_capped = True
                done.append(r)
        if len(done) > 1:
            done.sort(key=_by_pos)
        running = self.running
        for r in done:
            del running[r]
            L = r.output_len
            if r.length_capped:
                log.warning("request %s reached MaxModelLen %d: force-completed", r.id, mml)
                self.metrics.length_capped_requests += 1
            elif L > 0 and r.pi < r.input_len + L:
                if not kv.allocate(r, r.pi, r.pi + 1):
                    log.error("KV allocation failed for the final token of %s", r.id)
                    self.metrics.kv_allocation_failures += 1
            kv.release(r)
            self._record_completion(r, now, adv, capped=r.length_capped)
        for r in joiners:
            self._join_u(r, T)
        return done

    def _record_completion(self, req, now: int, adv: int, *, capped: bool) -> None:
        met = self.metrics
        req.state = COMPLETED
        req.finished_step = self.step_count
        self._touch(now + adv)
        L = req.output_len
        segs = req.itl_segments or ()
        cum = self.tick_cum
        cov = self.cov
        itl_sum = 0
        n_itl = 0
        extra = req.itl_extra
        if segs and not (extra and extra[0][0] < segs[0][0]):
            s0 = segs[0][0]
            req.first_itl_us = cum[s0 + 1] - cum[s0]
        elif extra:
            req.first_itl_us = extra[0][1]
        if extra:
            hist = met.all_itls
            for _, v in extra:
                itl_sum += v
                hist[v] += 1
            n_itl += len(extra)
        for s, e in segs:
            itl_sum += cum[e] - cum[s]
            n_itl += e - s
            cov[s] += 1
            cov[e] -= 1
        post = self.post_decode_us if L > 0 else 0
        e2e = req.first_token_us + itl_sum + post
        met.e2e[req.id] = e2e
        met.completion_time[req.id] = req.arrival_us + e2e
        if L == 0:
            avg = 0.0
        elif capped:
            avg = itl_sum / max(n_itl - 1, 1)
        else:
            avg = itl_sum / max(L - 1, 1)
        met.itl[req.id] = avg
        met.completed_requests += 1
        met.step_counters_sum += req.finished_step - req.scheduled_step
        self.listener.on_request_done(self, req, now + adv)
        req.tokens = None            # the heavy part of a finished request
        req._prompt_hashes = None

    # ================================================================= end of run
    def finalize(self):
        met = super().finalize()
        cum = self.tick_cum
        for r in met.registry.values():   # unfinished requests: spell out their ITL samples
            if r.state != COMPLETED and r.itl_segments is not None:
                if r.res_class >= 0:
                    self._close_segment(r, self.T)
                pairs = [(t, cum[t + 1] - cum[t]) for s, e in r.itl_segments for t in range(s, e)]
                if r.itl_extra:
                    pairs = sorted(pairs + r.itl_extra)
                r.itl = [v for _, v in pairs]
        if self.T:
            counts = np.cumsum(np.frombuffer(self.cov, dtype=np.int64)[: self.T])
            cum = np.frombuffer(self.tick_cum, dtype=np.int64)
            vals = cum[1: self.T + 1] - cum[: self.T]
            mask = counts > 0
            if mask.any():
                uniq, inv = np.unique(vals[mask], return_inverse=True)
                tot = np.bincount(inv, weights=counts[mask].astype(np.float64))
                hist = met.all_itls
                for v, c in zip(uniq.tolist(), tot.tolist(), strict=True):
                    hist[v] += int(c)
        return met
