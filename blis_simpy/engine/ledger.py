"""The decode ledger: where an instance keeps the progress of its running requests.

An :class:`~blis_simpy.engine.instance.Instance` runs one loop; what differs between the
reference engine and the production one is only *how* the progress of running requests
(``pi``, ``kv_len``, ITL samples) is kept. That is a ledger, behind one small interface:

* :class:`EagerLedger` (``reference``): every running request is advanced one by one in
  every step, literally as docs/engine.md describes it;
* :class:`~blis_simpy.engine.lazy_ledger.LazyLedger` (``fast``): decoding requests are
  advanced lazily, O(1) per step in the common case.

Both give identical results (tests/engine/test_fast_vs_reference.py). Whatever a hook,
listener or policy can see is materialised first: the batching policy gets the running
requests through :meth:`Ledger.batch` (materialised); requests leaving the batch
(completed, timed out, preempted) are materialised as they leave; and when the instance
is observed (``Instance.on_step_end`` overridden, or a listener asking for request state)
:meth:`Ledger.materialise` brings every running request — ITL samples included — up to
date before the hooks run.

The completion rule (when a request has emitted its last token, or reached MaxModelLen)
lives here, once: :func:`completion_pi`.

Times are integer µs; token positions (``pi``) count tokens.
"""

from __future__ import annotations

from typing import ClassVar

from blis_simpy.latency.base import BatchView


def last_token_pi(req) -> int:
    """The ``pi`` at which ``req`` has emitted its last output token: input + max(L, 1) − 1
    (docs/engine.md, "Progress and completion"; a request with no output completes when its
    prompt is done)."""
    n_out = req.output_len
    return req.input_len + (n_out if n_out > 1 else 1) - 1


def completion_pi(req, max_model_len: int) -> int:
    """The smallest ``pi`` at which ``req`` completes: its last token
    (:func:`last_token_pi`) or, with a MaxModelLen cap ``M`` > 0, position M − 1, whichever
    comes first. Completing before its last token means it was length-capped."""
    t = last_token_pi(req)
    if max_model_len > 0 and max_model_len - 1 < t:
        return max_model_len - 1
    return t


def split_completed(reqs, max_model_len: int) -> tuple[list, list]:
    """Split ``reqs`` (kept in order) into those that complete at their current ``pi`` —
    with ``length_capped`` set when they stop short of their last token — and the rest."""
    done = []
    rest = []
    for req in reqs:
        if req.pi >= completion_pi(req, max_model_len):
            req.length_capped = req.pi < last_token_pi(req)
            done.append(req)
        else:
            rest.append(req)
    return done, rest


