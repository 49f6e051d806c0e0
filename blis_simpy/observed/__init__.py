"""Measured runs of real servers: vLLM logs and ``vllm bench`` results read into an
:class:`~blis_simpy.observed.run.ObservedRun` (the trace to replay and the latencies to
compare with), and converted to TraceV2 + scenario files by ``blis-simpy convert``."""

from blis_simpy.observed.run import ObservedRun, RealRequest, Settings, Tick
from blis_simpy.observed.vllm_log import load_vllm_log

__all__ = ["ObservedRun", "RealRequest", "Settings", "Tick", "load_vllm_log"]
