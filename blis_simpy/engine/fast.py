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
the step's fresh blocks — takes a short path (:meth:`FastInstance._decode_tick`): the
ledger's own pure-decode tick (:meth:`LazyLedger.serve_uniform` — the KV slots of the
decoders whose slot opens or fills a block — then :meth:`LazyLedger.advance_uniform`), the
step time, the KV and per-step statistics. The engine class, its batching policy and its KV
cache each say in their own class body whether the short path is safe for them
(``short_path_safe``, not inherited: :attr:`~blis_simpy.plugins.Pluggable.own_claims`);
``--log debug`` says once per instance which path runs and why. Every step is
still timed by the latency model, and every per-request timestamp and ITL sample is the
same as with one event per step (the engines-agree tests and the conformance cases check
it); any other step runs the ordinary way. With a front end (docs/frontend.md) every step's
outputs reach it as an event at the step's end, so no step is inline any more (the short
path still serves pure-decode steps, one event each).
"""

from __future__ import annotations

import logging

from blis_simpy.engine.instance import Instance, _method_is
from blis_simpy.engine.lazy_ledger import LazyLedger
from blis_simpy.engine.limits import MAX_STEP_US, checked_step_us

log = logging.getLogger("blis_simpy.engine")


class FastInstance(Instance, name="fast"):
    """An engine instance whose decoding requests cost O(1) per step in the common case,
    with step coalescing (module docstring)."""

    ledger_class = LazyLedger
    coalesce_steps = True
    short_path_safe = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.decode_ticks = 0     # steps that took the pure-decode short path
        self._short_path: bool | None = None   # decided at the first step (_decide_paths)
        self._fuse = False        # pure-decode steps run back to back in one call
        self._decode_u = -1       # the decoder count _decode_us is made for ...
        self._decode_us = None    # ... its step time as a function of the decoders' pi sum

    def step(self, now_us: int) -> int | None:
        """One engine iteration at ``now_us`` — or a run of pure-decode steps starting there;
        returns the time of the next step, or None."""
        short = self._short_path
        if short is None:
            short = self._decide_paths()
        if short and not self.waitq and not self.observed and self.ledger.uniform_ready():
            return self._decode_tick(now_us)
        return super().step(now_us)

    def _decide_paths(self) -> bool:
        """Decide, at the first step (hooks and wrappers set before the run are in place),
        whether pure-decode steps take the short path and whether they run back to back;
        say which and why on the ``blis_simpy.engine`` logger at debug level, once."""
        why_not = [f"{what} {type(obj).__name__} does not claim short_path_safe"
                   for what, obj in (("engine class", self), ("batching policy", self.batching),
                                     ("KV cache", self.kv)) if not type(obj).short_path_safe]
        if self.lockstep is not None:
            why_not.append("a data-parallel lockstep group steps it")
        short = self._short_path = not why_not
        # go on with the next step in the same call only where the instance loop would run
        # it inline and call nothing in between: the built-in loop, no listener acting after
        # each event, no ``step`` overridden or wrapped (a wrapper sees one call per step)
        no_fuse = [why for why, bad in (
            ("the engine runs one event per step", not self.coalesce_steps),
            ("the instance loop is overridden", type(self)._steps is not FastInstance._steps),
            ("the listener acts after every step", not getattr(self.listener, "quiet_steps", False)),
            ("step is overridden or wrapped", not _method_is(self, "step", FastInstance)),
        ) if bad]
        self._fuse = short and not no_fuse
        if log.isEnabledFor(logging.DEBUG):
            if not short:
                log.debug("%s: every step the ordinary way (no pure-decode short path: %s)",
                          self.id, "; ".join(why_not))
            else:
                log.debug("%s: pure-decode steps take the short path, %s; timed by %s", self.id,
                          "back to back" if self._fuse else
                          f"one call each ({'; '.join(no_fuse)})", self._timing_source())
        return short

    def _timing_source(self) -> str:
        """What times the short path's steps (:meth:`_make_decode_us`), for the log."""
        if not _method_is(self, "step_time_us", Instance):
            return "the engine's step_time_us"
        if self._model_decode_fn() is not None:
            return f"the {type(self.latency).__name__} model's decode function"
        return f"the {type(self.latency).__name__} model's step_time_us"

    def _model_decode_fn(self):
        """The latency model's ``decode_step_fn`` when the model times the steps as it is:
        a built-in model, its ``step_time_us`` neither wrapped nor set on the object; else
        None (every step then goes through ``step_time_us``)."""
        lat = self.latency
        make = getattr(lat, "decode_step_fn", None)
        if (make is None or getattr(make, "__self__", None) is not lat
                or not getattr(type(lat), "_blis_builtin", False)
                or not _method_is(lat, "step_time_us", type(lat))):
            return None
        return make

    def _make_decode_us(self, u: int):
        """The step time (µs) of a pure-decode step of ``u`` decoders as a function of their
        summed ``pi``: the model's decode function when the engine's own :meth:`step_time_us`
        would just ask the model, else :meth:`step_time_us` (an override, a wrapper) on the
        ledger's batch view — it sees every step."""
        if _method_is(self, "step_time_us", Instance):
            make = self._model_decode_fn()
            fn = make(u, u) if make is not None else None
            if fn is not None:
                return fn
            timer = self.latency.step_time_us
        else:
            timer = self.step_time_us
        view = self.ledger.view
        return lambda pi_sum: timer(view())

    def _decode_tick(self, now_us: int) -> int:
        """Pure-decode steps from ``now_us`` (µs) that complete nobody; returns the end of
        the last one.

        Each is what :meth:`step` would do in such a step, through the ledger's own
        pure-decode tick (:meth:`LazyLedger.serve_uniform`, then
        :meth:`LazyLedger.advance_uniform`): the step statistics, the KV slots of the
        decoders whose slot opens or fills a block, the step time, the tick, the KV
        statistics (:meth:`_record_kv`). While the next step is again such a step and is
        due before every other event (what the instance loop would run inline next), it
        runs here too, without returning to the loop."""
        self._steps_scheduled -= 1
        ledger = self.ledger
        met = self.metrics
        env = self.env
        horizon = self.horizon_us
        u = ledger.u_count            # every running request decodes: fixed in the run
        if u != self._decode_u:
            self._decode_us = self._make_decode_us(u)
            self._decode_u = u
        decode_us = self._decode_us
        end_step = self.kv.end_step if self._offload else None
        frontend = self.frontend
        while True:
            self._touch(now_us)
            self.step_count += 1
            self.decode_ticks += 1
            met.running_len_sum += u
            met.step_samples += 1
            step_us = decode_us(ledger.serve_uniform())
            if step_us < 1 or step_us > MAX_STEP_US:
                step_us = checked_step_us(step_us, self.id, now_us)
            nxt = now_us + step_us
            self.step_start_us = now_us
            self.step_end_us = nxt
            ledger.advance_uniform(now_us, step_us)
            self._record_kv(step_us)
            if end_step is not None:
                end_step(now_us, nxt)     # the CPU tier stores the blocks this step filled
            self.step_pending = True
            if frontend is not None:      # its tokens go to the API server at its end (an
                frontend.step_done(nxt, ())   # event there: the next step is not inline)
            if not (self._fuse and nxt < env.peek() and nxt <= horizon
                    and ledger.uniform_ready()):
                return nxt
            env.advance_to(nxt)
            now_us = nxt
