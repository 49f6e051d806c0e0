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
it); any other step runs the ordinary way.
"""

from __future__ import annotations

from operator import attrgetter

from blis_simpy.engine.instance import Instance
from blis_simpy.engine.lazy_ledger import LazyLedger
from blis_simpy.engine.limits import MAX_STEP_US, checked_step_us
from blis_simpy.engine.vllm_batching import VLLMBatching
from blis_simpy.kv.cache import KVCache
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
        cls = type(self)
        kv = self.kv
        # What a window assumes about the parts: the built-in vLLM batching (a pure-decode
        # step serves every decoder one token), a KV cache with no transfer latency or CPU
        # mirror, the instance's own step hooks, and no lockstep group.
        self._window_parts = (
            type(self.batching) is VLLMBatching
            and type(kv).consume_pending_transfer_latency is KVCache.consume_pending_transfer_latency
            and type(kv).mirror_to_cpu is KVCache.mirror_to_cpu
            and all(getattr(cls, h) is getattr(FastInstance, h) for h in _WINDOW_HOOKS
                    if h != "step")
            and cls.step is FastInstance.step)
        # Back-to-back pure-decode steps in one call stand in for the instance loop between
        # them: only with the built-in one.
        self._fuse_parts = cls._steps is FastInstance._steps

    def step(self, now_us: int) -> int | None:
        """One engine iteration at ``now_us`` — or a decode window starting there; returns
        the time of the next step, or None."""
        if self._window_parts and self._window_open():
            return self._decode_tick(now_us)
        return super().step(now_us)

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
        ledger, met, kv, env, lat = self.ledger, self.metrics, self.kv, self.env, self.latency
        n_run = len(self.running)            # the batch and its decoders: fixed in the run
        u = ledger.u_count
        # a built-in model's step time as a function of the context, else a call per step
        decode_us = _decode_step_fn(lat, n_run, u)
        step_time_us, entries = lat.step_time_us, ledger._entries
        classes, comp_at, bs = ledger.classes, ledger.comp_at, kv.block_size
        append, total = kv.append_token, kv.total_blocks
        horizon, inst_id = self.horizon_us, self.id
        # go on here only where the instance loop would run the next step inline and call
        # nothing in between: no listener acting after each event, no ``step`` wrapped on
        # this object (a wrapper sees one call per step)
        more = (self.coalesce_steps and self._fuse_parts
                and getattr(self.listener, "quiet_steps", False) and "step" not in self.__dict__)
        otpt_us = ledger.otpt_us
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
            items = list(classes[T % bs])
            if bs > 1:
                fill = classes[(T + 1) % bs]
                if fill:
                    items.extend(fill)
            if len(items) > 1:
                items.sort(key=_by_pos)
            for r in items:
                d = T - r.g0
                if not append(r, r.pi + d, r.kv_len + d):  # pragma: no cover - checked
                    raise AssertionError(f"uniform step found no free block for {r.id}")
            met.running_len_sum += n_run
            met.step_samples += 1
            if decode_us is not None:
                step_us = decode_us(ledger.u_pi_off + u * T)
            else:
                step_us = step_time_us(BatchView(
                    decode_count=u, decode_tokens=u, decode_pi_sum=ledger.u_pi_off + u * T,
                    size=n_run, entries_fn=entries))
            if step_us < 1 or step_us > MAX_STEP_US:
                step_us = checked_step_us(step_us, inst_id, now_us)
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
            if not (more and nxt < env.peek() and nxt <= horizon
                    and T + 1 not in comp_at and len(classes[T % bs]) <= total - kv.used):
                return nxt
            env.advance_to(nxt)
            now_us = nxt


def _decode_step_fn(lat, size: int, count: int):
    """The latency model's pure-decode step as a function of the context
    (:meth:`~blis_simpy.latency.base.LatencyModel.decode_step_fn`), or None: only for a
    built-in model used as it is, not through a wrapper (whose ``step_time_us`` must see
    every step) nor with a ``step_time_us`` set on the object."""
    make = getattr(lat, "decode_step_fn", None)
    if (make is None or getattr(make, "__self__", None) is not lat
            or not getattr(type(lat), "_blis_builtin", False)
            or "step_time_us" in getattr(lat, "__dict__", ())):
        return None
    return make(size, count)
