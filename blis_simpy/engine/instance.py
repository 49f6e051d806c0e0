"""One simulated vLLM server: a SimPy process that runs engine steps (docs/engine.md).

The instance is a process running a fixed loop: wait on its doorbell until there is work,
then run steps back to back — one SimPy event per engine step — until the batch and the
wait queue are empty. Each step calls three overridable hooks:

* :meth:`form_batch` — batch formation by the instance's batching policy
  (:mod:`blis_simpy.engine.batching`; the built-in ``vllm`` policy by default);
* :meth:`step_time_us` — the step duration from the latency model;
* :meth:`on_step_end` — called with the requests that completed in the step.

The progress of the running requests is kept by a *ledger*
(:mod:`blis_simpy.engine.ledger`): this class uses the eager reference ledger,
:class:`~blis_simpy.engine.fast.FastInstance` the lazy one. Hooks, listeners and policies
see materialised request state under both: an instance whose :meth:`on_step_end` is
overridden or set on the object before the run (or whose listener sets
``wants_request_state``) has every running and completed request — ``pi``, ``kv_len``,
``num_new_tokens``, ``itl`` — brought up to date before its hooks run; the completion
rule is :func:`~blis_simpy.engine.ledger.completion_pi`.

A step is :meth:`begin_step` (reorder, form the batch, statistics, batch view), the
duration, then :meth:`finish_step` (execute, KV statistics, completions, on_step_end); the
lockstep group of a data-parallel MoE engine (:mod:`blis_simpy.engine.dp`) calls the two
phases of its ranks itself.

Requests reach the instance through :meth:`inject` (routing) and wait out the latency
model's queueing delay before the enqueue guards put them in the wait queue (the inbox: a
deque plus the doorbell). BLIS never cancels a scheduled step event; when a timeout empties
the running batch, the pending step becomes stale and still fires (docs/engine.md). That
behaviour is kept by letting the orphaned step chain carry on in its own process.

Time is an integer number of µs (``env.now``).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import ClassVar

from simpy.events import Event

from blis_simpy.des import QUEUED, STEP, TIMEOUT, SimEnv, instance_key, succeed_at
from blis_simpy.engine import tally
from blis_simpy.engine.batching import BatchingPolicy, StepAllocator
from blis_simpy.engine.ledger import EagerLedger
from blis_simpy.engine.limits import EngineLimits, checked_step_us, enqueue_refusal
from blis_simpy.engine.listener import InstanceListener
from blis_simpy.engine.scheduling import (
    PriorityPolicy,
    Scheduler,
    checked_priorities,
    checked_reorder,
)
from blis_simpy.engine.vllm_batching import VLLMBatching
from blis_simpy.latency.base import BatchView, LatencyModel
from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.plugins import Pluggable
from blis_simpy.request import COMPLETED, DROPPED, RUNNING, TIMED_OUT
from blis_simpy.units import ceil_div

log = logging.getLogger("blis_simpy.engine")


class Instance(Pluggable, family="engine implementation", name="reference"):
    """An engine instance: wait queue, running batch, KV cache, latency model, metrics.

    With data parallelism (``dp > 1``) an instance is one DP rank of an engine:
    ``dp_engine`` is that :class:`~blis_simpy.engine.dp.DPEngine` (its front door picks
    the rank for each request) and ``dp_rank`` the rank's position in it; ``lockstep`` is
    the engine's :class:`~blis_simpy.engine.dp.LockstepGroup` when the ranks step together
    (MoE models), in which case the rank never runs steps of its own.

    Engine implementations are a registry (``engine.implementation``): this class is
    ``reference``, :class:`~blis_simpy.engine.fast.FastInstance` is ``fast``; a subclass
    declared with ``name="..."`` is selectable by that name (docs/extending.md).
    """

    dp_engine = None     # the DPEngine this instance is a rank of (None: no DP)
    dp_rank = 0
    lockstep = None      # the LockstepGroup that steps this rank (None: it steps itself)
    #: how the progress of running requests is kept (eager: the literal reference)
    ledger_class = EagerLedger
    #: run a step inline, without a SimPy event, when no other event is due before it
    #: (the reference engine keeps one event per step; the order of events is the same)
    coalesce_steps = False
    own_claims = ("short_path_safe",)
    #: the class's own claim (a subclass that does not set it in its body gets False:
    #: :attr:`~blis_simpy.plugins.Pluggable.own_claims`): its overrides of the step hooks do
    #: nothing in a pure-decode step that the fast engine's short path leaves out — the
    #: short path calls :meth:`step`, :meth:`step_time_us` and :meth:`_record_kv` at every
    #: step, and stands in for the rest (docs/performance.md, "Step coalescing")
    short_path_safe: ClassVar[bool] = False

    def __init__(self, env: SimEnv, index: int, limits: EngineLimits, latency: LatencyModel,
                 kv, scheduler: Scheduler, priority: PriorityPolicy,
                 listener: InstanceListener | None = None, batching: BatchingPolicy | None = None):
        if limits.max_model_len > 0 and ceil_div(limits.max_model_len, kv.block_size) > kv.total_blocks:
            raise ValueError(
                f"max_model_len {limits.max_model_len} needs "
                f"{ceil_div(limits.max_model_len, kv.block_size)} KV blocks, "
                f"more than the {kv.total_blocks} available")
        self.env = env
        self.index = index
        self.id = f"instance_{index}"
        self.model = ""
        self.limits = limits
        self.latency = latency
        self.kv = kv
        self.scheduler = scheduler
        self.priority_policy = priority
        self.listener = listener or InstanceListener()
        self.metrics = InstanceMetrics(self.id)
        self.horizon_us = env.horizon_us
        self.key_queued = instance_key(index, QUEUED)
        self.key_step = instance_key(index, STEP)
        self.key_timeout = instance_key(index, TIMEOUT)
        self.otpt_us = latency.output_token_time_us()
        self.post_decode_us = latency.post_decode_us()

        self.waitq: deque = deque()
        self.ledger = ledger = self.ledger_class(self)
        self._hooked = type(self).on_step_end is not Instance.on_step_end
        #: vllm preemption: a re-admitted request keeps its first scheduling delay
        self._keep_first_schedule = limits.preemption_model == "vllm"
        self._step_holds = limits.step_model == "vllm"
        #: a CPU tier whose transfers run beside the steps (kv/offload.py)
        self._offload = kv.async_transfers
        self.running = ledger.running      # batch order; only the ledger changes it
        self.batching = batching if batching is not None else VLLMBatching()
        self.batching.bind(limits)
        self.allocator = StepAllocator(self, ledger, self.batching)
        self.step_pending = False
        self._steps_scheduled = 0   # Step events in the heap (stale ones included)
        self.step_count = 0
        self.clock_us = 0          # time of the last instance event (BLIS's instance clock)
        self.step_start_us = -1    # start and end of the last step timed (µs; -1 = none yet)
        self.step_end_us = -1
        #: end of a step that emptied the batch and still holds the engine (µs; see step())
        self.held_until_us = -1
        #: async scheduling: requests queued after this time are not admitted in the step
        #: being formed (µs; docs/engine.md, "Async scheduling")
        self.admit_cutoff_us = 0
        self.in_queueing_delay = 0  # injected, Queued event not yet processed (API server included)
        self.injected = 0
        #: the API server in front of the instance (engine/frontend.py), None: none
        self.frontend = None
        self._doorbell: Event | None = None
        self.process = env.process(self._run())

    # ================================================================= process structure
    def _run(self):
        """The instance process: sleep on the doorbell, then run a chain of steps."""
        # The process starts with the run: an ``on_step_end`` set on the instance object
        # before it (not only one overridden by a subclass) sees materialised request state
        # (``observed``).
        self._hooked = not _method_is(self, "on_step_end", Instance)
        while True:
            self._doorbell = Event(self.env)
            yield self._doorbell
            yield from self._steps()

    def _orphan_chain(self, first):
        """A second step chain, started while the main process still waits on a stale step."""
        yield first
        yield from self._steps()

    def _steps(self):
        """Run steps back to back. With :attr:`coalesce_steps`, a step due before every
        other event runs inline (no SimPy event: the clock just moves to its time,
        :meth:`~blis_simpy.des.SimEnv.advance_to`); otherwise it is a Wake event."""
        env = self.env
        inline = self.coalesce_steps
        while True:
            nxt = self.step(env.now)
            self.listener.on_event_end(self)
            if nxt is None:
                return
            self._steps_scheduled += 1
            if inline and env.due_before(nxt):
                env.advance_to(nxt)
                continue
            yield env.wake_at(nxt, self.key_step)

    def _push_step(self, t_us: int) -> None:
        """Schedule a Step at ``t_us`` that no running step pushed (starts a chain); a
        lockstep rank rings its group's doorbell instead."""
        if self.lockstep is not None:
            self.lockstep.ring(t_us)
            return
        self.step_pending = True
        self._steps_scheduled += 1
        bell = self._doorbell
        if bell is not None:
            self._doorbell = None
            succeed_at(bell, t_us, self.key_step)
        else:
            self.env.process(self._orphan_chain(self.env.wake_at(t_us, self.key_step)))

    def _touch(self, t_us: int) -> None:
        if t_us > self.clock_us and t_us <= self.horizon_us:
            self.clock_us = t_us

    # ================================================================= arrivals
    def inject(self, req, now_us: int) -> None:
        """Routing placed ``req`` here at ``now_us``: Arrival now, Queued after the delay —
        or, with a front end, after the front end has handed it to the engine
        (:meth:`enter_engine`)."""
        req.assigned_instance = self.id
        self.metrics.registry[req.id] = req
        self.injected += 1
        self.in_queueing_delay += 1
        self._touch(now_us)
        if self.frontend is not None:
            self.frontend.receive(req, now_us)
            return
        q = self.latency.queueing_time_us(req)
        self.env.call_at(now_us + q, self.key_queued, self._on_queued, req)

    def enter_engine(self, req, now_us: int) -> None:
        """The front end handed ``req`` to the engine at ``now_us`` (docs/frontend.md): Queued
        after the latency model's queueing delay, as an injected request without one."""
        self._touch(now_us)
        q = self.latency.queueing_time_us(req)
        self.env.call_at(now_us + q, self.key_queued, self._on_queued, req)

    def inject_decode(self, req, now_us: int) -> None:
        """A PD decode sub-request whose prompt KV was pre-allocated here (docs/disaggregation.md):
        straight into the wait queue — no queueing delay, no enqueue guards, its input not
        counted again — with its timeout, and a step if the instance is idle."""
        req.assigned_instance = self.id
        self.metrics.registry[req.id] = req
        self.injected += 1
        self._touch(now_us)
        if 0 < req.deadline_us <= now_us:    # its deadline passed during the transfer
            self.kv.release(req)              # (BLIS schedules a timeout in the past)
        self._admit_to_queue(req, now_us)
        if req.state != TIMED_OUT and not self.running and not self.step_pending:
            self._push_step(max(self.clock_us, now_us))

    def _on_queued(self, req) -> None:
        now_us = self.env.now
        self._touch(now_us)
        self.in_queueing_delay -= 1
        self.enqueue(req, now_us)
        if not self.step_pending and self.waitq:
            self._push_step(now_us)
        self.listener.on_event_end(self)

    def enqueue(self, req, now_us: int) -> None:
        """The enqueue guards (docs/engine.md, "Arrival and the enqueue guards"), then the wait queue."""
        if req.state == TIMED_OUT:
            return
        why = enqueue_refusal(req, self.limits, self.kv)
        if why is not None:
            return self._drop(req, now_us, why)
        self.metrics.total_input_tokens += req.input_len
        self._admit_to_queue(req, now_us)

    def _admit_to_queue(self, req, now_us: int) -> None:
        """Past its deadline: timed out now. Else into the wait queue with its Timeout."""
        if 0 < req.deadline_us <= now_us:
            req.state = TIMED_OUT
            self.metrics.timed_out_requests += 1
            self.listener.on_request_done(self, req, now_us)
            return
        req.enqueue_us = now_us
        self.waitq.append(req)
        if 0 < req.deadline_us <= self.horizon_us:
            self.env.call_at(req.deadline_us, self.key_timeout, self._on_timeout, req)

    def _drop(self, req, now_us: int, why: str) -> None:
        tally.note(log, "dropped", why, req.id)    # one line per cause at the end of the run
        req.state = DROPPED
        self.metrics.dropped_unservable += 1
        self.metrics.registry.pop(req.id, None)
        self.listener.on_request_done(self, req, now_us)

    # ================================================================= timeouts
    def _on_timeout(self, req) -> None:
        now_us = self.env.now
        self._touch(now_us)
        if req.state in (COMPLETED, TIMED_OUT, DROPPED):
            self.listener.on_event_end(self)
            return
        was_running = req.state == RUNNING
        req.state = TIMED_OUT
        self.metrics.timed_out_requests += 1
        if was_running:
            self.ledger.remove(req)         # materialised as it leaves, before its KV goes
        self.kv.release(req)
        if was_running:
            if not self.running and not self._step_holds:
                # BLIS: the scheduled step becomes stale (not cancelled) and the instance
                # idle, so work arriving before it fires starts a second chain. With the step
                # holding the engine (vLLM) it runs to its end and forms the next batch there.
                self.step_pending = False
        else:
            try:
                self.waitq.remove(req)
            except ValueError:
                pass
        if not self.running and not self.step_pending and self.waitq:
            self._push_step(now_us)
        self.listener.on_request_done(self, req, now_us)
        self.listener.on_event_end(self)

    # ================================================================= the step
    def step(self, now_us: int) -> int | None:
        """One engine iteration at ``now_us``; returns the time of the next step, or None."""
        self._touch(now_us)
        self._steps_scheduled -= 1
        if not self.running and not self.waitq:
            # A stale step: nothing to do. If no other step event is scheduled, nothing is
            # pending any more (BLIS keeps its stale pointer here, which would strand work
            # arriving later with no step to run it: INV-8).
            if self._steps_scheduled == 0:
                self.step_pending = False
            return None
        view = self.begin_step(now_us)
        if self._offload and not self.running:
            t = self.kv.next_load_done_us(now_us)
            if t is not None:
                # nothing runs while queued requests wait for their KV loads: vLLM's empty
                # steps poll until one lands; the next step is the one that sees it
                t = max(t, now_us + self.kv.consume_pending_transfer_latency())
                self._record_kv(t - now_us)
                self.step_pending = True
                return t
        step_us = self.step_time_us(view) + self.kv.consume_pending_transfer_latency()
        step_us = checked_step_us(step_us, self.id, now_us)
        self.finish_step(now_us, step_us)
        if self.running or self.waitq:
            self.step_pending = True
            return now_us + step_us
        if self._step_holds:
            # nothing is left to run, but the step holds the engine until it ends: a request
            # arriving meanwhile waits for its end (vLLM's engine core runs one step at a
            # time). The step at the end finds work or nothing; its batch is chosen then,
            # not when this step started (the engine was waiting for input).
            self.step_pending = True
            self.step_end_us = -1
            self.held_until_us = now_us + step_us
            return now_us + step_us
        self.step_pending = False
        return None

    def begin_step(self, now_us: int) -> BatchView:
        """First half of a step at ``now_us``: reorder the queue, form the batch, record the
        per-step statistics; returns the batch view the latency model will time.

        :meth:`step` calls it, then times the view, then :meth:`finish_step`; a lockstep
        group (:mod:`blis_simpy.engine.dp`) calls it on every busy rank before timing all
        the ranks' views together."""
        self.step_count += 1
        # async scheduling: a step that follows another at once was chosen when that one started
        self.admit_cutoff_us = self.step_start_us if self.step_end_us == now_us else now_us
        if self._offload:
            self.kv.advance(now_us)       # the CPU tier's transfers done by now take effect
        self.reorder_queue(now_us)
        scheduled = self.form_batch(now_us)
        met = self.metrics
        sd = met.scheduling_delay
        keep_first = self._keep_first_schedule
        for req in scheduled:
            if not (keep_first and req.id in sd):   # blis: a re-admission overwrites it
                sd[req.id] = now_us - req.origin_us
        met.waitq_len_sum += len(self.waitq)
        met.running_len_sum += len(self.running)
        met.step_samples += 1
        return self.batch_view()

    def finish_step(self, now_us: int, step_us: int) -> list:
        """Second half of a step begun at ``now_us`` that lasts ``step_us`` µs (≥ 1): execute the
        batch, record KV statistics, complete requests, call :meth:`on_step_end`. Returns
        the requests that completed."""
        running = self.running
        self.step_start_us = now_us
        self.step_end_us = now_us + step_us
        self.execute(now_us, step_us)
        self._record_kv(step_us)
        self.kv.mirror_to_cpu(running)
        if self._offload:
            self.kv.end_step(now_us, now_us + step_us)   # store the blocks this step filled
        completed = self.complete(now_us, step_us)
        self.on_step_end(now_us, step_us, completed)
        if self.frontend is not None:   # the step's outputs go to the API server at its end;
            self.frontend.step_done(now_us + step_us, completed)   # it forgets them later
        elif completed:
            self.ledger.forget(completed)
        return completed

    def _record_kv(self, step_us: int) -> None:
        """KV statistics of a step that lasted ``step_us`` µs: peak blocks, block-µs."""
        met = self.metrics
        used = self.kv.used
        if used > met.peak_kv_blocks:
            met.peak_kv_blocks = used
        met.kv_blocks_integral += used * step_us

    @property
    def observed(self) -> bool:
        """Do hooks need materialised request state (:meth:`on_step_end` overridden, or
        the listener's ``wants_request_state``)?"""
        return self._hooked or self.listener.wants_request_state

    def form_batch(self, now_us: int) -> list:
        """Hook: form the step's batch with the instance's batching policy
        (:mod:`blis_simpy.engine.batching`); returns the requests admitted in this step."""
        return self.allocator.form()

    def reorder_queue(self, now_us: int) -> None:
        """Recompute priorities of queued requests, then let the scheduler reorder."""
        if not self.waitq:
            return
        pol = self.priority_policy
        if not pol.constant:
            if pol._blis_builtin:
                for r in self.waitq:
                    r.priority = pol.priority(r, now_us)
            else:
                checked_priorities(pol, self.waitq, now_us)
        sched = self.scheduler
        if not sched.keeps_order:
            if sched._blis_builtin:
                sched.reorder(self.waitq, now_us)
            else:
                checked_reorder(sched, self.waitq, now_us)

    def batch_view(self) -> BatchView:
        """Summary of the running batch for the latency model (after batch formation)."""
        return self.ledger.view()

    def step_time_us(self, batch: BatchView) -> int:
        """Hook: the latency model's step duration (µs)."""
        return self.latency.step_time_us(batch)

    @property
    def busy_until_us(self) -> int:
        """When the engine's current (or last) step ends, µs: after it, with nothing queued
        or running, the instance does no more work (the autoscaler turns a drained one off
        then)."""
        return max(self.step_end_us, self.held_until_us)

    def on_step_end(self, now_us: int, step_us: int, completed: list) -> None:
        """Hook: called after completions are recorded."""

    # ---------------------------------------------------------------- execute
    def execute(self, now_us: int, step_us: int) -> None:
        """Advance every running request by its scheduled tokens (docs/engine.md, "The step"; the
        ledger's :meth:`~blis_simpy.engine.ledger.Ledger.execute`)."""
        self.ledger.execute(now_us, step_us)

    # ---------------------------------------------------------------- completion
    def complete(self, now_us: int, step_us: int) -> list:
        """The completion pass (docs/engine.md): the requests that emitted their last token
        (or reached MaxModelLen) leave the batch, in batch order; the rest keep running."""
        ledger = self.ledger
        done = ledger.complete()
        if self._hooked or self.listener.wants_request_state:   # self.observed, inlined
            ledger.materialise(done)
        if not done:
            return done
        kv = self.kv
        met = self.metrics
        for req in done:
            if req.length_capped:
                tally.note(log, "force-completed", f"reached MaxModelLen {self.limits.max_model_len}",
                           req.id)
                met.length_capped_requests += 1
            elif req.output_len > 0 and req.pi < req.input_len + req.output_len:
                if not kv.allocate(req, req.pi, req.pi + 1):
                    tally.note(log, "KV allocation failed for the final token of",   # non-fatal
                               "the request completes (counted as KV allocation failures)", req.id)
                    met.kv_allocation_failures += 1
            kv.release(req)
            self._record_completion(req, now_us, step_us)
        return done

    def _record_completion(self, req, now_us: int, step_us: int) -> None:
        met = self.metrics
        req.state = COMPLETED
        req.finished_step = self.step_count
        self._touch(now_us + step_us)          # the RequestLeft marker event
        itl_sum, n_itl, first_itl = self.ledger.itl_summary(req)
        if first_itl is not None:
            req.first_itl_us = first_itl
        n_out = req.output_len
        post = self.post_decode_us if n_out > 0 else 0
        e2e = req.ttft_us + itl_sum + post
        met.e2e[req.id] = e2e
        met.completion_time[req.id] = req.origin_us + e2e
        if n_out == 0:
            avg = 0.0
        elif req.length_capped:
            avg = itl_sum / max(n_itl - 1, 1)
        else:
            avg = itl_sum / max(n_out - 1, 1)
        met.itl[req.id] = avg
        met.completed_requests += 1
        met.step_counters_sum += req.finished_step - req.scheduled_step
        if self.frontend is None:       # else it leaves when the front end delivers it
            self.listener.on_request_done(self, req, now_us + step_us)

    # ================================================================= end of run
    def finalize(self) -> InstanceMetrics:
        """Fill the end-of-run fields (docs/determinism.md, "End of a run")."""
        met = self.metrics
        met.sim_ended_time = min(self.clock_us, self.horizon_us)
        met.still_queued = len(self.waitq)
        met.still_running = len(self.running)
        met.cache_hit_rate = self.kv.cache_hit_rate()
        met.kv_thrashing_rate = self.kv.kv_thrashing_rate()
        self.ledger.finalize(met)
        if self.frontend is not None:
            self.frontend.finalize(met)
        return met


def _method_is(obj, name: str, cls) -> bool:
    """Is ``obj.name`` the method ``cls`` defines (or inherits), not one set on the object or
    overridden by a subclass? (Read through the attribute, never ``obj.__dict__``: making
    an object's dict costs every later attribute access on it, docs/performance.md.)"""
    return getattr(getattr(obj, name, None), "__func__", None) is getattr(cls, name, None)
