"""Bounds that untrusted input is held to wherever it enters: scenarios and their flags,
workload specs, traces, measured runs (docs/scenarios.md, "Limits").

One definition each, below every package that reads input, so a scenario's token keys, a
workload spec's length distributions and a trace's token cells share one cap.
"""

from __future__ import annotations

__all__ = ["MAX_REQUESTS", "MAX_TOKENS"]

#: any token count: context cap, step budget, prefill chunk, prompt/output lengths, prefix,
#: a length distribution's parameters and samples, a trace's token cells (2^24)
MAX_TOKENS = 1 << 24
#: requests one workload may generate or one trace may hold, and one ``observe`` run may send
MAX_REQUESTS = 10_000_000
