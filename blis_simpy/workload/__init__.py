"""Workload sources (docs/workloads.md): distribution mode and presets, workload-spec v2 generation
(clients, cohorts, inference-perf, ServeGen, multi-turn and closed-loop sessions), TraceV2
reading/writing and trace replay. Every source ends as requests sorted by arrival.
"""

import importlib

#: public name -> the submodule that defines it. The submodules load on first use (PEP 562
#: ``__getattr__``), so a replay does not import the generator, sessions and workload-spec
#: models it never uses (docs/performance.md, "Start-up").
_EXPORTS = {
    "PRESETS": "distribution", "LengthParams": "distribution", "distribution_spec": "distribution",
    "preset_spec": "distribution",
    "GeneratedWorkload": "generator", "generate_requests": "generator", "generate_workload": "generator",
    "default_replay_horizon": "replay", "trace_requests": "replay",
    "SessionBlueprint": "sessions", "SessionCounters": "sessions", "SessionManager": "sessions",
    "ClientSpec": "spec", "DistSpec": "spec", "WorkloadSpecV2": "spec", "load_workload_spec": "spec",
    "validate_spec": "spec",
    "TRACE_COLUMNS": "tracev2", "TraceHeader": "tracev2", "TraceRecord": "tracev2", "TraceV2": "tracev2",
    "read_trace": "tracev2_read", "read_trace_header": "tracev2_read",
    "read_trace_records": "tracev2_read",
    "write_trace": "tracev2_write",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "PRESETS", "TRACE_COLUMNS", "ClientSpec", "DistSpec", "GeneratedWorkload", "LengthParams",
    "SessionBlueprint", "SessionCounters", "SessionManager", "TraceHeader", "TraceRecord",
    "TraceV2", "WorkloadSpecV2", "default_replay_horizon", "distribution_spec",
    "generate_requests", "generate_workload", "load_workload_spec", "preset_spec", "read_trace",
    "read_trace_header", "read_trace_records", "trace_requests", "validate_spec", "write_trace",
]
