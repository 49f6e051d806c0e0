"""The trained alpha/beta "blackbox" regression (docs/latency-models.md, "`blackbox`")."""

from __future__ import annotations

from blis_simpy.latency.base import BatchView, LatencyModel, check_coeffs
from blis_simpy.units import to_int64


class BlackboxModel(LatencyModel, name="blackbox"):
    """``step = β0 + β1·prefill tokens + β2·decode tokens``; ``queueing = α0 + α1·input``;
    ``OTPT = α2``. Prefill tokens are the cache-miss tokens actually scheduled this step.
    """

    def __init__(self, alpha, beta):
        self.alpha = check_coeffs("alpha", alpha, 3)
        self.beta = check_coeffs("beta", beta, 3)
        self._otpt = to_int64(self.alpha[2])

    def step_time_us(self, batch: BatchView) -> int:
        b0, b1, b2 = self.beta[0], self.beta[1], self.beta[2]
        t = to_int64(b0 + b1 * batch.prefill_tokens + b2 * batch.decode_tokens)
        return t if t > 1 else 1

    def decode_step_fn(self, size: int, count: int):
        """A pure-decode step does not depend on the context: one duration for all."""
        if type(self).step_time_us is not _STEP:    # a subclass's or a patched-in step
            return None
        t = self.step_time_us(BatchView(decode_count=count, decode_tokens=count, size=size))
        return lambda decode_pi_sum: t

    def longest_step_us(self, max_scheduled_tokens: int, max_running_reqs: int) -> float:
        """The longest step this model can time, µs, under a per-step budget of
        ``max_scheduled_tokens`` tokens and at most ``max_running_reqs`` decoders (each
        decodes one token): ``β0`` plus the costlier mix of prefill and decode tokens."""
        b0, b1, b2 = self.beta[0], self.beta[1], self.beta[2]
        d = min(max_running_reqs, max_scheduled_tokens) if b2 > b1 else 0
        return b0 + b1 * (max_scheduled_tokens - d) + b2 * d

    def queueing_time_us(self, req) -> int:
        return to_int64(self.alpha[0] + self.alpha[1] * req.input_len)

    def output_token_time_us(self) -> int:
        return self._otpt


#: the step :meth:`BlackboxModel.decode_step_fn` stands for, as defined here (a step patched
#: onto the class later must see every step)
_STEP = BlackboxModel.step_time_us
