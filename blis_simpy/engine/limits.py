"""An instance's batch limits and the enqueue guards that apply them (docs/engine.md).

:class:`EngineLimits` holds the per-instance limits (token counts in tokens, 0 disables);
:func:`enqueue_refusal` is the guard pass a request goes through when its queueing delay
ends, before it enters the wait queue (docs/engine.md, "Arrival and the enqueue guards").
"""

from __future__ import annotations

from dataclasses import dataclass

from blis_simpy.errors import ConfigError
from blis_simpy.units import ceil_div

#: recompute-preemption models: vLLM v1's (default) and BLIS's (parity); docs/kv-cache.md
PREEMPTION_MODELS = ("vllm", "blis")
#: what a step whose requests all finish does to its instance (:attr:`EngineLimits.step_model`)
STEP_MODELS = ("vllm", "blis")

#: The longest engine step, µs: one hour of simulated time (docs/scenarios.md, "Limits").
#: With every step and delay at most this long the integer-µs clock stays inside int64 for
#: billions of steps, so both engines end every run the same way.
MAX_STEP_US = 3_600_000_000


def checked_step_us(step_us: int, inst_id: str, now_us: int) -> int:
    """A step's duration as the engine uses it: at least 1 µs, and refused (ConfigError)
    above :data:`MAX_STEP_US` — the latency model (or the KV reload costs) are then not
    realistic. ``inst_id`` and ``now_us`` (the step's start) name it in the error."""
    if step_us < 1:
        return 1
    if step_us > MAX_STEP_US:
        raise ConfigError(f"{inst_id}: the step at t={now_us} us lasts {step_us} us, more than the "
                          f"{MAX_STEP_US} us (one hour) an engine step may last: the latency "
                          "coefficients or KV transfer costs are not realistic", field="latency")
    return step_us


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Per-instance batch limits (docs/engine.md, "Batch formation"). Token counts in tokens; 0 disables.

    ``preemption_model`` picks what a preempted request recomputes (docs/kv-cache.md):
    ``vllm`` its prompt and outputs so far, as a prefill; ``blis`` everything, regenerating
    its outputs one decode step at a time. ``async_scheduling``: see the field."""

    max_num_running_reqs: int = 256
    max_num_scheduled_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    max_model_len: int = 0
    preemption_model: str = "vllm"
    #: vLLM's async scheduling (docs/engine.md, "Async scheduling"): the batch of a step is
    #: chosen when the step before it starts, so a request that entered the wait queue after
    #: that moment waits one more step; False = BLIS (chosen when the step starts)
    async_scheduling: bool = False
    #: a step whose requests all finish in it (docs/engine.md, "A step holds the engine"):
    #: ``vllm`` it holds the instance until it ends; ``blis`` the instance is idle from the
    #: step's start, so an arrival during it starts a step that overlaps it (BLIS parity)
    step_model: str = "vllm"

    def __post_init__(self):
        if self.preemption_model not in PREEMPTION_MODELS:
            raise ValueError(f"preemption model must be one of {', '.join(PREEMPTION_MODELS)}, "
                             f"got {self.preemption_model!r}")
        if self.step_model not in STEP_MODELS:
            raise ValueError(f"step model must be one of {', '.join(STEP_MODELS)}, "
                             f"got {self.step_model!r}")


def enqueue_refusal(req, limits: EngineLimits, kv) -> str | None:
    """Why ``req`` must be dropped at enqueue, or None when it may wait for a batch.

    A request with no output budget (``max_output_len == 0``) under a context cap ``M`` gets
    ``M − input`` tokens (``req`` is changed). Refused: a negative budget; an input of ``M``
    tokens or more; input + budget over ``M``; an input needing more KV blocks than ``kv``
    has in total."""
    m = limits.max_model_len
    n_in = req.input_len
    if req.max_output_len == 0 and m > 0 and n_in < m:
        req.max_output_len = m - n_in
    if req.max_output_len < 0:
        return f"negative MaxOutputLen {req.max_output_len}"
    if m > 0:
        if n_in >= m:
            return f"input length {n_in} >= MaxModelLen {m} (no room for output)"
        if req.max_output_len > 0 and n_in + req.max_output_len > m:
            return (f"total sequence length {n_in + req.max_output_len} (input={n_in} + "
                    f"budget={req.max_output_len}) exceeds MaxModelLen {m}")
    if ceil_div(n_in, kv.block_size) > kv.total_blocks:
        return f"input needs more KV blocks than the {kv.total_blocks} available"
    return None
