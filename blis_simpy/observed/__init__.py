"""Measured runs of real servers: vLLM logs and ``vllm bench`` results read into an
:class:`~blis_simpy.observed.run.ObservedRun` (the trace to replay and the latencies to
compare with), and converted to TraceV2 + scenario files by ``blis-simpy convert``;
inference-perf results folders read into an :class:`~blis_simpy.observed.run.AggregateRun`
(aggregate metrics and the workload rebuilt).

:func:`load_observed` reads a raw vLLM run folder, a ``vllm bench`` result JSON or the
``PREFIX`` of converted files; :func:`load_run` also an inference-perf folder.
"""

from blis_simpy.observed.converted import load_converted, load_observed, load_run
from blis_simpy.observed.inference_perf import load_inference_perf
from blis_simpy.observed.run import AggregateRun, ObservedRun, RealRequest, Settings, Tick
from blis_simpy.observed.vllm_bench import load_vllm_bench
from blis_simpy.observed.vllm_log import load_vllm_log

__all__ = ["AggregateRun", "ObservedRun", "RealRequest", "Settings", "Tick", "load_converted",
           "load_inference_perf", "load_observed", "load_run", "load_vllm_bench", "load_vllm_log"]
