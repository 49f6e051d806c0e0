"""Taking each request's results as it leaves its instance (docs/performance.md, "Very long
runs").

:class:`RequestCollector` listens to every instance (it wraps the cluster as the instances'
listener, :class:`_Tap`) and, when a request completes or times out:

* with exact metrics, replaces the completed request's registry row by a
  :class:`DoneRequest`: the dozen fields the reports read, without the request's engine and
  KV state (about a tenth of its memory); every value the reports print is unchanged;
* with ``--streaming-metrics``, moves the request's TTFT, E2E, ITL and scheduling delay out
  of the instance's maps into the instance's
  :class:`~blis_simpy.metrics.streaming.StreamingStats`, writes its row to the
  ``--requests-out`` sink (if any) and drops it: nothing of it stays in memory; with SLO
  targets (``slo``) a completed request is judged now and counted in the instance's
  :class:`~blis_simpy.metrics.slo.SLOTally`.

At the end of the run :meth:`RequestCollector.finish` does the same for the requests still
queued or running (sorted by ID). Only the standard cluster is tapped; the
prefill/decode cluster projects its parents from the sub-requests at the end of the run.
"""

from __future__ import annotations

from blis_simpy.metrics.raw import DEFAULT_SLO_CLASS
from blis_simpy.metrics.saturation import BacklogProbe, request_times
from blis_simpy.metrics.sink import RequestSink
from blis_simpy.metrics.slo import SLOSpec, SLOTally
from blis_simpy.metrics.streaming import StreamingStats
from blis_simpy.metrics.summary import request_row
from blis_simpy.request import COMPLETED, TIMED_OUT

__all__ = ["DoneRequest", "RequestCollector"]


class DoneRequest:
    """The registry row of a completed request: what the reports and the end-of-run checks
    read (times in µs, lengths in tokens)."""

    __slots__ = ("id", "arrival_us", "origin_us", "input_len", "output_len", "slo_class",
                 "tenant_id", "assigned_instance", "model", "length_capped", "state", "enqueue_us",
                 "is_decode_sub", "itl_segments")

    def __init__(self, req):
        self.id = req.id
        self.arrival_us = req.arrival_us
        self.origin_us = req.origin_us
        self.input_len = req.input_len
        self.output_len = req.output_len
        self.slo_class = req.slo_class
        self.tenant_id = req.tenant_id
        self.assigned_instance = req.assigned_instance
        self.model = req.model
        self.length_capped = req.length_capped
        self.state = req.state
        self.enqueue_us = req.enqueue_us
        self.is_decode_sub = req.is_decode_sub
        self.itl_segments = None


class _Tap:
    """The instance's listener (an ``InstanceListener`` in all but name: metrics sits below
    the engine): the cluster first, then the collector."""

    def __init__(self, inner, collector: RequestCollector):
        self.inner = inner
        self.on_event_end = inner.on_event_end          # bound: no extra call per event
        self.wants_request_state = inner.wants_request_state
        self.quiet_steps = getattr(inner, "quiet_steps", False)
        self._inner_done = inner.on_request_done
        self._done = collector.done

    def on_request_done(self, inst, req, tick_us: int) -> None:
        self._inner_done(inst, req, tick_us)
        self._done(inst, req)


class RequestCollector:
    """See the module docstring. ``streaming``: stream the metrics and drop requests;
    ``sink``: where rows go as requests leave (streaming only); ``keep_order``: keep the rows
    the priority-inversion counter needs (a priority policy other than ``constant``);
    ``slo``: SLO targets to judge completed requests by (streaming only; None or inactive =
    no tally)."""

    def __init__(self, *, streaming: bool, sink: RequestSink | None = None,
                 keep_order: bool = False, slo: SLOSpec | None = None):
        self.streaming = streaming
        self.sink = sink
        self.keep_order = keep_order
        self.slo = slo if slo is not None and slo.active else None
        #: streaming: the saturation probe fed as requests leave (docs/metrics.md, "Saturation")
        self.probe = BacklogProbe() if streaming else None

    def attach(self, instances) -> None:
        for inst in instances:
            inst.listener = _Tap(inst.listener, self)
            if self.streaming:
                inst.metrics.streaming = StreamingStats(self.keep_order)
                if self.slo is not None:
                    inst.metrics.streaming.slo_tally = SLOTally()

    def done(self, inst, req) -> None:
        state = req.state
        if state != COMPLETED and state != TIMED_OUT:
            return
        met = inst.metrics
        rid = req.id
        if met.registry.get(rid) is not req:
            return
        if not self.streaming:
            if state == COMPLETED:
                met.registry[rid] = DoneRequest(req)
            return
        del met.registry[rid]
        self._take(met, rid, req, met.ttft.pop(rid, None), met.e2e.pop(rid, None),
                   met.scheduling_delay.pop(rid, None), met.itl.pop(rid, None),
                   met.completion_time.pop(rid, None))

    def _take(self, met, rid, req, ttft, e2e, sched, itl, done=None) -> None:
        if req is not None:
            self.probe.add(*request_times(req, sched, done))
        cls = (req.slo_class if req is not None else "") or DEFAULT_SLO_CLASS
        met.streaming.add_request(req, cls, ttft, e2e, sched, req is not None)
        if e2e is not None and self.slo is not None:
            met.streaming.slo_tally.add(self.slo, cls, ttft, itl, e2e)
        if req is not None and self.sink is not None:
            self.sink.write(request_row(rid, req, ttft, itl, e2e, sched))   # absent: null

    def finish(self, metrics) -> None:
        """End of run: take the requests still in the finalized instance records ``metrics``."""
        if not self.streaming:
            return
        for met in metrics:
            reg, ttft, e2e, sched, itl = (met.registry, met.ttft, met.e2e, met.scheduling_delay,
                                          met.itl)
            done = met.completion_time
            for rid in sorted(set(reg) | set(ttft) | set(e2e) | set(sched)):
                self._take(met, rid, reg.get(rid), ttft.get(rid), e2e.get(rid), sched.get(rid),
                           itl.get(rid), done.get(rid))
            for table in (reg, ttft, e2e, sched, itl, met.completion_time):
                table.clear()
