"""A batching policy in one file: vLLM's batching, admitting at most ``max_admissions``
new requests per step (docs/extending.md, "A batching policy")."""

from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.engine.vllm_batching import VLLMBatching


class Staggered(VLLMBatching, name="staggered"):
    """vLLM batching that starts at most ``max_admissions`` requests per step."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        max_admissions: int = Field(1, ge=1)

    def phase2(self, a, budget):
        """Admit from the head of the wait queue (``a``: the step allocator)."""
        for _ in range(self.params.max_admissions):
            if budget <= 0 or len(a.running) >= self.limits.max_num_running_reqs or not a.waitq:
                return
            n = a.admit_head(self.chunk, budget)     # tokens it got, None: it does not fit
            if n is None:
                return
            budget -= n