class Ledger:
    """The interface between the instance loop and the progress of its running requests.

    ``running`` is the instance's running batch in batch order (the instance exposes the
    same object as ``Instance.running``; only the ledger changes it).
    """

    #: the engine kind this ledger implements (``engine.implementation``)
    kind: ClassVar[str] = ""

    def __init__(self, inst):
        self.inst = inst
        self.kv = inst.kv
        self.metrics = inst.metrics
        self.limits = inst.limits
        self.otpt_us = inst.otpt_us
        #: first output tokens emitted (a prompt's prefill done), not counting a TTFT
        #: recorded again (``total_output_tokens`` counts the later tokens); the front end
        #: charges each token a step emits (docs/frontend.md)
        self.first_tokens = 0
        #: TTFTs recorded (:meth:`_first_token` calls, first tokens and records again)
        self.ttft_records = 0

    # ------------------------------------------------------------------ membership
    def add(self, req, decoding: bool) -> None:
        """``req`` was admitted (its fields set); ``decoding``: a PD decode sub-request
        admitted with its first decode slot, else a prefill (or a 0-token admission)."""
        raise NotImplementedError

    def remove(self, req) -> None:
        """``req`` leaves the running batch (timed out, preempted), materialised first."""
        raise NotImplementedError

    # ------------------------------------------------------------------ batch formation
    def start_batching(self) -> None:
        """A step's batch formation begins."""

    def serve_all(self, chunk, budget_tokens: int) -> int | None:
        """Serve every running request at once if the step is uniform — every prefilling
        request its chunk ``chunk(remaining, pi, budget_tokens)``, every decoding one one
        token, within ``budget_tokens`` and the free KV blocks. Returns the budget left, or
        None (nothing changed) when the ledger does not do it or the step does not fit."""
        return None

    def batch(self) -> list:
        """The running requests in batch order, materialised, as a new list."""
        return list(self.running)

    def alloc(self, req, n_tokens: int) -> bool:
        """Reserve KV for the next ``n_tokens`` of running ``req`` (all or nothing)."""
        return self.kv.allocate(req, req.pi, req.pi + n_tokens)

    def end_batching(self) -> None:
        """Batch formation of the step is over (the policy and admissions are done)."""

    def samples(self, req) -> int:
        """How many ITL samples ``req`` has so far — one per output token after its first —
        whether or not its ``itl`` list is materialised."""
        return len(req.itl)

    def sync_last_emit(self, req) -> None:
        """Make ``req.last_emit_us`` (end µs of the step that emitted its latest token)
        current; the eager ledger keeps it current all the time."""

    # ------------------------------------------------------------------ the step
    def view(self) -> BatchView:
        """The batch the latency model times (after batch formation)."""
        return BatchView.of(self.running)

    def execute(self, now_us: int, step_us: int) -> None:
        """Advance every running request by its scheduled tokens (docs/engine.md, "The step")."""
        raise NotImplementedError

    def complete(self) -> list:
        """Take the requests that completed in this step out of the running batch and return
        them in batch order, materialised, with ``length_capped`` set (docs/engine.md)."""
        raise NotImplementedError

    def itl_summary(self, req) -> tuple[int, int, int | None]:
        """A completed request's ITL samples: (sum µs, count, first sample or None); adds
        them to the instance's ITL histogram."""
        raise NotImplementedError

    def materialise(self, extra=()) -> None:
        """Bring every running request and the requests of ``extra`` up to date (``pi``,
        ``kv_len``, ``computed_tokens``, ``num_new_tokens`` and the ``itl`` list)."""

    def forget(self, completed: list) -> None:
        """The step's hooks have seen ``completed``: drop what is no longer needed."""

    def finalize(self, met) -> None:
        """End of run: spell out what the instance's metrics need."""

    # ------------------------------------------------------------------ shared pieces
    def _first_token(self, req, first_token_end_us: int) -> None:
        """``req`` emitted its first token (TTFT = its end + OTPT − ``origin_us``, the
        request's arrival unless a front end says otherwise)."""
        req.ttft_set = True
        self.ttft_records += 1
        ttft = first_token_end_us - req.origin_us
        req.ttft_us = ttft
        met = self.metrics
        met.ttft_sum += ttft
        met.ttft[req.id] = ttft

    def _recompute_done(self, req, end_us: int) -> int:
        """A vLLM recompute reached its end: the next output token is emitted at ``end_us``;
        returns its ITL sample: the gap since the previous token (``last_emit_us``, made
        current when it was preempted) plus OTPT."""
        self.metrics.total_output_tokens += 1
        req.prefill_to = req.input_len
        return end_us - req.last_emit_us + self.otpt_us


class EagerLedger(Ledger):
    """The reference ledger: every running request is advanced in every step."""

    kind = "reference"

    def __init__(self, inst):
        super().__init__(inst)
        self.running: list = []

    def add(self, req, decoding: bool) -> None:
        self.running.append(req)

    def remove(self, req) -> None:
        running = self.running
        if running and running[-1] is req:
            running.pop()
        else:
            running.remove(req)

    def start_batching(self) -> None:
        for r in self.running:
            r.num_new_tokens = 0

    def execute(self, now_us: int, step_us: int) -> None:
        """A prefill that completes the prompt emits the first token (TTFT); one that
        completes a vLLM recompute (``prefill_to`` beyond the prompt) emits the next output
        token, whose ITL sample is the gap since the request's previous token (plus OTPT,
        as every sample). A decode step emits one token. A decoder that got no token while
        at the end of its prompt records its TTFT again (BLIS's Execute does)."""
        met = self.metrics
        itl_val = step_us + self.otpt_us
        end = now_us + step_us
        first_tok = end + self.otpt_us
        for req in self.running:
            n_in = req.input_len
            pi = req.pi
            if pi < req.prefill_to:
                pi = req.pi = req.computed_tokens
                if pi != req.prefill_to:
                    continue
                if pi > n_in:                 # a recompute done: its next output token
                    req.itl.append(self._recompute_done(req, end))
                    req.last_emit_us = end
                    continue
                self.first_tokens += 1          # a prompt done: its first token
            elif req.num_new_tokens > 0:
                req.pi = pi + 1
                met.total_output_tokens += 1
                req.itl.append(itl_val)
                req.last_emit_us = end
                continue
            elif pi != n_in:
                continue
            elif req in self.inst.allocator.admitted:   # admitted with nothing to prefill
                self.first_tokens += 1          # (an empty prompt): a first token, as a prefill
            self._first_token(req, first_tok)
            req.last_emit_us = end

    def complete(self) -> list:
        done, remaining = split_completed(self.running, self.limits.max_model_len)
        if done:
            self.running[:] = remaining
        return done

    def itl_summary(self, req) -> tuple[int, int, int | None]:
        itl = req.itl
        hist = self.metrics.all_itls
        for v in itl:
            hist[v] += 1
        return sum(itl), len(itl), (itl[0] if itl else None)
