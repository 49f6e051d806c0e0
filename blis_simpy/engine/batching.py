"""Batching policies: which running requests get how many tokens in a step, who is
preempted and who is admitted (docs/engine.md, "Batch formation", describes vLLM's, the built-in ``vllm``).

Batching is a policy family, a registry like schedulers and routers: a policy is one class
(in one file) that subclasses :class:`BatchingPolicy` with a name, is selected by the
scenario key ``engine.batching: NAME`` and may declare pydantic ``Params``
(``engine.batching_params``). Once per step the instance loop calls
:meth:`BatchingPolicy.form_batch` with a :class:`StepAllocator`: a read-only view of the
engine (the running batch, the wait queue, the limits, the free KV blocks) and a narrow
allocator through which the policy's decisions take effect.

Why an allocator and not a returned plan: whether a request fits depends on the KV
allocations made before it in the same step (prefix-cache hits, partly filled blocks,
preemption freeing blocks), and vLLM decides preemption and admission one request at a
time against that state. A plan computed up front would have to re-implement the KV
cache to stay exact; so the policy decides and the allocator applies each decision at
once, in order:

* :meth:`StepAllocator.serve_all` — serve the whole running batch (prefill chunks, one
  token per decoder) when it fits the budget and the free KV; the lazy engine does this in
  O(1) per decoder-free step, so a policy should try it first;
* :meth:`StepAllocator.batch` — the running requests, materialised, in batch order;
* :meth:`StepAllocator.grant` — reserve KV for a running request's next tokens;
* :meth:`StepAllocator.preempt` — recompute-preempt a running request (back to the head of
  the wait queue; what it recomputes follows ``engine.preemption_model``);
* :meth:`StepAllocator.admit_head` — admit the head of the wait queue with a chunk.

Engine mechanics that every policy shares stay in the allocator: prefix-cache lookup, PD
decode sub-requests (their prompt KV already held), unblocking a queue whose queued
requests hold the KV the head needs, and dropping a request that can never fit.

Times are integer µs; budgets and chunks count tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ClassVar

from blis_simpy.engine import tally
from blis_simpy.plugins import Pluggable
from blis_simpy.request import DROPPED, RUNNING
from blis_simpy.request import QUEUED as ST_QUEUED
from blis_simpy.units import ceil_div

log = logging.getLogger("blis_simpy.engine")

#: ``chunk(remaining_tokens, pos, budget_tokens)``: the prefill tokens to schedule for a
#: request with ``remaining_tokens`` left to prefill from position ``pos``; None refuses.
Chunk = Callable[[int, int, int], "int | None"]


class BatchingPolicy(Pluggable, family="batching policy"):
    """Forms each step's batch through a :class:`StepAllocator` (see the module docstring).

    The instance builds one policy per instance with its validated ``params`` and calls
    :meth:`bind` with the instance's :class:`~blis_simpy.engine.limits.EngineLimits`.
    """

    own_claims = ("short_path_safe",)
    #: the class's own claim (a subclass that does not set it gets False:
    #: :attr:`~blis_simpy.plugins.Pluggable.own_claims`): when nothing waits and the token
    #: budget and the free KV blocks serve every running request, a step gives each decoding
    #: request one token and nothing else, so the fast engine's pure-decode short path may
    #: stand in for :meth:`form_batch` (docs/performance.md, "Step coalescing")
    short_path_safe: ClassVar[bool] = False

    def __init__(self, params=None):
        self.params = params if params is not None else type(self).Params()
        self.limits = None

    def bind(self, limits) -> None:
        """The limits (token budget, running cap, MaxModelLen, ...) of the instance."""
        self.limits = limits

    def form_batch(self, a: StepAllocator) -> None:
        """Decide this step's batch, applying each decision through ``a``."""
        raise NotImplementedError


