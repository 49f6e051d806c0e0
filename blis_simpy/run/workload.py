"""The requests of a run description's workload (docs/workloads.md).

:func:`build_workload` gives the requests (a list, or a lazy trace stream), the horizon
(µs), the closed-loop session manager (or None) and the workload seed, for the three kinds
of workload: a distribution, a workload spec (``kind: spec``) and a TraceV2 trace.
Errors name the scenario key (``workload.rate``) or point into the spec or trace file.
"""

from __future__ import annotations

import os

from blis_simpy.config.scenario import SpecWorkload, TraceWorkload
from blis_simpy.errors import ConfigError
from blis_simpy.run.describe import RunDescription
from blis_simpy.run.load_shape import (
    closed_loop_workload,
    distribution_workload_spec,
    generated,
    time_varying_workload,
)

__all__ = ["build_requests", "build_workload", "last_arrival_us", "load_trace", "spec_workload",
           "trace_paths"]

def trace_paths(d: RunDescription) -> tuple[str, str]:
    """The trace header and data paths of a trace workload; both files must exist."""
    out = []
    for key in ("header", "data"):
        path = getattr(d.scenario.workload, key)
        if not os.path.isfile(path):
            why = "is a directory, expected a file" if os.path.isdir(path) else "no such file"
            if f"workload.{key}" in d.overridden:
                raise ConfigError(why, file=path, field=f"workload.{key}")
            raise d.attribute(ConfigError(f"{why}: {path}", field=f"workload.{key}"))
        out.append(path)
    return out[0], out[1]


def load_trace(d: RunDescription):
    """Read the description's trace (a :class:`~blis_simpy.workload.TraceV2`)."""
    from blis_simpy.workload import read_trace
    return read_trace(*trace_paths(d))


def trace_stream(d: RunDescription):
    """The trace's requests as a lazy stream, or None when the rows are not in arrival order
    or an output needs the request objects after the run."""
    from blis_simpy.workload.trace_stream import TraceRequestStream
    from blis_simpy.workload.tracev2_read import read_trace_header
    if d.outputs.keep_requests:
        return None
    header_path, data_path = trace_paths(d)
    read_trace_header(header_path)          # errors in the same order as read_trace
    stream = TraceRequestStream(data_path, d.scenario.seed)
    return stream if stream.sorted else None


def last_arrival_us(requests) -> int:
    """Latest arrival (µs) of a request list or stream; 0 when empty."""
    last = getattr(requests, "last_arrival_us", None)
    if last is not None:
        return max(last, 0)
    return max((r.arrival_us for r in requests), default=0)


def build_requests(d: RunDescription) -> tuple[list, int]:
    """The requests of the description's workload and the simulation horizon (µs)."""
    return build_workload(d)[:2]


def build_workload(d: RunDescription, *, lazy: bool = False) -> tuple[list, int, object | None, int]:
    """The requests of the workload, the simulation horizon (µs), the manager of its closed-loop
    sessions or clients (or None) and the workload seed; see :func:`source_workload`. With
    closed-loop clients (``workload.concurrency``, docs/workloads.md) the source's requests
    are their pool: no request is offered up front and the manager sends them."""
    w = d.scenario.workload
    if not w.closed_loop:
        return source_workload(d, lazy=lazy)
    return closed_loop_workload(d, source_workload)


def source_workload(d: RunDescription, *, lazy: bool = False) -> tuple[list, int, object | None, int]:
    """The requests of the workload, the simulation horizon (µs), the session manager of its
    closed-loop sessions (or None) and the workload seed. ``lazy``: a trace in arrival order
    comes as a :class:`~blis_simpy.workload.trace_stream.TraceRequestStream`, and a generated
    workload of standard clients bound by ``num_requests`` as a
    :class:`~blis_simpy.workload.generated_stream.GeneratedRequestStream` (both built as the
    run reaches them) instead of a list, unless an output needs the request objects."""
    s = d.scenario
    w = s.workload
    stream = lazy and not d.outputs.keep_requests
    if isinstance(w, SpecWorkload):
        return spec_workload(d, lazy=stream)
    if isinstance(w, TraceWorkload):
        from blis_simpy.workload import default_replay_horizon, trace_requests
        trace = trace_stream(d) if lazy else None
        if trace is not None:
            horizon = s.horizon_us if s.horizon_us is not None else trace.default_horizon_us()
            return trace, horizon, None, s.seed
        trace = load_trace(d)
        horizon = s.horizon_us if s.horizon_us is not None else default_replay_horizon(trace.records)
        return trace_requests(trace.records, s.seed), horizon, None, s.seed
    if w.time_varying:
        return time_varying_workload(d, stream)
    spec = distribution_workload_spec(d)
    horizon = s.horizon
    return generated(d, spec, horizon, w.num_requests, stream), horizon, None, s.seed


def spec_workload(d: RunDescription, *, check_only: bool = False, lazy: bool = False
                  ) -> tuple[list, int, object | None, int]:
    """A workload-spec workload (``kind: spec``; docs/workloads.md): the spec's ``seed``
    unless the scenario's ``seed`` is written or overridden; its ``horizon`` (if > 0) unless
    ``horizon_us`` is set; its ``num_requests`` unless ``workload.num_requests`` is. Errors
    point into the spec file, or at ``workload.spec.…`` of the scenario for an inline spec.
    ``check_only`` (validation): every check, no request generated (returns no requests).
    ``lazy``: a spec of standard clients bound by ``num_requests`` comes as a
    :class:`~blis_simpy.workload.generated_stream.GeneratedRequestStream`."""
    from blis_simpy.workload import _yaml, generate_workload
    from blis_simpy.workload.generator import check_workload
    from blis_simpy.workload.spec import parse_workload_spec
    s = d.scenario
    w = s.workload
    node = None
    if w.path:
        path = w.path
        try:
            data, node = _yaml.load_yaml(path)
        except ConfigError as exc:
            if exc.line is None and "workload.path" in d.overridden:
                raise ConfigError(exc.problem, file=exc.file, field="workload.path") from None
            raise
        base = os.path.dirname(path)
    else:
        path, data = None, w.spec
        base = os.path.dirname(d.src.path) if d.src.path else None

    def located(exc: ConfigError) -> ConfigError:
        if exc.file or not exc.field:
            return exc
        if path is not None:
            return _yaml.locate(exc, path, node)
        return ConfigError(exc.problem, file=d.src.path,
                           line=d.src.line(("workload", "spec") + _yaml.parse_field(exc.field)),
                           field=f"workload.spec.{exc.field}")

    seed = s.seed if d.seed_given else None
    try:
        spec = parse_workload_spec(data, path, node)
        if check_only:
            check_workload(spec, horizon=s.horizon_us, max_requests=w.num_requests, base_dir=base)
            return [], 0, None, 0
        kw = {"seed": seed, "horizon": s.horizon_us, "max_requests": w.num_requests,
              "base_dir": base}
        if lazy:
            from blis_simpy.workload.generated_stream import stream_workload
            stream = stream_workload(spec, **kw)
            if stream is not None:
                return stream, stream.horizon_us, None, stream.seed
        wl = generate_workload(spec, **kw)
    except ConfigError as exc:
        raise located(exc) from None
    return wl.requests, wl.horizon_us, wl.session_manager(), wl.seed
