"""The report draws the gateway queue's depth from a timeline that has the
``gateway_queue_depth`` column (docs/planning.md, "Reports"), and nothing without it."""

from __future__ import annotations

from pathlib import Path

from blis_simpy.metrics.timeline_file import COLUMNS
from blis_simpy.report import figures
from blis_simpy.report.inputs import load_input


def _timeline(path: Path, gateway: bool) -> Path:
    """Two instances, samples at 0, 100 and 200 ms: gateway depth 0, 3, 1; running 1+1, 2+2,
    2+1; waiting 0+0, 1+0, 0+0."""
    cols = COLUMNS + (("gateway_queue_depth",) if gateway else ())
    rows = []
    for t, depth, runs, waits in ((0, 0, (1, 1), (0, 0)), (100_000, 3, (2, 2), (1, 0)),
                                  (200_000, 1, (2, 1), (0, 0))):
        for i in range(2):
            vals = [t, f"instance_{i}", "", runs[i], waits[i], 10, 100, 0, "", 5]
            rows.append(vals + ([depth] if gateway else []))
    path.write_text(",".join(cols) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def test_gateway_figure_draws_the_depth_and_the_instances(tmp_path):
    fig = figures.gateway_figure(load_input(str(_timeline(tmp_path / "tl.csv", True))))
    top, bottom = fig.get_axes()[:2]
    (depth,) = top.get_lines()
    assert list(depth.get_xdata()) == [0.0, 0.1, 0.2] and list(depth.get_ydata()) == [0, 3, 1]
    running, waiting = bottom.get_lines()
    assert list(running.get_ydata()) == [2, 4, 3] and list(waiting.get_ydata()) == [0, 1, 0]
    assert top.get_ylabel() == "gateway queue depth"


def test_no_gateway_column_no_figure(tmp_path):
    assert figures.gateway_figure(load_input(str(_timeline(tmp_path / "tl.csv", False)))) is None
