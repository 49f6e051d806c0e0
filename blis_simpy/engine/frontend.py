"""vLLM's API server in front of one instance: a SimPy process with one CPU (docs/frontend.md).

vLLM v1 serves a model with two kinds of process: the *engine core*, which schedules and
runs the steps (our :class:`~blis_simpy.engine.instance.Instance`), and the *API server*, an
asyncio process that renders and tokenizes each incoming request and hands it to the engine
core (``vllm/entrypoints/openai/serving_chat.py``, ``vllm/v1/engine/async_llm.py``
``add_request``), and whose ``output_handler`` loop takes every engine step's outputs,
detokenizes them and writes the stream chunks (``vllm/v1/engine/async_llm.py``
``output_handler``, ``vllm/v1/engine/output_processor.py`` ``process_outputs``). All of that
runs on one CPU thread, so it queues under load.

:class:`FrontEnd` is that process: one worker holding one CPU, serving a FIFO of work (a
:class:`~blis_simpy.des.Mailbox`) in arrival order, at the front-end event key
(:data:`~blis_simpy.des.FRONTEND`: after the cluster's events at the same time, before the
instances'). Its work, with the costs of a
:class:`~blis_simpy.latency.frontend.FrontendParams` (µs):

* an incoming request, ``network_us`` after routing placed it: ``request_us +
  input_token_us × prompt tokens``; when done, the request enters the engine
  (:meth:`Instance.enter_engine`: the latency model's queueing delay, then the wait queue);
* the outputs of an engine step that emitted tokens, completed requests or recorded a TTFT,
  at the end of that step: ``step_output_us + output_token_us × tokens``; when done, the tokens reach the
  client ``network_us`` later. A request that completed in the step leaves the instance
  then: the cluster's :meth:`~blis_simpy.engine.listener.InstanceListener.on_request_done`
  (in-flight counts, closed-loop sessions, PD hand-offs) is told at that time.

**Where latencies are measured** (``metrics.measured_at``). ``server``: the engine's figures,
with the request's ``origin_us`` moved to the moment the front end hands it to the engine.
``client``: from the request's arrival (the client's send) to the delivery of each token to
the client; the instance's TTFT, E2E, mean-ITL maps and ITL histogram then hold these (the
engine's own values never stay in them). Both modes add the latency model's OTPT to TTFT and
to every ITL sample and its post-decode overhead to E2E, as BLIS does, so the two agree when
the front end takes no time. To follow every token of every request, a ``client`` front end
counts every running request's tokens after every step (O(batch) per step; the ledger's
:meth:`~blis_simpy.engine.ledger.Ledger.samples`, without materialising anything).

Times are integer µs.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain

from blis_simpy.des import FRONTEND, Mailbox
from blis_simpy.latency.frontend import FrontendParams
from blis_simpy.request import DROPPED, TIMED_OUT


class _Stream:
    """What the client has received of one request (``client`` measurement): times are the
    client's receipt, µs."""

    __slots__ = ("seen", "first_us", "last_us", "ttft_us", "engine_ttft_us", "samples")

    def __init__(self):
        self.seen = 0           # tokens the engine emitted for it, as counted so far
        self.engine_ttft_us = None  # the engine's latest TTFT of it (a new one: recorded again)
        self.first_us = -1      # its first token reached the client (-1: not yet)
        self.last_us = 0        # its latest token reached the client
        self.ttft_us = None     # client TTFT written to the instance's map
        self.samples = []       # client ITL samples, µs


