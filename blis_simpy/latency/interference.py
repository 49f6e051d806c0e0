"""Co-location interference: mixed prefill/decode batches run slower (docs/disaggregation.md,
"Interference").

:class:`InterferenceModel` wraps any latency model and multiplies its step time by

    m = 1 + f × minority / n

where ``n`` is the batch size, ``p`` the number of prefill-phase requests (``PI <
len(input)``, counted by request, not by token), ``q = n − p``, ``minority = min(p, q)``
and ``f`` the factor of the majority phase (``f_prefill`` if ``p > q``, ``f_decode`` if
``q > p``, the larger of the two on a tie). A phase-pure batch (``minority == 0``) or an
empty one gets exactly 1.0, so ``m ≥ 1`` always (INV-P2-3); the largest possible
multiplier is ``1 + 100 × 1/2 = 51`` at a 50/50 split. The step time becomes
``max(1, round_half_away(base × m))``; if ``base × m`` overflows int64 an error is logged
and the unscaled ``base`` returned. Queueing time, OTPT and the post-decode overhead are
the inner model's, unchanged.

(In float, ``1 + f·k/n`` rounds to exactly 1.0 when ``f·k/n < 2⁻⁵³`` — a factor that tiny
has no effect.)

It is a :class:`LatencyModel` but not a selectable backend: it defines no ``name``, so it
is not in the latency-model registry. The cluster wraps every instance's model in it when
either factor is > 0; with both 0 there is no wrapper.
"""

from __future__ import annotations

import logging
import math

from blis_simpy.latency.base import BatchView, LatencyModel
from blis_simpy.units import round_half_away

log = logging.getLogger("blis_simpy.latency")

#: Largest accepted interference factor (``MaxInterferenceFactor``).
MAX_INTERFERENCE_FACTOR = 100.0

_INT64_LIMIT = 9.223372036854775807e18   # 2^63 as a float


def check_factor(name: str, value: float) -> float:
    """An interference factor: finite, in ``[0, MAX_INTERFERENCE_FACTOR]``."""
    v = float(value)
    if not (math.isfinite(v) and 0.0 <= v <= MAX_INTERFERENCE_FACTOR):
        raise ValueError(f"{name} interference factor must be finite and in "
                         f"[0, {MAX_INTERFERENCE_FACTOR:g}], got {value}")
    return v


def interference_multiplier(prefill_count: int, size: int, prefill_factor: float,
                            decode_factor: float) -> float:
    """The slowdown of a batch of ``size`` requests, ``prefill_count`` of them prefill-phase."""
    if size <= 0:
        return 1.0
    p = prefill_count
    q = size - p
    minority = p if p < q else q
    if minority <= 0:
        return 1.0
    if p > q:
        f = prefill_factor
    elif q > p:
        f = decode_factor
    else:
        f = prefill_factor if prefill_factor > decode_factor else decode_factor
    return 1.0 + f * minority / size


class InterferenceModel(LatencyModel):
    """Wraps ``inner``; see the module docstring for the formula."""

    def __init__(self, inner: LatencyModel, prefill_factor: float = 0.0, decode_factor: float = 0.0):
        self.inner = inner
        self.prefill_factor = check_factor("prefill", prefill_factor)
        self.decode_factor = check_factor("decode", decode_factor)
        #: multiplier applied by the last :meth:`step_time_us` call (1.0 before any)
        self.last_multiplier = 1.0

    def multiplier(self, batch: BatchView) -> float:
        """The slowdown for ``batch`` (pure; does not touch :attr:`last_multiplier`)."""
        return interference_multiplier(len(batch.prefill), batch.size, self.prefill_factor,
                                       self.decode_factor)

    def step_time_us(self, batch: BatchView) -> int:
        base = self.inner.step_time_us(batch)
        m = self.multiplier(batch)
        self.last_multiplier = m
        if m == 1.0:
            return base if base > 1 else 1
        x = base * m
        if not x < _INT64_LIMIT:
            log.error("interference: step time %d x %.6g overflows int64; using the unscaled "
                      "step time", base, m)
            return base
        r = round_half_away(x)
        return r if r > 1 else 1

    def queueing_time_us(self, req) -> int:
        return self.inner.queueing_time_us(req)

    def output_token_time_us(self) -> int:
        return self.inner.output_token_time_us()

    def post_decode_us(self) -> int:
        return self.inner.post_decode_us()

    def frontend_params(self):
        return self.inner.frontend_params()


__all__ = ["InterferenceModel", "MAX_INTERFERENCE_FACTOR", "check_factor", "interference_multiplier"]
