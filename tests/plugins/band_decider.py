"""A user-written disaggregation decider plugin, loaded from a scenario's ``plugins:`` list.

``prompt-band`` disaggregates the requests whose prompt length lies in
``[min_tokens, max_tokens]`` and whose output budget (``max_output_len``) is at least
``min_budget`` — a rule no built-in decider expresses. Like every decider it reads only the
prompt and the budget, never the pre-sampled output (INV-9)::

    plugins: [tests.plugins.band_decider]
    disaggregation:
      prefill_instances: 1
      decode_instances: 1
      decider:
        policy: prompt-band
        params: {min_tokens: 100, max_tokens: 300}
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.disagg.deciders import DisaggregationDecider


class PromptBand(DisaggregationDecider, name="prompt-band"):
    """Disaggregate iff ``min_tokens <= len(input) <= max_tokens`` and
    ``max_output_len >= min_budget``."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        min_tokens: int = Field(0, ge=0, description="shortest prompt to disaggregate")
        max_tokens: int = Field(1 << 30, ge=0, description="longest prompt to disaggregate")
        min_budget: int = Field(0, ge=0, description="smallest output budget to disaggregate")

    def decide(self, req) -> bool:
        p = self.params
        return p.min_tokens <= req.input_len <= p.max_tokens and req.max_output_len >= p.min_budget