class FrontEnd:
    """The API server of ``inst`` (module docstring): one CPU serving its work in order.

    ``client``: measure latencies at the client (``metrics.measured_at: client``).
    ``busy_us`` is the CPU time spent, ``undelivered`` the requests the engine completed whose
    last token has not reached the client yet.
    """

    def __init__(self, env, inst, params: FrontendParams, *, client: bool = False):
        self.env = env
        self.inst = inst
        self.params = params
        self.client = client
        self.key = FRONTEND
        self.queue = Mailbox(env, self.key)
        self.network_us = params.network_delay_us
        self.busy_us = 0
        self.undelivered = 0
        self._tokens = 0                      # tokens of the instance charged so far
        self._streams: dict = {}              # request -> _Stream (client)
        self._ttft_sum = 0                    # Σ client TTFT written (client)
        self._ttft_records = 0                # the ledger's TTFT records seen
        self._itls: Counter = Counter()       # client ITL samples of delivered requests
        inst.frontend = self
        self.process = env.process(self._serve())

    # ------------------------------------------------------------------ the CPU
    def _serve(self):
        """The worker: take the oldest piece of work, hold the CPU for its cost, finish it."""
        env = self.env
        get = self.queue.get
        key = self.key
        while True:
            cost_us, done, arg = yield get()
            if cost_us > 0:
                self.busy_us += cost_us
                yield env.wake_at(env.now + cost_us, key)
            done(arg)

    # ------------------------------------------------------------------ requests in
    def receive(self, req, now_us: int) -> None:
        """Routing placed ``req`` on the instance at ``now_us``: it reaches the API server
        ``network_us`` later and waits for the CPU."""
        work = (self.params.input_cost_us(req.input_len), self._hand_over, req)
        if self.network_us:
            self.queue.put_at(now_us + self.network_us, work)
        else:
            self.queue.deliver(work)

    def _hand_over(self, req) -> None:
        now_us = self.env.now
        if not self.client:
            req.origin_us = now_us        # the server's clock starts when the engine has it
        self.inst.enter_engine(req, now_us)

    # ------------------------------------------------------------------ outputs
    def step_done(self, end_us: int, completed) -> None:
        """An engine step of the instance ended at ``end_us``; ``completed`` are the requests
        it completed. Its outputs reach the API server then: one piece of work, costed by the
        tokens the step emitted (the instance's counters tell how many), when it emitted a
        token, completed a request or recorded a TTFT (BLIS records one again for a decoder
        skipped at the end of its prompt: the client's is then taken again)."""
        inst = self.inst
        ledger = inst.ledger
        n = inst.metrics.total_output_tokens + ledger.first_tokens
        tokens = n - self._tokens
        self._tokens = n
        recorded = ledger.ttft_records - self._ttft_records   # TTFTs the engine wrote now
        self._ttft_records = ledger.ttft_records
        emitted = self._claim(completed, recorded) if self.client else ()
        if not (tokens or completed or recorded):
            return                              # nothing to send to anybody
        self.undelivered += len(completed)
        work = (self.params.output_cost_us(tokens), self._deliver, (emitted, completed))
        self.queue.put_at(end_us, work)

    def _deliver(self, item) -> None:
        """The step's outputs are written: its tokens reach the clients ``network_us`` later;
        its completed requests leave the instance then."""
        emitted, completed = item
        inst = self.inst
        at_us = self.env.now + self.network_us
        if emitted:
            self._receive_tokens(emitted, at_us)
        if not completed:
            return
        listener = inst.listener
        for req in completed:
            self.undelivered -= 1
            if self.client:
                self._record_client(req, at_us)
            listener.on_request_done(inst, req, at_us)
        inst.ledger.forget(completed)       # what the engine keeps of them until they leave
        listener.on_event_end(inst)

    # ------------------------------------------------------------------ client figures
    def _claim(self, completed, recorded: int) -> list:
        """After a step (``client``): which requests emitted how many tokens — ``ttft_set``
        and their ITL samples (:meth:`Ledger.samples`) counted against what was seen — and
        which recorded their TTFT again (BLIS does for a decoder skipped at the end of its
        prompt, and for a prompt regenerated after a ``blis`` preemption: the client's TTFT
        is then taken again, when this step's outputs reach it). The engine's own TTFT,
        E2E, mean ITL and completion time are taken back out of the instance's maps (the
        client's replace them as tokens are delivered). ``recorded``: how many TTFTs the
        engine recorded in the step."""
        inst = self.inst
        met = inst.metrics
        ttft = met.ttft
        streams = self._streams
        samples = inst.ledger.samples
        firsts = 0
        emitted = []
        for req in chain(inst.running, completed):
            count = samples(req) + 1 if req.ttft_set else samples(req)
            st = streams.get(req)
            if st is None:
                if not count:
                    continue
                st = streams[req] = _Stream()
                if req.ttft_set:              # its first token, in this step
                    ttft.pop(req.id, None)
                    st.engine_ttft_us = req.ttft_us
                    firsts += 1
            if count > st.seen:
                emitted.append((req, st, count - st.seen, False))
                st.seen = count
        if recorded > firsts:                 # some recorded their TTFT again
            for req in chain(inst.running, completed):
                st = streams.get(req)
                if st is None or not req.ttft_set or req.ttft_us == st.engine_ttft_us:
                    continue
                st.engine_ttft_us = req.ttft_us
                emitted.append((req, st, 0, True))
                if st.ttft_us is None:
                    ttft.pop(req.id, None)
                else:
                    ttft[req.id] = st.ttft_us
        for req in completed:
            rid = req.id
            met.e2e.pop(rid, None)
            met.itl.pop(rid, None)
            met.completion_time.pop(rid, None)
        return emitted

    def _receive_tokens(self, emitted, at_us: int) -> None:
        """``emitted`` tokens reached the client at ``at_us`` (a request aborted meanwhile —
        timed out or dropped — gets nothing: vLLM's output processor ignores its outputs)."""
        otpt = self.inst.otpt_us
        for req, st, k, again in emitted:
            state = req.state
            if state == TIMED_OUT or state == DROPPED:
                self._streams.pop(req, None)
                continue
            if st.first_us < 0 or again:
                self._first_token(req, st, at_us)
                k -= 1
            if k > 0:                       # its ITL sample: the gap since its last token
                st.samples.append(at_us - st.last_us + otpt)
                if k > 1:                   # more tokens in the same step: no gap
                    st.samples.extend([otpt] * (k - 1))
            st.last_us = at_us

    def _first_token(self, req, st: _Stream, at_us: int) -> None:
        """``req``'s first token reached the client at ``at_us`` (or its TTFT was recorded
        again, see :meth:`_claim`): its client TTFT."""
        st.first_us = st.last_us = at_us
        t = at_us + self.inst.otpt_us - req.arrival_us
        if st.ttft_us is not None:
            self._ttft_sum -= st.ttft_us
        st.ttft_us = t
        self.inst.metrics.ttft[req.id] = t
        self._ttft_sum += t

    def _record_client(self, req, at_us: int) -> None:
        """``req``'s last token reached the client at ``at_us``: its client E2E (TTFT + the
        ITL samples + the post-decode overhead), mean ITL and completion time, as the
        engine computes its own (docs/frontend.md)."""
        met = self.inst.metrics
        st = self._streams.pop(req, None)
        if st is None:                      # it completed without a token counted
            st = _Stream()
        if st.first_us < 0:
            self._first_token(req, st, at_us)
        samples = st.samples
        itl_sum = sum(samples)
        n_out = req.output_len
        e2e = st.ttft_us + itl_sum + (self.inst.post_decode_us if n_out > 0 else 0)
        rid = req.id
        met.e2e[rid] = e2e
        met.completion_time[rid] = req.arrival_us + e2e
        met.itl[rid] = itl_sum / max(len(samples), 1) if n_out > 0 else 0.0
        self._itls.update(samples)

    def finalize(self, met) -> None:
        """End of run (``client``): the instance's ITL histogram and TTFT sum are the
        client's; a first token not delivered by then has no TTFT."""
        if not self.client:
            return
        met.all_itls = Counter(self._itls)
        met.ttft_sum = self._ttft_sum
