"""Run one sweep or plan point: the function the planner's executor maps over points.

:func:`run_point` lives at module level so Dask pickles it by reference: a worker imports
this module and runs it. A point is ``{"command": "run" | "replay", "scenario": <scenario
dict>}`` (paths in it absolute, or relative to the worker's directory), optionally with its
``config_hash`` (computed here otherwise, :func:`blis_simpy.planner.sweep_points.config_hash`)
and ``plugin_dirs`` (folders searched first for its plugin modules).

The row it returns is flat (one value per key, ready for a Parquet column)::

    status       "ok" | "error"
    error        one line ("" when ok)
    config_hash  SHA-256 hex of the command and the resolved scenario
    wall_s       seconds this point took (validation + simulation)
    m.<key>      every number of the report's cluster block (docs/metrics.md):
                 m.ttft_p99_ms, m.e2e_mean_ms, m.responses_per_sec, m.completed_requests, ...
    slo.<...>    the report's "slo" object, flattened, when present
    deployment.<...>  the report's "deployment" object, flattened, when present
    autoscaling.<...> with an autoscaler: autoscaling.gpu_hours, .cost_usd, .peak_instances,
                 ...; its instance_count and intervals lists as JSON text

The metrics are exactly those of ``blis-simpy run --scenario S --format json`` for the same
scenario (:func:`blis_simpy.metrics.report.report_dict`).

A point with ``"stop_when_saturated": true`` (the plan's, docs/planning.md) ends its run at
its last arrival when it is saturated then (docs/metrics.md, "Saturation"), and its row
has three more keys: ``saturated`` (bool), ``stopped_early_s`` (the simulated time it ended
at, s; None when it ran to its end) and ``saturation`` (the one-line summary; "" when not
saturated).
"""

from __future__ import annotations

import json
import time

from blis_simpy.errors import BlisError
from blis_simpy.run.describe import Outputs, RunDescription, prepare
from blis_simpy.run.execute import execute

__all__ = ["check_point", "flatten", "prepare_point", "report_row", "run_point"]

#: objects of the report flattened into the row besides the cluster block (prefix = key)
EXTRA_SECTIONS = ("slo", "deployment", "autoscaling")


def prepare_point(point: dict, allow_plugins: bool = False) -> RunDescription:
    """The validated :class:`~blis_simpy.run.describe.RunDescription` of a point (the
    scenario dict is copied); its plugin modules are looked up in its ``plugin_dirs`` first
    and imported only with ``allow_plugins``."""
    return prepare(point["scenario"], mode=point.get("command", "run"),
                   outputs=Outputs(stop_when_saturated=bool(point.get("stop_when_saturated"))),
                   plugin_dirs=tuple(point.get("plugin_dirs") or ()), allow_plugins=allow_plugins)


def check_point(point: dict, allow_plugins: bool = False) -> None:
    """Validate a point as ``run`` would (keys, values, backend, policies, pools) without
    running it; raises :class:`ConfigError` naming the scenario key."""
    prepare_point(point, allow_plugins)


def flatten(obj, prefix: str, out: dict) -> dict:
    """Nested mappings become ``prefix.key.sub`` columns; lists become JSON text; scalars stay."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}", out)
    elif isinstance(obj, (list, tuple)):
        out[prefix] = json.dumps(obj, sort_keys=True)
    else:
        out[prefix] = obj
    return out


def report_row(doc: dict) -> dict:
    """The metric columns of a report document (:func:`~blis_simpy.metrics.report.report_dict`)."""
    row: dict = {}
    for k, v in doc["cluster"].items():
        if k != "instance_id":
            flatten(v, f"m.{k}", row)
    for key in EXTRA_SECTIONS:
        if doc.get(key) is not None:
            flatten(doc[key], key, row)
    return row


def run_point(point: dict, allow_plugins: bool = False) -> dict:
    """Run one point through the run layer; a flat row (module docstring). Errors do not
    raise: they come back as ``status: "error"`` with the one-line message.
    ``allow_plugins``: the caller's opt-in to the point's plugin modules, passed with the
    job to a Dask worker."""
    from blis_simpy.metrics.report import report_dict
    from blis_simpy.planner.sweep_points import config_hash, resolved
    t0 = time.perf_counter()
    row: dict = {"status": "ok", "error": "", "config_hash": point.get("config_hash"), "wall_s": None}
    try:
        d = prepare_point(point, allow_plugins)
        if not row["config_hash"]:
            row["config_hash"] = config_hash(d.mode, resolved(d.scenario))
        out = execute(d)
        row.update(report_row(report_dict(out.report)))
        if d.outputs.stop_when_saturated:
            sat = out.report.saturation
            row["saturated"] = bool(sat is not None and sat.saturated)
            row["stopped_early_s"] = (out.stopped_saturated_us / 1e6
                                      if out.stopped_saturated_us is not None else None)
            row["saturation"] = sat.summary() if row["saturated"] else ""
    except Exception as exc:   # a point's failure is its row, never the sweep's end
        row["status"] = "error"
        text = (exc.one_line() if isinstance(exc, BlisError)
                else f"internal error: {type(exc).__name__}: {exc}")
        row["error"] = " ".join(text.split())
        if not row["config_hash"]:   # unvalidated: the hash of the scenario as given
            row["config_hash"] = config_hash(point.get("command", "run"), point.get("scenario"))
    row["wall_s"] = time.perf_counter() - t0
    return row
