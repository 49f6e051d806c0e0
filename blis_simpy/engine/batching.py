"""vLLM batch formation: chunked prefill, the token budget, the running cap and recompute
preemption (spec/02 §4.1), as a mixin of :class:`~blis_simpy.engine.instance.Instance`.

Recompute preemption follows ``limits.preemption_model`` (docs/kv-cache.md, "Preemption"):
``vllm`` (default) re-queues a request that already emitted tokens with a recompute target
``prefill_to`` = prompt + outputs so far, prefilled like a prompt; the step that reaches it
samples the next token. ``blis`` restarts every preempted request at its first prompt token
and regenerates its outputs (BLIS's behaviour, for parity).

``form_batch`` is the overridable hook. Phase 1 serves the running batch in order (each
prefilling request its next chunk, each decoding request one token) and preempts from the
tail when the KV cache is full; Phase 2 admits from the head of the wait queue under the
running cap and the remaining budget. The small ``_add_running`` / ``_alloc`` / ``_evict`` /
``_admitted_*`` hooks let :class:`~blis_simpy.engine.fast.FastInstance` keep its own
structures in step while reusing this code.

The mixin expects the instance's ``limits``, ``kv``, ``running``, ``waitq``, ``metrics``,
``step_count``, ``env``, ``id`` and ``listener``.
"""

from __future__ import annotations

import logging

from blis_simpy.request import DROPPED, RUNNING
from blis_simpy.request import QUEUED as ST_QUEUED
from blis_simpy.units import ceil_div

log = logging.getLogger("blis_simpy.engine")


