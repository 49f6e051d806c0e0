"""``--timeline PATH`` around one run (docs/planning.md, "Reports").

:func:`start` checks the path and attaches the timeline monitor
(:class:`~blis_simpy.cluster.monitor.Monitor`) to a simulation not yet run;
:meth:`TimelineOut.commit` writes the file after a successful run
(:func:`~blis_simpy.metrics.timeline_file.write_timeline`, atomic). Without ``--timeline``
(scenario key ``output.timeline``) nothing is attached and the run is untouched.
"""

from __future__ import annotations

import logging

from blis_simpy.cluster.monitor import Monitor
from blis_simpy.errors import ConfigError
from blis_simpy.metrics.timeline_file import check_timeline_path, write_timeline

log = logging.getLogger("blis_simpy")


class TimelineOut:
    """The monitor of one run and where its timeline goes (``monitor`` None: no timeline)."""

    def __init__(self, monitor: Monitor | None, path: str, field: str):
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


def start(plan, sim) -> TimelineOut:
    """Attach the monitor when the plan asks for a timeline (``plan``: a prepared
    :class:`~blis_simpy.cli.runner.Plan`; ``sim``: its simulation, not yet run)."""
    out = plan.scenario.output
    if not out.timeline:
        return TimelineOut(None, "", "")
    field = plan.origin.get("output.timeline", "output.timeline")
    check_timeline_path(out.timeline, field)
    interval_us = round(out.timeline_interval_ms * 1000)
    try:
        monitor = Monitor(sim, interval_us)
    except ValueError as exc:
        raise plan.attribute(ConfigError(str(exc), field="output.timeline_interval_ms")) from None
    return TimelineOut(monitor, out.timeline, field)
