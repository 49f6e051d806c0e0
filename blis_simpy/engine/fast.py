"""The production engine: :class:`~blis_simpy.engine.instance.Instance` with the lazy ledger.

:class:`FastInstance` runs the one instance loop with decoding requests advanced lazily
(:class:`~blis_simpy.engine.lazy_ledger.LazyLedger`): O(1) Python work per decoding
request per step in the common case instead of O(batch). Results are identical to the
reference engine's (:class:`~blis_simpy.engine.instance.Instance`, eager ledger), and so is
the request state every hook, listener and policy sees.

**Step coalescing.** A step due before every other event runs inline, without a SimPy
event (:attr:`~blis_simpy.engine.instance.Instance.coalesce_steps`), so a run of k steps
with nothing else due costs one event. Within such a run, a *pure-decode* step — every
running request decoding, nothing waiting, nobody completing, the KV cache able to supply
the step's fresh blocks — takes a short path (:meth:`FastInstance._decode_tick`) that does
only what such a step changes: the KV slots of the decoders whose slot opens or fills a
block, the step time, the ledger's tick arrays and the per-step statistics. Every step is
still timed by the latency model, and every per-request timestamp and ITL sample is the
same as with one event per step (the engines-agree tests and the conformance cases check
it); any other step runs the ordinary way. With a front end (docs/frontend.md) every step's
outputs reach it as an event at the step's end, so no step is inline any more (the short
path still serves pure-decode steps, one event each).
"""

from __future__ import annotations

from operator import attrgetter

from blis_simpy.engine.instance import Instance, _method_is
from blis_simpy.engine.lazy_ledger import LazyLedger
from blis_simpy.engine.limits import MAX_STEP_US, checked_step_us
from blis_simpy.engine.vllm_batching import VLLMBatching
from blis_simpy.kv.cache import KVCache
from blis_simpy.kv.offload import OffloadKVCache
from blis_simpy.latency.base import BatchView

_by_pos = attrgetter("batch_pos")
#: the step hooks the pure-decode short path stands in for: a subclass overriding any of
#: them keeps the ordinary step (its hook must run)
_WINDOW_HOOKS = ("step", "begin_step", "finish_step", "form_batch", "reorder_queue",
                 "batch_view", "step_time_us", "execute", "complete", "on_step_end", "_touch",
                 "_record_kv")


