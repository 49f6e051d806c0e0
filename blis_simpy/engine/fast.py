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

from blis_simpy.engine.instance import Instance
from blis_simpy.engine.lazy_ledger import LazyLedger
from blis_simpy.engine.limits import checked_step_us
from blis_simpy.engine.vllm_batching import VLLMBatching
from blis_simpy.kv.cache import KVCache
from blis_simpy.latency.base import BatchView

#: the step hooks the pure-decode short path stands in for: a subclass overriding any of
#: them keeps the ordinary step (its hook must run)
_WINDOW_HOOKS = ("step", "begin_step", "finish_step", "form_batch", "reorder_queue",
                 "batch_view", "step_time_us", "execute", "complete", "on_step_end")


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
        """A pure-decode step at ``now_us`` (µs) that completes nobody; returns its end.

        It does exactly what :meth:`step` would — begin: the uniform service of
        :meth:`LazyLedger.serve_all` (only decoders whose slot opens or fills a block touch
        the KV cache) and the statistics; the step time from the latency model; finish: the
        ledger's execute, KV statistics and an empty completion pass — without the layers
        of hooks, batching policy and views a general step goes through."""
        self._touch(now_us)
        self._steps_scheduled -= 1
        self.step_count += 1
        self.decode_ticks += 1
        ledger = self.ledger
        met = self.metrics
        ledger.serve_decoders()
        u = ledger.u_count
        n_run = len(self.running)
        met.running_len_sum += n_run
        met.step_samples += 1
        step_us = checked_step_us(self.latency.step_time_us(BatchView(
            decode_count=u, decode_tokens=u, decode_pi_sum=ledger.u_pi_off + u * ledger.T,
            size=n_run, entries_fn=ledger._entries)), self.id, now_us)
        ledger.finish_decoders(now_us, step_us)
        self._record_kv(step_us)
        self.step_pending = True
        return now_us + step_us
