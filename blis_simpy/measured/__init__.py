"""Measured runs of real servers: vLLM logs and ``vllm bench`` results read into an
:class:`~blis_simpy.measured.run.MeasuredRun` (the trace to replay and the latencies to
compare with), and converted to TraceV2 + scenario files by ``blis-simpy convert``;
inference-perf results folders read into an :class:`~blis_simpy.measured.run.AggregateRun`
(aggregate metrics and the workload rebuilt).

:func:`load_measured` reads a raw vLLM run folder, a ``vllm bench`` result JSON or the
``PREFIX`` of converted files; :func:`load_run` also an inference-perf folder.
"""

from blis_simpy.measured.converted import load_converted, load_measured, load_run
from blis_simpy.measured.inference_perf import load_inference_perf
from blis_simpy.measured.run import AggregateRun, MeasuredRun, RealRequest, Settings, Tick
from blis_simpy.measured.vllm_bench import load_vllm_bench
from blis_simpy.measured.vllm_log import load_vllm_log

__all__ = ["AggregateRun", "MeasuredRun", "RealRequest", "Settings", "Tick", "load_converted",
           "load_inference_perf", "load_measured", "load_run", "load_vllm_bench", "load_vllm_log"]