class FastInstance(Instance, name="fast"):
    """An engine instance whose decoding requests cost O(1) per step in the common case,
    with step coalescing (module docstring)."""

    ledger_class = LazyLedger
    coalesce_steps = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.decode_ticks = 0     # steps that took the pure-decode short path
        self._window_parts: bool | None = None    # known at the first step (_parts_allow)
        self._tick_parts: tuple | None = None     # made at the first short-path step
        self._decode_fn = None                    # the latency model's decode_step_fn ...
        self._decode_fn_u = -1                    # ... for this many decoders

    def step(self, now_us: int) -> int | None:
        """One engine iteration at ``now_us`` — or a decode window starting there; returns
        the time of the next step, or None."""
        parts = self._window_parts
        if parts is None:
            parts = self._window_parts = self._parts_allow()
        if parts and self._window_open():
            return self._decode_tick(now_us)
        return super().step(now_us)

    def _make_tick_parts(self) -> tuple:
        """What :meth:`_decode_tick` reads at every step, fixed for the run (made at its
        first call: the listener and any wrapper are in place by then)."""
        ledger, kv, lat = self.ledger, self.kv, self.latency
        # go on with the next step here only where the instance loop would run it inline and
        # call nothing in between: the built-in loop, no listener acting after each event, no
        # ``step`` wrapped on this object (a wrapper sees one call per step)
        more = bool(self.coalesce_steps and type(self)._steps is FastInstance._steps
                    and getattr(self.listener, "quiet_steps", False)
                    and _method_is(self, "step", FastInstance))
        # the model's decode_step_fn, only for a built-in model used as it is: not through a
        # wrapper (whose ``step_time_us`` must see every step) nor with a ``step_time_us`` set
        # on the object; None: every step goes through ``step_time_us``
        make = getattr(lat, "decode_step_fn", None)
        if (make is None or getattr(make, "__self__", None) is not lat
                or not getattr(type(lat), "_blis_builtin", False)
                or not _method_is(lat, "step_time_us", type(lat))):
            make = None
        return (ledger, self.metrics, kv, self.env, lat.step_time_us, ledger._entries,
                ledger.classes, ledger.comp_at, kv.block_size, kv.append_token, kv.total_blocks,
                self.horizon_us, self.id, ledger.otpt_us, ledger._boundary, more, make,
                kv.end_step if self._offload else None, self.frontend)

    def _parts_allow(self) -> bool:
        """What the short path assumes about the parts, checked at the first step so that
        hooks set on the objects before the run count too: the built-in vLLM batching (a
        pure-decode step serves every decoder one token), a KV cache with no transfer
        latency or CPU mirror (the vLLM offload tier is fine: a pure-decode step only stores
        the blocks it fills, which the short path does), the instance's own step hooks, on
        its class and on the object (``step`` itself may be wrapped there: the wrapper sees
        every call)."""
        kv = self.kv
        base = OffloadKVCache if type(kv) is OffloadKVCache else KVCache
        return (type(self.batching) is VLLMBatching
                and _method_is(kv, "consume_pending_transfer_latency", base)
                and _method_is(kv, "mirror_to_cpu", base)
                and all(_method_is(self, h, FastInstance) for h in _WINDOW_HOOKS if h != "step")
                and type(self).step is FastInstance.step)

    def _window_open(self) -> bool:
        """Is the next step a pure-decode step that completes nobody and gets its fresh
        blocks (what :meth:`_decode_tick` handles)?"""
        ledger = self.ledger
        return (not self.waitq and not ledger.prefilling and ledger.u_count
                and ledger.u_count == len(self.running) and self.lockstep is None
                and not self.observed
                and ledger.u_count <= self.limits.max_num_scheduled_tokens
                and ledger.T + 1 not in ledger.comp_at
                and len(ledger.classes[ledger.T % self.kv.block_size])
                <= self.kv.total_blocks - self.kv.used)

    def _decode_tick(self, now_us: int) -> int:
        """Pure-decode steps from ``now_us`` (µs) that complete nobody; returns the end of
        the last one.

        Each does exactly what :meth:`step` would — begin: the uniform service of
        :meth:`LazyLedger.serve_all` (only decoders whose slot opens or fills a block touch
        the KV cache) and the statistics; the step time from the latency model; finish: the
        ledger's execute, KV statistics and an empty completion pass — without the layers
        of hooks, batching policy and views a general step goes through. While the next
        step is again such a step and is due before every other event (what the instance
        loop would run inline next), it runs here too, without returning to the loop."""
        self._steps_scheduled -= 1
        k = self._tick_parts
        if k is None:
            k = self._tick_parts = self._make_tick_parts()
        (ledger, met, kv, env, step_time_us, entries, classes, comp_at, bs, append, total,
         horizon, inst_id, otpt_us, boundary, more, make, end_step, frontend) = k
        # every running request decodes (u of them, the batch size): fixed in the run
        u = ledger.u_count
        if u != self._decode_fn_u:           # the model's step as a function of the context
            self._decode_fn = make(u, u) if make is not None else None
            self._decode_fn_u = u
        decode_us = self._decode_fn
        # the ledger's per-step flags, the same at every such step
        ledger._skipped = []
        ledger._literal = False
        ledger._uniform = True
        ledger._finished_prefill = []
        ledger._joiners = []
        while True:
            if now_us > self.clock_us and now_us <= horizon:      # _touch
                self.clock_us = now_us
            self.step_count += 1
            self.decode_ticks += 1
            T = ledger.T                  # the uniform service (LazyLedger.serve_all)
            items = boundary(T)
            if len(items) > 1:
                items.sort(key=_by_pos)
            for r in items:
                d = T - r.g0
                if not append(r, r.pi + d, r.kv_len + d):  # pragma: no cover - checked
                    raise AssertionError(f"uniform step found no free block for {r.id}")
            met.running_len_sum += u
            met.step_samples += 1
            if decode_us is not None:
                step_us = decode_us(ledger.u_pi_off + u * T)
            else:
                step_us = step_time_us(BatchView(
                    decode_count=u, decode_tokens=u, decode_pi_sum=ledger.u_pi_off + u * T,
                    size=u, entries_fn=entries))
            if step_us < 1 or step_us > MAX_STEP_US:
                step_us = checked_step_us(step_us, inst_id, now_us)
            if end_step is not None:
                end_step(now_us, now_us + step_us)     # the CPU tier stores the filled blocks
            ledger.tick_end.append(now_us + step_us)    # execute: one token each, the tick
            met.total_output_tokens += u
            T += 1
            ledger.T = T
            cum = ledger.tick_cum
            cum.append(cum[-1] + step_us + otpt_us)
            ledger.cov.append(0)
            if T >= ledger._next_compact:
                ledger._compact()
            used = kv.used                                         # _record_kv
            if used > met.peak_kv_blocks:
                met.peak_kv_blocks = used
            met.kv_blocks_integral += used * step_us
            self.step_pending = True
            nxt = now_us + step_us
            if frontend is not None:      # its tokens go to the API server at its end (an
                frontend.step_done(nxt, ())   # event there: the next step is not inline)
            if not (more and nxt < env.peek() and nxt <= horizon
                    and T + 1 not in comp_at and len(classes[T % bs]) <= total - kv.used):
                # finish_step's record of the last step (async scheduling reads it; the steps
                # run inline before it have no reader in between)
                self.step_start_us = now_us
                self.step_end_us = nxt
                return nxt
            env.advance_to(nxt)
            now_us = nxt

