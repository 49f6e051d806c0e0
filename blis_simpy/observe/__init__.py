"""``observe``: send a workload to a real OpenAI-compatible server and record real timings.

* :mod:`~blis_simpy.observe.body` — the endpoint and JSON body of each request;
* :mod:`~blis_simpy.observe.client` — the async httpx sender (arrival times, concurrency
  cap, timeouts, SSE streaming);
* :mod:`~blis_simpy.observe.records` — per-request observations, TraceV2 rows (mode
  ``real``) and the results JSON.
* :mod:`~blis_simpy.observe.outputs` — the trace pair and the results JSON written as the
  requests finish (what ``blis-simpy observe`` uses: memory does not grow with the run).

Nothing here imports SimPy: observing a server needs no simulator.
"""

from blis_simpy.observe.body import API_FORMATS, chat_text, endpoint_url, request_body
from blis_simpy.observe.client import MAX_REQUESTS, ObserveConfig, ObserveRun, check_server, observe
from blis_simpy.observe.records import (
    Observation,
    results_document,
    summarize,
    trace_records,
    write_json,
)

__all__ = [
    "API_FORMATS", "MAX_REQUESTS", "ObserveConfig", "ObserveRun", "Observation", "chat_text",
    "check_server", "endpoint_url", "observe", "request_body", "results_document", "summarize",
    "trace_records", "write_json",
]
