"""The record of one disaggregated request (docs/disaggregation.md, "The path step by step").

A disaggregated request is served as a *prefill sub-request* (``<id>_prefill``, on a
prefill-pool instance, no output tokens) then, after its KV cache is transferred, a *decode
sub-request* (``<id>_decode``, on a decode-pool instance, prompt KV pre-allocated). The
parent keeps the original request and the time of every phase (integer µs; 0 = not
reached), so metrics can be reported per parent (INV-PD-6) and phase causality checked
(INV-PD-4: arrival ≤ prefill enqueue ≤ prefill complete ≤ transfer start ≤ transfer
complete ≤ decode enqueue ≤ completion).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ParentRequest:
    id: str
    original: object = field(repr=False)          # the Request as the client sent it
    num_kv_blocks: int = 0                         # ceil(input / block size)
    arrival_us: int = 0
    prefill_enqueue_us: int = 0                    # prefill routing time
    prefill_complete_us: int = 0                   # detection time (start of the last prefill step)
    transfer_start_us: int = 0
    transfer_complete_us: int = 0
    decode_enqueue_us: int = 0                     # decode routing time
    completion_us: int = 0                         # decode completion detection (or drop) time
    prefill_instance: str = ""
    decode_instance: str = ""
    prefill_sub: object = field(default=None, repr=False)
    decode_sub: object = field(default=None, repr=False)

    @property
    def prefill_sub_id(self) -> str:
        return self.id + "_prefill"

    @property
    def decode_sub_id(self) -> str:
        return self.id + "_decode"

    @property
    def dropped_at_decode(self) -> bool:
        """Its KV arrived but no decode instance could take it."""
        return self.transfer_complete_us > 0 and not self.decode_instance

    @property
    def completed(self) -> bool:
        return self.completion_us > 0 and bool(self.decode_instance)

    def phase_times(self) -> tuple[int, ...]:
        return (self.arrival_us, self.prefill_enqueue_us, self.prefill_complete_us,
                self.transfer_start_us, self.transfer_complete_us, self.decode_enqueue_us,
                self.completion_us)
