"""The CPU costs of vLLM's API server, the front end of an instance (docs/frontend.md).

A :class:`FrontendParams` is what the front-end process
(:mod:`blis_simpy.engine.frontend`) charges its one CPU for each piece of work, in µs:

* an incoming request: ``request_us + input_token_us × prompt tokens`` (render the chat
  template, tokenize, validate), after which the request is handed to the engine;
* the outputs of one engine step: ``step_output_us + output_token_us × tokens the step
  emitted`` (detokenize, build and write the stream chunks);
* ``network_us`` each way between the client and the server (no CPU).

A scenario's ``frontend:`` section is one of these; a latency model may supply defaults
(:meth:`~blis_simpy.latency.base.LatencyModel.frontend_params`). It lives here, beside the
latency model's other per-request overheads, because the model supplies it; it is plain
data (no SimPy). Every value is a finite float ≥ 0; a cost is truncated to whole µs as
BLIS truncates the alpha overheads (:func:`~blis_simpy.units.to_int64`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.units import to_int64

#: the largest value of any front-end cost: one hour of simulated time, µs (as every other
#: delay a scenario can set, docs/scenarios.md "Limits")
MAX_FRONTEND_US = 3_600_000_000.0

_Us = Annotated[float, Field(ge=0, le=MAX_FRONTEND_US, allow_inf_nan=False)]


class FrontendParams(BaseModel):
    """Costs of one instance's API server (µs; module docstring). All zero: no front end."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    request_us: _Us = Field(0.0, description="CPU time per incoming request (tokenize, validate), µs")
    input_token_us: _Us = Field(0.0, description="CPU time per prompt token of an incoming request, µs")
    step_output_us: _Us = Field(0.0, description="CPU time per engine step that emitted tokens, µs")
    output_token_us: _Us = Field(0.0, description="CPU time per token an engine step emitted, µs")
    network_us: _Us = Field(0.0, description="client <-> server latency, each way, µs")

    @property
    def active(self) -> bool:
        """Does any cost make the front end take time? (False: no front-end process.)"""
        return any(v > 0 for v in (self.request_us, self.input_token_us, self.step_output_us,
                                   self.output_token_us, self.network_us))

    def input_cost_us(self, input_tokens: int) -> int:
        """CPU time of an incoming request of ``input_tokens`` prompt tokens, µs."""
        return to_int64(self.request_us + self.input_token_us * input_tokens)

    def output_cost_us(self, tokens: int) -> int:
        """CPU time of one engine step's outputs, ``tokens`` tokens in all, µs."""
        return to_int64(self.step_output_us + self.output_token_us * tokens)

    @property
    def network_delay_us(self) -> int:
        """The one-way network latency, whole µs."""
        return to_int64(self.network_us)


__all__ = ["MAX_FRONTEND_US", "FrontendParams"]
