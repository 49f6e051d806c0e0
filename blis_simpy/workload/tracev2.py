"""TraceV2: BLIS's workload trace format, a YAML header plus a CSV (docs/workloads.md,
"TraceV2").

Reading is strict: unknown header keys, malformed numbers, negative counts, out-of-range
ratios and deadlines before arrival are :class:`~blis_simpy.errors.ConfigError` naming the
file, the 1-based line and the column / key. Writing reproduces BLIS's export layout byte for
byte (Go ``encoding/csv`` quoting, ``\\n`` line ends, ``true``/``false`` booleans, shortest
float text) and goes through temporary files renamed into place.

Units: every ``*_us`` column is an integer number of microseconds; token columns are token
counts; ``reason_ratio`` is a fraction in [0, 1].

Our extensions (docs/workloads.md): optional columns after the 27 BLIS ones, recognised by
their name in the header row, in any order (other extra columns are ignored, as BLIS does):

* ``input_token_ids`` — the request's full prompt token IDs (prefix included),
  space-separated decimal integers, empty when unknown;
* ``scheduled_time_us`` — when the server first scheduled the request (integer µs on the
  trace's time origin, like ``send_time_us``); 0 or empty = unknown.

Each is written only when at least one record carries it (IDs; a positive scheduling time),
always in that order, so a trace without them is byte-identical to BLIS's export, and BLIS's
reader (which tolerates extra columns) still reads ours.

This module is the format itself: the column names, the header model and the record.
Reading is :mod:`blis_simpy.workload.tracev2_read`, writing
:mod:`blis_simpy.workload.tracev2_write`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

TRACE_COLUMNS: tuple[str, ...] = (
    "request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index",
    "prefix_group", "prefix_length", "streaming", "input_tokens", "output_tokens",
    "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio", "model",
    "deadline_us", "server_input_tokens", "arrival_time_us", "send_time_us",
    "first_chunk_time_us", "last_chunk_time_us", "num_chunks", "status", "error_message",
    "finish_reason",
)
NUM_COLUMNS = len(TRACE_COLUMNS)
#: our extension column: full prompt token IDs, space-separated
TOKEN_IDS_COLUMN = "input_token_ids"
#: our extension column: first scheduling by the server, µs on the trace's origin (0 = unknown)
SCHEDULED_COLUMN = "scheduled_time_us"
#: our extension columns, in the order they are written after the 27 BLIS ones
EXTENSION_COLUMNS: tuple[str, ...] = (TOKEN_IDS_COLUMN, SCHEDULED_COLUMN)
#: cap on the token IDs one CSV file may carry (all rows together)
MAX_TOKEN_IDS_PER_FILE = 10_000_000

# ---------------------------------------------------------------------------------- header

NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TraceServer(_Strict):
    """The serving configuration a real trace was recorded against (metadata only)."""

    type: str = ""
    model: str = ""
    tensor_parallel: NonNegInt = 0
    max_num_seqs: NonNegInt = 0
    block_size: NonNegInt = 0
    gpu_memory_utilization: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
    max_model_len: NonNegInt = 0


class TraceNetwork(_Strict):
    """Measured client↔server network of a real trace; ``measured_rtt_ms`` in ms."""

    measured_rtt_ms: NonNegFloat = 0.0


class TraceHeader(_Strict):
    """The YAML header of a TraceV2 trace. Only version 2 with µs timestamps is accepted."""

    trace_version: Literal[2]
    time_unit: Literal["microseconds"] = "microseconds"
    created_at: str = ""
    mode: Literal["real", "generated"] = "generated"
    warm_up_requests: NonNegInt = 0
    workload_seed: int | None = None
    workload_spec: str = ""
    server: TraceServer | None = None
    network: TraceNetwork | None = None


# ---------------------------------------------------------------------------------- records

@dataclass(slots=True)
class TraceRecord:
    """One CSV row. The first 27 fields are the TraceV2 columns, in order; then our optional
    extension columns: ``input_token_ids`` (an int32 array of the full prompt, prefix
    included, or None when unknown) and ``scheduled_time_us`` (the server's first scheduling
    of the request, µs on the trace's origin; 0 = unknown)."""

    request_id: int = 0
    client_id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    session_id: str = ""
    round_index: int = 0
    prefix_group: str = ""
    prefix_length: int = 0          # tokens of the shared group prefix
    streaming: bool = False
    input_tokens: int = 0           # suffix tokens (excluding the prefix)
    output_tokens: int = 0
    text_tokens: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0
    video_tokens: int = 0
    reason_ratio: float = 0.0
    model: str = ""
    deadline_us: int = 0            # absolute µs; 0 = no deadline
    server_input_tokens: int = 0
    arrival_time_us: int = 0
    send_time_us: int = 0
    first_chunk_time_us: int = 0
    last_chunk_time_us: int = 0
    num_chunks: int = 0
    status: str = "ok"
    error_message: str = ""
    finish_reason: str = ""
    # not part of ==: compare arrays with np.array_equal
    input_token_ids: np.ndarray | None = field(default=None, compare=False)
    scheduled_time_us: int = 0      # µs on the trace's origin; 0 = unknown


assert tuple(f.name for f in fields(TraceRecord))[:NUM_COLUMNS] == TRACE_COLUMNS
assert fields(TraceRecord)[NUM_COLUMNS].name == TOKEN_IDS_COLUMN
assert tuple(f.name for f in fields(TraceRecord))[NUM_COLUMNS:] == EXTENSION_COLUMNS


@dataclass
class TraceV2:
    """A loaded trace: the header and the rows in file order."""

    header: TraceHeader
    records: list[TraceRecord] = field(default_factory=list)
