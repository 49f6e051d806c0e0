"""Small builders for latency-model unit tests."""

from __future__ import annotations

from dataclasses import dataclass

from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.latency.base import BatchView


@dataclass
class Req:
    """Just what a latency model reads of a running request."""

    pi: int
    input_len: int
    num_new_tokens: int
    output_len: int = 10


def prefill(pi: int, t: int, input_len: int | None = None) -> Req:
    return Req(pi, input_len if input_len is not None else pi + t, t)


def decode(pi: int, new: int = 1, input_len: int = 1) -> Req:
    return Req(pi, input_len, new)


def view(*reqs: Req) -> BatchView:
    return BatchView.of(list(reqs))


#: A toy dense model: d = 64, L = 2, H = 4, Hkv = 2 (dh = 16, dkv = 32), dff = 128, bf16.
TOY = ModelConfig(name="toy/dense", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                  intermediate_size=128, vocab_size=1000, bytes_per_param=2.0)
#: The same with 4 experts, top-2, per-expert FFN dim 32.
TOY_MOE = ModelConfig(name="toy/moe", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, vocab_size=1000, bytes_per_param=2.0,
                      num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
#: 1e9 FLOP/s (= 1000 FLOP/µs) and 1e9 B/s (= 1000 B/µs); MFU 0.5 prefill, 0.25 decode.
SLOW_GPU = GPUSpec("slow", tflops_peak=0.001, tflops_fp8=0.0, bw_peak_tbs=0.001,
                   mfu_prefill=0.5, mfu_decode=0.25, memory_gib=1.0)
#: Same compute, 10× less bandwidth (1e8 B/s): memory-bound decode.
NARROW_GPU = GPUSpec("narrow", tflops_peak=0.001, tflops_fp8=0.0, bw_peak_tbs=0.0001,
                     mfu_prefill=0.5, mfu_decode=0.25, memory_gib=1.0)
#: SLOW_GPU with a native FP8 peak twice the BF16 peak.
FP8_GPU = GPUSpec("fp8", tflops_peak=0.001, tflops_fp8=0.002, bw_peak_tbs=0.001,
                  mfu_prefill=0.5, mfu_decode=0.25, memory_gib=1.0)

H100 = GPUSpec("H100", 989.5, 1979.0, 3.35, 0.45, 0.30, 80.0)
A100 = GPUSpec("A100-SXM", 312.0, 0.0, 2.039, 0.38, 0.18, 80.0)
