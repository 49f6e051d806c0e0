"""Bounds that untrusted input is held to wherever it enters: scenarios and their flags,
workload specs, traces, measured runs (docs/scenarios.md, "Limits").

One definition each, below every package that reads input, so a scenario's token keys, a
workload spec's length distributions and a trace's token cells share one cap.
"""

from __future__ import annotations

__all__ = ["MAX_CONCURRENCY", "MAX_LOAD_PIECES", "MAX_LOAD_RATE", "MAX_REQUESTS", "MAX_STAGE_S",
           "MAX_THINK_MS", "MAX_TOKENS"]

#: any token count: context cap, step budget, prefill chunk, prompt/output lengths, prefix,
#: a length distribution's parameters and samples, a trace's token cells (2^24)
MAX_TOKENS = 1 << 24
#: requests one workload may generate or one trace may hold, and one ``observe`` run may send
MAX_REQUESTS = 10_000_000
#: closed-loop clients at once (docs/workloads.md, "Closed-loop clients")
MAX_CONCURRENCY = 1_000_000
#: pieces of a time-varying load: concurrency stages, rate stages, rate-schedule points and
#: rate-CSV rows (a day at one row a second is 86,400)
MAX_LOAD_PIECES = 1_000_000
#: the highest rate of a load piece, requests/s (inference-perf's stage bound)
MAX_LOAD_RATE = 1e9
#: the longest stage, and the latest schedule point, seconds (inference-perf's stage bound)
MAX_STAGE_S = 1e8
#: the largest mean think time, ms (one day)
MAX_THINK_MS = 86_400_000.0
