"""The built-in batching policy ``vllm``: vLLM v1's FCFS chunked prefill with recompute
preemption (docs/engine.md, "Batch formation").

Phase 1 serves the running batch in batch order: each prefilling request its next chunk
(capped by the long-prefill threshold, the token budget left and the MaxModelLen stop),
each decoding request one token; when the KV cache cannot hold a request's tokens the tail
of the batch is preempted until they fit (the request itself, if it is the tail). Phase 2
admits from the head of the wait queue while the running cap, the budget left and the KV
cache allow — unless Phase 1 preempted.

What a preempted request recomputes follows ``engine.preemption_model``
(docs/kv-cache.md, "Preemption"): ``vllm`` (default) recomputes its prompt and outputs so
far as a prefill; ``blis`` restarts its prompt and regenerates its outputs.
"""

from __future__ import annotations

import logging

from blis_simpy.engine.batching import BatchingPolicy, StepAllocator

log = logging.getLogger("blis_simpy.engine")


class VLLMBatching(BatchingPolicy, name="vllm"):
    """vLLM v1 batch formation (see the module docstring)."""

    short_path_safe = True

    def chunk(self, remaining: int, pos: int, budget: int) -> int:
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

    def form_batch(self, a: StepAllocator) -> None:
        budget = self.limits.max_num_scheduled_tokens
        left = a.serve_all(self.chunk, budget)
        if left is None:
            left = self.phase1(a, budget)
            if left is None:             # Phase 1 preempted: no admissions in this step
                return
        self.phase2(a, left)

    def phase1(self, a: StepAllocator, budget: int) -> int | None:
        """Every running request in batch order, preempting from the tail when the KV cache
        is full. Returns the budget left, or None if anything was preempted."""
        mml = self.limits.max_model_len
        order = a.batch()
        preempted = False
        i = 0
        while i < len(order):
            req = order[i]
            if budget <= 0:
                log.debug("token budget exhausted at %s", req.id)
                break
            pi = req.pi
            if pi < req.prefill_to:
                n = self.chunk(req.prefill_to - pi, pi, budget)
            elif req.output_len >= 1 and not (mml > 0 and pi + 1 > mml - 1):
                n = 1
            else:
                i += 1
                continue
            while not a.grant(req, n):
                if not order:             # pragma: no cover - req itself is still in order
                    log.warning("KV cache full and nothing to preempt for %s", req.id)
                    break
                preempted = True
                victim = order.pop()
                budget += a.preempt(victim)
                if victim is req:
                    break
            else:
                budget -= n
                i += 1
                continue
            break
        return None if preempted else budget

    def phase2(self, a: StepAllocator, budget: int) -> None:
        """Admit from the head of the wait queue under the running cap and the budget."""
        cap = self.limits.max_num_running_reqs
        running = a.running
        waitq = a.waitq
        while budget > 0 and len(running) < cap and waitq:
            n = a.admit_head(self.chunk, budget)
            if n is None:
                break
            budget -= n