class BatchFormation:
    """Batch formation for an engine instance (see the module docstring)."""

    def form_batch(self, now: int) -> list:
        """vLLM FCFS batch formation with chunked prefill and recompute preemption.

        Phase 1 serves the running batch in order; Phase 2 admits from the wait queue.
        Returns the requests newly admitted in this step.
        """
        for r in self.running:
            r.num_new_tokens = 0
        self._budget = self.limits.max_num_scheduled_tokens
        self._preempted = False
        self._phase1(self.running)
        return self._admit_from_queue()

    def _chunk(self, remaining: int, pos: int, budget: int) -> int:
        """Prefill tokens to schedule: capped by the long-prefill threshold, the token
        budget and the MaxModelLen stop (never beyond position M - 1)."""
        lim = self.limits
        n = remaining
        thr = lim.long_prefill_token_threshold
        if 0 < thr < n:
            n = thr
        if n > budget:
            n = budget
        mml = lim.max_model_len
        if mml > 0:
            n = min(n, max(mml - 1 - pos, 0))
        return n

    def _phase1(self, order: list) -> None:
        """Phase 1 (spec/02 §4.1): every running request in batch order; ``order`` is a
        list of them that preemption shrinks from the tail."""
        mml = self.limits.max_model_len
        i = 0
        while i < len(order):
            req = order[i]
            if self._budget <= 0:
                log.debug("token budget exhausted at %s", req.id)
                break
            pi = req.pi
            if pi < req.prefill_to:
                n = self._chunk(req.prefill_to - pi, pi, self._budget)
                if not self._preempt_for_tokens(req, n, order):
                    break
            elif req.output_len >= 1:
                if mml > 0 and pi + 1 > mml - 1:
                    i += 1
                    continue
                n = 1
                if not self._preempt_for_tokens(req, 1, order):
                    break
            else:
                i += 1
                continue
            self._budget -= n
            req.num_new_tokens = n
            req.computed_tokens += n
            i += 1

    def _admit_from_queue(self) -> list:
        """Phase 2: admit from the head of the wait queue while the running cap, the token
        budget and the KV cache allow, unless Phase 1 preempted (spec/02 §4.1)."""
        kv = self.kv
        bs = kv.block_size
        cap = self.limits.max_num_running_reqs
        waitq = self.waitq
        scheduled = []
        while (len(self.running) < cap and waitq and self._budget > 0 and not self._preempted):
            nxt = waitq[0]
            if nxt.is_decode_sub and nxt.prefill_to == nxt.input_len:  # PD decode sub-request:
                # its prompt KV already held (or BLIS's restart: one token, then a prefill)
                if nxt.output_len == 0:       # nothing to decode: completes in this step
                    n = 0                     # (spec/06 §3.7 REC; BLIS would crash)
                elif kv.allocate(nxt, nxt.pi, nxt.pi + 1):
                    n = 1
                elif not self.running and self._unblock_queue(nxt):
                    continue
                elif not self.running and nxt.kv_blocks:
                    waitq.popleft()           # alone with its prompt it still cannot fit
                    kv.release(nxt)
                    self._drop_hopeless(nxt)
                    continue
                else:
                    break
                waitq.popleft()
                self._admit(nxt, n)
                nxt.computed_tokens = nxt.pi + n
                if n and nxt.pi >= nxt.input_len:
                    self._admitted_decode_sub(nxt)
                else:                         # preempted earlier: recomputed as a prefill
                    self._admitted_prefill(nxt)
                scheduled.append(nxt)
                continue
            cached = kv.get_cached_blocks(nxt)
            start = len(cached) * bs
            n = self._chunk(nxt.prefill_to - start, start, self._budget)
            if not kv.allocate(nxt, start, start + n, cached):
                if not self.running and self._unblock_queue(nxt):
                    continue
                if ceil_div(nxt.prefill_to, bs) > kv.total_blocks:
                    waitq.popleft()           # a vllm recompute longer than the whole cache
                    kv.release(nxt)
                    self._drop_hopeless(nxt)
                    continue
                break
            waitq.popleft()
            self._admit(nxt, n)
            nxt.computed_tokens = start + n
            self._admitted_prefill(nxt)
            scheduled.append(nxt)
        return scheduled

    def _unblock_queue(self, head) -> bool:
        """The batch is empty and ``head`` cannot get KV because *queued* requests hold it
        (PD decode sub-requests with pre-allocated prompts, CPU-tier commits). Nothing
        running could ever free it — BLIS steps forever here — so recompute-preempt the
        last queued holder, as vLLM preempts. Returns False if there is none."""
        for r in reversed(self.waitq):
            if r is not head and r.kv_blocks:
                log.debug("[tick %d] releasing the KV of queued %s to admit %s",
                          self.env.now, r.id, head.id)
                self.kv.release(r)
                self._reset_preempted(r)
                self.metrics.preemption_count += 1
                return True
        return False

    def _admit(self, req, n: int) -> None:
        self._add_running(req)
        if self.limits.preemption_model == "blis" or not req.scheduled_step:
            req.scheduled_step = self.step_count   # vllm: a re-admission keeps the first
        req.state = RUNNING
        req.num_new_tokens = n
        self._budget -= n
        self._pos += 1
        req.batch_pos = self._pos

    # Hooks the fast engine overrides to keep its own structures in step.
    def _add_running(self, req) -> None:
        self.running.append(req)

    def _admitted_prefill(self, req) -> None:
        """A request was admitted from the queue with a prompt chunk."""

    def _admitted_decode_sub(self, req) -> None:
        """A PD decode sub-request was admitted with its first token slot."""

    def _alloc(self, req, n: int) -> bool:
        """Reserve KV for the next ``n`` tokens of a running request."""
        return self.kv.allocate(req, req.pi, req.pi + n)

    def _evict(self, victim) -> None:
        """``victim`` was popped from the Phase 1 order by preemption."""

    def _preempt_for_tokens(self, req, n: int, order: list) -> bool:
        """Allocate for ``req``, evicting from the tail of ``order`` until it fits."""
        kv = self.kv
        need_tokens = req.pi + n
        while True:
            if self._alloc(req, n):
                return True
            if not order:
                log.warning("KV cache full and nothing to preempt for %s", req.id)
                return False
            self._preempted = True
            victim = order.pop()
            self._evict(victim)
            log.debug("[tick %d] preemption: evicting %s to make room", self.env.now, victim.id)
            self.metrics.preemption_count += 1
            if victim.num_new_tokens > 0:
                self._budget += victim.num_new_tokens
                victim.num_new_tokens = 0
            victim.state = ST_QUEUED
            kv.release(victim)
            self._reset_preempted(victim)
            if victim is req and not order and self._hopeless(req, need_tokens):
                self._drop_hopeless(req)
                return False
            self.waitq.appendleft(victim)
            if victim is req:
                return False

    def _reset_preempted(self, victim) -> None:
        """``victim`` lost its KV (already released): it restarts at ``pi`` 0.

        Under ``blis`` it restarts its prompt and regenerates its outputs. Under ``vllm``,
        once it has emitted a token (its first, or a decode token of a PD decode
        sub-request), it recomputes the prompt and every output so far, ``pi`` + 1 tokens
        (the last one sampled but not yet fed), as a prefill; a request preempted again
        while recomputing keeps its target. Before its first token it restarts its prompt.
        """
        if (self.limits.preemption_model == "vllm" and victim.prefill_to == victim.input_len
                and (victim.ttft_set or victim.pi > victim.input_len)):
            self._sync_last_emit(victim)
            victim.prefill_to = victim.pi + 1
        victim.pi = 0
        victim.computed_tokens = 0

    def _sync_last_emit(self, req) -> None:
        """Hook: make ``req.last_emit_us`` current (the fast engine tracks ticks)."""

    def _hopeless(self, req, need_tokens: int) -> bool:
        """Can ``req``, alone in the batch and unable to get KV, ever finish?

        Not if its sequence needs more blocks than the whole cache. Otherwise queued
        requests hold the blocks it needs (PD decode sub-requests, CPU-tier commits); BLIS
        re-queues it, which can succeed once — but if it ends up alone and stuck again
        with nothing finished on this instance in between, it would loop forever.
        """
        if ceil_div(need_tokens, self.kv.block_size) > self.kv.total_blocks:
            return True
        m = self.metrics
        progress = m.completed_requests + m.timed_out_requests + m.dropped_unservable
        stuck = self._stuck_at.get(req.id)
        self._stuck_at[req.id] = progress
        return stuck == progress

    def _drop_hopeless(self, req) -> None:
        """A request that can never get the KV it needs (see :meth:`_hopeless`) would be
        recomputed forever (BLIS livelocks here). It is dropped as unservable instead, like
        an enqueue-guard drop."""
        log.warning("dropping request %s: it cannot get the KV blocks it needs on %s "
                    "(%d KV blocks in all) and would be recomputed forever",
                    req.id, self.id, self.kv.total_blocks)
        req.state = DROPPED
        met = self.metrics
        met.dropped_unservable += 1
        for table in (met.registry, met.ttft, met.scheduling_delay):
            table.pop(req.id, None)
        self.listener.on_request_done(self, req, self.env.now)