class StepAllocator:
    """The engine as a batching policy sees it in one step (see the module docstring).

    Read-only view (never change these directly): ``limits``, ``running`` (the running
    batch in batch order; its requests' ``pi``, ``prefill_to``, ``input_len``,
    ``output_len`` and ``num_new_tokens`` are materialised once :meth:`batch` returned),
    ``waitq`` (the wait queue, head first), :attr:`free_blocks`, ``block_size``.
    ``admitted`` lists the requests admitted in this step.
    """

    def __init__(self, inst, ledger, policy: BatchingPolicy):
        self._inst = inst
        self._ledger = ledger
        self._policy = policy
        self.limits = inst.limits
        self.kv = inst.kv
        self.block_size = inst.kv.block_size
        self.running = ledger.running
        self.waitq = inst.waitq
        self.admitted: list = []
        self._pos = 0                          # batch-position counter (admission order)
        self._want = None                      # (request, tokens) of the last failed grant
        self._stuck_at: dict[str, int] = {}    # request -> progress count when it got stuck
        self.serve_all = ledger.serve_all      # the two ledger calls, without a hop
        self.batch = ledger.batch
        #: a CPU tier with asynchronous loads (kv/offload.py): admission looks it up
        self._offload = inst.kv.async_transfers

    @property
    def free_blocks(self) -> int:
        return self.kv.total_blocks - self.kv.used

    def form(self) -> list:
        """Run the policy for one step; returns the requests admitted in it."""
        self.admitted = []
        self._want = None
        ledger = self._ledger
        ledger.start_batching()
        self._policy.form_batch(self)
        ledger.end_batching()
        return self.admitted

    # ------------------------------------------------------------------ running requests
    def serve_all(self, chunk: Chunk, budget_tokens: int) -> int | None:
        """Serve every running request at once — prefilling ones ``chunk(...)`` tokens,
        decoding ones one token — if all of it fits ``budget_tokens`` and the free KV
        blocks. Returns the budget left, or None when it did nothing (then walk
        :meth:`batch` request by request). The reference engine always returns None."""
        return self._ledger.serve_all(chunk, budget_tokens)

    def batch(self) -> list:
        """The running requests in batch order, materialised (a new list)."""
        return self._ledger.batch()

    def grant(self, req, n_tokens: int) -> bool:
        """Reserve KV for running ``req``'s next ``n_tokens`` (one for a decoder) and
        schedule them (``num_new_tokens``). False, with nothing changed, when the KV cache
        cannot hold them."""
        if self._ledger.alloc(req, n_tokens):
            req.num_new_tokens = n_tokens
            req.computed_tokens += n_tokens
            self._want = None
            return True
        self._want = (req, req.pi + n_tokens)
        return False

    def preempt(self, victim) -> int:
        """Recompute-preempt running ``victim``: it leaves the batch, loses its KV and goes
        back to the head of the wait queue (docs/kv-cache.md, "Preemption"). Returns the
        tokens it had been granted in this step. If it was the request whose grant just
        failed, it is alone in the batch, and it can never get the KV it needs, it is
        dropped as unservable instead (BLIS would recompute it forever)."""
        inst = self._inst
        self._ledger.remove(victim)
        log.debug("[tick %d] preemption: evicting %s to make room", inst.env.now, victim.id)
        inst.metrics.preemption_count += 1
        granted = victim.num_new_tokens
        victim.num_new_tokens = 0
        victim.state = ST_QUEUED
        self.kv.release(victim)
        self._reset_preempted(victim)
        want = self._want
        if (want is not None and want[0] is victim and not self.running
                and self._hopeless(victim, want[1])):
            self._drop_hopeless(victim)
        else:
            self.waitq.appendleft(victim)
        return granted

    # ------------------------------------------------------------------ admission
    def admit_head(self, chunk: Chunk, budget_tokens: int) -> int | None:
        """Admit the head of the wait queue: a prompt (or recompute) chunk of
        ``chunk(remaining, start, budget_tokens)`` tokens after its prefix-cache hit, or
        a PD decode sub-request's first decode slot. Returns the tokens it got, or None
        when the queue is empty or its head cannot be admitted now (the caller checks the
        running cap and the budget before calling)."""
        # async scheduling: requests queued after this step was chosen are not seen
        late = self._inst.admit_cutoff_us if self.limits.async_scheduling else None
        if self._offload:
            return self._admit_offload(chunk, budget_tokens, late)
        kv = self.kv
        bs = self.block_size
        waitq = self.waitq
        while waitq:
            nxt = waitq[0]
            if late is not None and nxt.enqueue_us > late:
                return None                   # queued after this step was chosen (async scheduling)
            if nxt.is_decode_sub and nxt.prefill_to == nxt.input_len:  # PD decode sub-request:
                # its prompt KV already held (or BLIS's restart: one token, then a prefill)
                if nxt.output_len == 0:       # nothing to decode: completes in this step
                    n = 0                     # (divergences.md P10; BLIS would crash)
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
                    return None
                waitq.popleft()
                self._admit(nxt, n, nxt.pi + n, decoding=bool(n) and nxt.pi >= nxt.input_len)
                return n
            cached = kv.get_cached_blocks(nxt)
            start = len(cached) * bs
            n = chunk(nxt.prefill_to - start, start, budget_tokens)
            if n is None:
                return None
            if not kv.allocate(nxt, start, start + n, cached):
                if self._no_room(nxt):
                    continue
                return None
            waitq.popleft()
            self._admit(nxt, n, start + n, decoding=False)
            return n
        return None

    def _admit_offload(self, chunk: Chunk, budget_tokens: int, late: int | None) -> int | None:
        """:meth:`admit_head` with a CPU tier that loads asynchronously (docs/kv-cache.md,
        "CPU offload (vLLM OffloadingConnector)"), as vLLM's scheduler treats a KV connector:
        a queued request waiting for its KV load is passed over (``WAITING_FOR_REMOTE_KVS``:
        it keeps its place and takes no budget); one whose load has landed is scheduled from
        its loaded prefix (the whole prompt loaded: its last token is recomputed); any other
        request's full prompt blocks past its GPU prefix hit are looked up on the CPU tier,
        and a hit starts their load (the request stays queued and the next one is looked at).
        ``late``: :meth:`admit_head`'s async-scheduling cutoff (None: none)."""
        kv = self.kv
        waitq = self.waitq
        now = self._inst.env.now
        i = 0
        while i < len(waitq):
            nxt = waitq[i]
            if late is not None and nxt.enqueue_us > late:
                return None                   # queued after this step was chosen (async scheduling)
            if kv.waiting_for_load(nxt, now):
                i += 1
                continue
            held = kv.loaded_tokens(nxt)
            if held is None:
                cached = kv.get_cached_blocks(nxt)
                start = len(cached) * self.block_size
                ext = kv.lookup(nxt, len(cached))
                if ext < 0:                   # its blocks are being loaded for another request
                    i += 1
                    continue
                if ext > 0:
                    if kv.start_load(nxt, cached, ext, now):
                        i += 1
                        continue
                    if self._no_room(nxt):
                        continue
                    return None
            else:
                start = min(held, nxt.prefill_to - 1)
            n = chunk(nxt.prefill_to - start, start, budget_tokens)
            if n is None:
                return None
            end = start + n
            if held is None:
                ok = kv.allocate(nxt, start, end, cached)
            else:
                ok = end <= held or kv.allocate(nxt, held, end)
            if not ok:
                if self._no_room(nxt):
                    continue
                return None
            del waitq[i]
            if held is not None:
                kv.resumed(nxt)
            self._admit(nxt, n, end, decoding=False)
            return n
        return None

    def _no_room(self, nxt) -> bool:
        """Queued ``nxt`` cannot get its KV blocks. True: look at the queue again (queued
        holders were released, or ``nxt`` was dropped because it is longer than the whole
        cache); False: admit nobody else in this step."""
        if not self.running and self._unblock_queue(nxt):
            return True
        if ceil_div(nxt.prefill_to, self.block_size) > self.kv.total_blocks:
            self.waitq.remove(nxt)            # a vllm recompute longer than the whole cache
            self.kv.release(nxt)
            self._drop_hopeless(nxt)
            return True
        return False

    def _admit(self, req, n: int, computed: int, *, decoding: bool) -> None:
        if self.limits.preemption_model == "blis" or not req.scheduled_step:
            req.scheduled_step = self._inst.step_count   # vllm: a re-admission keeps the first
        req.state = RUNNING
        req.num_new_tokens = n
        self._pos += 1
        req.batch_pos = self._pos
        req.computed_tokens = computed
        self._ledger.add(req, decoding)
        self.admitted.append(req)

    # ------------------------------------------------------------------ engine mechanics
    def _unblock_queue(self, head) -> bool:
        """The batch is empty and ``head`` cannot get KV because *queued* requests hold it
        (PD decode sub-requests with pre-allocated prompts, CPU-tier commits, landed CPU
        loads). Nothing running could ever free it — BLIS steps forever here — so
        recompute-preempt the last queued holder, as vLLM preempts; a request whose load is
        still in flight is left alone (it will run). Returns False if there is none."""
        kv = self.kv
        now = self._inst.env.now
        for r in reversed(self.waitq):
            if r is not head and r.kv_blocks and not (self._offload and kv.waiting_for_load(r, now)):
                log.debug("[tick %d] releasing the KV of queued %s to admit %s",
                          self._inst.env.now, r.id, head.id)
                kv.release(r)
                self._reset_preempted(r)
                self._inst.metrics.preemption_count += 1
                return True
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
            self._ledger.sync_last_emit(victim)
            victim.prefill_to = victim.pi + 1
        victim.pi = 0
        victim.computed_tokens = 0

    def _hopeless(self, req, need_tokens: int) -> bool:
        """Can ``req``, alone in the batch and unable to get KV, ever finish?

        Not if its sequence needs more blocks than the whole cache. Otherwise queued
        requests hold the blocks it needs (PD decode sub-requests, CPU-tier commits); BLIS
        re-queues it, which can succeed once — but if it ends up alone and stuck again
        with nothing finished on this instance in between, it would loop forever.
        """
        if ceil_div(need_tokens, self.block_size) > self.kv.total_blocks:
            return True
        m = self._inst.metrics
        progress = m.completed_requests + m.timed_out_requests + m.dropped_unservable
        stuck = self._stuck_at.get(req.id)
        self._stuck_at[req.id] = progress
        return stuck == progress

    def _drop_hopeless(self, req) -> None:
        """A request that can never get the KV it needs (see :meth:`_hopeless`) would be
        recomputed forever (BLIS livelocks here). It is dropped as unservable instead, like
        an enqueue-guard drop."""
        inst = self._inst
        tally.note(log, "dropped", f"it cannot get the KV blocks it needs on {inst.id} ({self.kv.total_blocks} "
                   "KV blocks in all) and would be recomputed forever", req.id)
        req.state = DROPPED
        met = inst.metrics
        met.dropped_unservable += 1
        for table in (met.registry, met.ttft, met.scheduling_delay):
            table.pop(req.id, None)
        inst.listener.on_request_done(inst, req, inst.env.now)
