"""What a run writes besides its report: the per-request rows (``outputs.requests_out``,
streamed with ``metrics.streaming``; docs/performance.md, "Very long runs") and the timeline
(``output.timeline``; docs/planning.md, "Reports").

* :func:`start_rows` — opens the rows file and taps the instances
  (:class:`~blis_simpy.metrics.collect.RequestCollector`); the returned :class:`RunTap` takes
  the leftovers after the run (:meth:`RunTap.finish`), writes and renames the rows file
  (:meth:`RunTap.commit`) or removes it (:meth:`RunTap.abort`).
* :func:`start_timeline` — checks the path and attaches the timeline monitor
  (:class:`~blis_simpy.cluster.monitor.Monitor`); :meth:`TimelineOut.commit` writes the file
  after a successful run (:func:`~blis_simpy.metrics.timeline_file.write_timeline`, atomic).
  Without ``output.timeline`` nothing is attached and the run is untouched.
"""

from __future__ import annotations

import logging

from blis_simpy.cluster.monitor import Monitor
from blis_simpy.errors import ConfigError
from blis_simpy.metrics.collect import RequestCollector
from blis_simpy.metrics.saturation import probe_metrics
from blis_simpy.metrics.sink import RequestSink
from blis_simpy.metrics.slo import SLOSpec
from blis_simpy.metrics.summary import aggregate, request_rows
from blis_simpy.metrics.timeline_file import check_timeline_path, write_timeline

__all__ = ["RunTap", "TimelineOut", "start_rows", "start_timeline"]

log = logging.getLogger("blis_simpy")

#: the field a rows-file error names
ROWS_FIELD = "outputs.requests_out"
#: the field a timeline-file error names
TIMELINE_FIELD = "output.timeline"


class RunTap:
    """What :func:`start_rows` set up for one run."""

    def __init__(self, collector: RequestCollector | None, sink: RequestSink | None, streaming: bool):
        self.collector = collector
        self.sink = sink
        self.streaming = streaming

    def finish(self, metrics) -> None:
        """After the run (``metrics``: the finalized instance records): the requests still
        queued or running."""
        if self.collector is not None:
            self.collector.finish(metrics)

    def saturation(self, sim, result, rate_changes=None):
        """The saturation test of the run (docs/metrics.md, "Saturation"): from the probe the
        streamed requests fed, or from the exact records; also per piece of a time-varying
        load given where its rate changes (``rate_changes``, µs; None: none)."""
        probe = self.collector.probe if self.collector is not None else None
        return (probe if probe is not None else sim_probe(sim, result.instances)).verdict(rate_changes)

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


def start_rows(d, sim) -> RunTap:
    """Open the rows file (``d.outputs.requests_out``) and tap ``sim``'s instances (``d``: a
    :class:`~blis_simpy.run.describe.RunDescription`; ``sim``: its
    :class:`~blis_simpy.run.simulation.Simulation`, not yet run)."""
    s = d.scenario
    streaming = s.metrics.streaming
    pd = sim.pools.enabled
    if streaming and pd:
        raise d.attribute(ConfigError(
            "is not supported with prefill/decode pools (parents are projected from their "
            "sub-requests at the end of the run)", field="metrics.streaming"))
    path = d.outputs.requests_out
    sink = RequestSink(path, field=d.outputs.label(ROWS_FIELD)) if path else None
    collector = None
    if not pd:
        collector = RequestCollector(
            streaming=streaming, sink=sink if streaming else None,
            keep_order=s.engine.priority_policy not in ("", "constant"),
            slo=SLOSpec.from_config(s.slo))
        collector.attach(sim.instances)
    return RunTap(collector, sink, streaming)


class TimelineOut:
    """The monitor of one run and where its timeline goes (``monitor`` None: no timeline)."""

    def __init__(self, monitor: Monitor | None, path: str, field: str = TIMELINE_FIELD):
        self.monitor = monitor
        self.path = path
        self.field = field

    def commit(self, outcome, batch=None):
        """Write the timeline file (if any; with ``batch``, staged to commit with the batch);
        returns ``outcome`` unchanged."""
        if self.monitor is not None:
            tl = self.monitor.timeline
            if tl.truncated:
                log.warning("timeline: stopped at %d samples (t = %.3f s); pass a larger "
                            "--timeline-interval-ms", tl.n_samples, tl.times_us[-1] / 1e6)
            write_timeline(self.path, tl, field=self.field, batch=batch)
        return outcome


def start_timeline(d, sim) -> TimelineOut:
    """Attach the monitor when the scenario asks for a timeline (``output.timeline``)."""
    out = d.scenario.output
    if not out.timeline:
        return TimelineOut(None, "")
    field = d.outputs.label(TIMELINE_FIELD)
    check_timeline_path(out.timeline, field)
    interval_us = round(out.timeline_interval_ms * 1000)
    try:
        monitor = Monitor(sim, interval_us)
    except ValueError as exc:
        raise d.attribute(ConfigError(str(exc), field="output.timeline_interval_ms")) from None
    return TimelineOut(monitor, out.timeline, field)


def sim_probe(sim, metrics):
    """The saturation probe of ``sim``'s instance records ``metrics`` (exact metrics; with
    prefill/decode pools, their sub-requests and the cluster's parent records)."""
    return probe_metrics(aggregate(metrics), getattr(sim.cluster, "parents", None))
