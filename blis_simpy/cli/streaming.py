"""``--streaming-metrics`` and ``--requests-out`` around one run (docs/performance.md,
"Very long runs").

* :func:`trace_stream` — a trace workload as a lazy
  :class:`~blis_simpy.workload.trace_stream.TraceRequestStream` (every replay whose rows are
  in arrival order; exact and streaming metrics alike), or None for the list path.
* :func:`start` — checks the flags against the run, opens the ``--requests-out`` file and
  taps the instances (:class:`~blis_simpy.metrics.collect.RequestCollector`); the returned
  :class:`RunTap` takes the leftovers after the run (:meth:`RunTap.finish`), writes and
  renames the rows file (:meth:`RunTap.commit`) or removes it (:meth:`RunTap.abort`).
"""

from __future__ import annotations

from blis_simpy.errors import ConfigError
from blis_simpy.metrics.collect import RequestCollector
from blis_simpy.metrics.sink import RequestSink
from blis_simpy.metrics.slo import SLOSpec
from blis_simpy.metrics.summary import request_rows

__all__ = ["RunTap", "last_arrival_us", "start", "trace_stream"]

#: flags whose output needs every request kept in memory
_NEEDS_REQUESTS = {"--results-path": "keeps every request for its rows (use --requests-out)",
                   "--trace-output": "needs every request at the end"}


def trace_stream(header_path: str, data_path: str, seed: int, given: dict):
    """The trace's requests as a lazy stream, or None when the rows are not in arrival order
    or ``--trace-output`` needs the request objects after the run."""
    from blis_simpy.workload.trace_stream import TraceRequestStream
    from blis_simpy.workload.tracev2_read import read_trace_header
    if "--trace-output" in given:
        return None
    read_trace_header(header_path)          # errors in the same order as read_trace
    stream = TraceRequestStream(data_path, seed)
    return stream if stream.sorted else None


def last_arrival_us(requests) -> int:
    """Latest arrival (µs) of a request list or stream; 0 when empty."""
    last = getattr(requests, "last_arrival_us", None)
    if last is not None:
        return max(last, 0)
    return max((r.arrival_us for r in requests), default=0)


class RunTap:
    """What :func:`start` set up for one run."""

    def __init__(self, collector: RequestCollector | None, sink: RequestSink | None, streaming: bool):
        self.collector = collector
        self.sink = sink
        self.streaming = streaming

    def finish(self, metrics) -> None:
        """After the run (``metrics``: the finalized instance records): the requests still
        queued or running."""
        if self.collector is not None:
            self.collector.finish(metrics)

    def commit(self, report, batch=None) -> None:
        """Complete the rows file: exact metrics write the cluster's rows now (the results
        file's order); streamed ones were written as requests left. With ``batch`` (a
        :class:`~blis_simpy.atomic.Batch`) the file commits with the batch."""
        if self.sink is None:
            return
        if not self.streaming:
            for row in request_rows(report.cluster, absent=None):   # absent latency: null
                self.sink.write(row)
        self.sink.commit(batch)

    def abort(self) -> None:
        if self.sink is not None:
            self.sink.abort()


def start(plan, sim) -> RunTap:
    """Check the flags, open ``--requests-out`` and tap ``sim``'s instances (a
    :class:`~blis_simpy.cluster.simulation.Simulation` not yet run)."""
    s = plan.scenario
    streaming = s.metrics.streaming
    pd = sim.plan.enabled
    if streaming:
        for flag, why in _NEEDS_REQUESTS.items():
            if plan.given.get(flag):
                raise ConfigError(f"cannot be combined with --streaming-metrics: it {why}",
                                  field=flag)
        if pd:
            raise plan.attribute(ConfigError(
                "is not supported with prefill/decode pools (parents are projected from their "
                "sub-requests at the end of the run)", field="metrics.streaming"))
    path = plan.given.get("--requests-out")
    sink = RequestSink(path) if path else None
    collector = None
    if not pd:
        collector = RequestCollector(
            streaming=streaming, sink=sink if streaming else None,
            keep_order=s.engine.priority_policy not in ("", "constant"),
            slo=SLOSpec.from_config(s.slo))
        collector.attach(sim.instances)
    return RunTap(collector, sink, streaming)
