"""Measured runs of real servers: vLLM logs and ``vllm bench`` results read into an
:class:`~blis_simpy.observed.run.ObservedRun` (the trace to replay and the latencies to
compare with), and converted to TraceV2 + scenario files by ``blis-simpy convert``.

:func:`load_observed` reads any of them: a raw vLLM run folder, a ``vllm bench`` result JSON
or the ``PREFIX`` of converted files.
"""

from blis_simpy.observed.converted import load_converted, load_observed
from blis_simpy.observed.run import ObservedRun, RealRequest, Settings, Tick
from blis_simpy.observed.vllm_bench import load_vllm_bench
from blis_simpy.observed.vllm_log import load_vllm_log

__all__ = ["ObservedRun", "RealRequest", "Settings", "Tick", "load_converted", "load_observed",
           "load_vllm_bench", "load_vllm_log"]
