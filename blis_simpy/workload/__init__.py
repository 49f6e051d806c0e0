"""Workload sources (docs/workloads.md): distribution mode and presets, workload-spec v2 generation
(clients, cohorts, inference-perf, ServeGen, multi-turn and closed-loop sessions), TraceV2
reading/writing and trace replay. Every source ends as requests sorted by arrival.
"""

from blis_simpy.workload.distribution import (
    PRESETS,
    LengthParams,
    distribution_spec,
    preset_spec,
)
from blis_simpy.workload.generator import GeneratedWorkload, generate_requests, generate_workload
from blis_simpy.workload.replay import default_replay_horizon, trace_requests
from blis_simpy.workload.sessions import SessionBlueprint, SessionCounters, SessionManager
from blis_simpy.workload.spec import (
    ClientSpec,
    DistSpec,
    WorkloadSpecV2,
    load_workload_spec,
    validate_spec,
)
from blis_simpy.workload.tracev2 import TRACE_COLUMNS, TraceHeader, TraceRecord, TraceV2
from blis_simpy.workload.tracev2_read import read_trace, read_trace_header, read_trace_records
from blis_simpy.workload.tracev2_write import write_trace

__all__ = [
    "PRESETS", "TRACE_COLUMNS", "ClientSpec", "DistSpec", "GeneratedWorkload", "LengthParams",
    "SessionBlueprint", "SessionCounters", "SessionManager", "TraceHeader", "TraceRecord",
    "TraceV2", "WorkloadSpecV2", "default_replay_horizon", "distribution_spec",
    "generate_requests", "generate_workload", "load_workload_spec", "preset_spec", "read_trace",
    "read_trace_header", "read_trace_records", "trace_requests", "validate_spec", "write_trace",
]
