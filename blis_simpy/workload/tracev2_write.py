"""Writing a TraceV2 trace (docs/workloads.md, "TraceV2") in BLIS's export layout.

The output is byte for byte what BLIS writes: Go ``encoding/csv`` quoting, ``\\n`` line ends,
``true``/``false`` booleans, shortest float text, Go yaml's header layout. Our extension
columns are written only when some record carries them, so a trace without them is BLIS's
layout. Files are staged (:mod:`blis_simpy.atomic`) and renamed into place together (never
half-written, never one file of the pair without the other).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel

from blis_simpy.atomic import Batch
from blis_simpy.workload import _yaml
from blis_simpy.workload.tracev2 import (
    EXTENSION_COLUMNS,
    TOKEN_IDS_COLUMN,
    TRACE_COLUMNS,
    TraceHeader,
    TraceRecord,
)


def _go_float_g(x: float) -> str:
    """Go's ``strconv.FormatFloat(x, 'g', -1, 64)`` (what Go's yaml writes for floats)."""
    if math.isnan(x):
        return ".nan"
    if math.isinf(x):
        return ".inf" if x > 0 else "-.inf"
    if x == 0:
        return "-0" if math.copysign(1, x) < 0 else "0"
    sci = np.format_float_scientific(x, unique=True, trim="-")  # e.g. "1.5e+06", "9e-01"
    mant, exp = sci.split("e")
    e = int(exp)
    if e < -4 or e >= 6:  # Go: %e when exp < -4 or exp >= 6 for the shortest form
        return f"{mant}e{'-' if e < 0 else '+'}{abs(e):02d}"
    return np.format_float_positional(x, unique=True, trim="-")


def _yaml_str(s: str) -> str:
    """A YAML scalar for ``s``: plain when it reads back as the same string, else quoted."""
    if s and s == s.strip() and not re.search(r"[:#\[\]{},&*!|>'\"%@`]|^[-?]", s):
        try:
            if yaml.load(s, Loader=_yaml._Loader) == s:
                return s
        except yaml.YAMLError:
            pass
    return yaml.dump(s, Dumper=yaml.SafeDumper, default_style='"', allow_unicode=True,
                     width=math.inf).rstrip("\n")


def _yaml_scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_float_g(v)
    return _yaml_str(str(v))


def header_to_yaml(header: TraceHeader) -> str:
    """The header as BLIS writes it (Go yaml: field order, empty optionals left out, 4-space
    indentation for nested sections)."""
    out = []
    omit_empty = {"created_at", "workload_seed", "workload_spec", "server", "network"}
    for name in TraceHeader.model_fields:
        v = getattr(header, name)
        if name in omit_empty and (v is None or v == ""):
            continue
        if isinstance(v, BaseModel):
            out.append(f"{name}:")
            for sub in type(v).model_fields:
                out.append(f"    {sub}: {_yaml_scalar(getattr(v, sub))}")
        else:
            out.append(f"{name}: {_yaml_scalar(v)}")
    return "\n".join(out) + "\n"


def _csv_field(s: str) -> str:
    """Go ``encoding/csv`` quoting: quote if the field holds , " CR LF, starts with a space
    or is exactly ``\\.``."""
    if s == "":
        return s
    if ("," in s or '"' in s or "\r" in s or "\n" in s or s[0].isspace() or s == "\\."):
        return '"' + s.replace('"', '""') + '"'
    return s


def _format_ratio(x: float) -> str:
    return np.format_float_positional(float(x), unique=True, trim="-")


def _extension_cell(r: TraceRecord, name: str) -> str:
    if name == TOKEN_IDS_COLUMN:
        ids = r.input_token_ids
        return "" if ids is None else " ".join(map(str, np.asarray(ids).tolist()))
    return str(r.scheduled_time_us)


def _has_extension(r: TraceRecord, name: str) -> bool:
    return r.input_token_ids is not None if name == TOKEN_IDS_COLUMN else r.scheduled_time_us > 0


def extension_columns(records: Iterable[TraceRecord]) -> tuple[str, ...]:
    """The extension columns a CSV of ``records`` carries: those some record has (IDs not
    None; a scheduling time > 0), in :data:`EXTENSION_COLUMNS` order."""
    records = list(records)
    return tuple(c for c in EXTENSION_COLUMNS if any(_has_extension(r, c) for r in records))


def record_to_csv_line(r: TraceRecord, with_ids: bool = False, *,
                       extensions: tuple[str, ...] | None = None) -> str:
    """One CSV row (with trailing newline) in BLIS's export format, then the cells of the
    ``extensions`` columns (:data:`EXTENSION_COLUMNS` names, in the given order; an unknown
    ``input_token_ids`` is empty, an unknown ``scheduled_time_us`` 0). ``with_ids`` is the
    short form of ``extensions=("input_token_ids",)``."""
    q = _csv_field
    if extensions is None:
        extensions = (TOKEN_IDS_COLUMN,) if with_ids else ()
    tail = "".join("," + _extension_cell(r, c) for c in extensions)
    return ",".join((
        str(r.request_id), q(r.client_id), q(r.tenant_id), q(r.slo_class), q(r.session_id),
        str(r.round_index), q(r.prefix_group), str(r.prefix_length),
        "true" if r.streaming else "false", str(r.input_tokens), str(r.output_tokens),
        str(r.text_tokens), str(r.image_tokens), str(r.audio_tokens), str(r.video_tokens),
        _format_ratio(r.reason_ratio), q(r.model), str(r.deadline_us),
        str(r.server_input_tokens), str(r.arrival_time_us), str(r.send_time_us),
        str(r.first_chunk_time_us), str(r.last_chunk_time_us), str(r.num_chunks),
        q(r.status), q(r.error_message), q(r.finish_reason))) + tail + "\n"


def trace_csv_text(records: Iterable[TraceRecord]) -> str:
    """The whole CSV: header row and rows. Each extension column is present only when at
    least one record carries it (:func:`extension_columns`), so a trace without them is
    BLIS's layout, byte for byte."""
    records = list(records)
    ext = extension_columns(records)
    head = ",".join(TRACE_COLUMNS + ext) + "\n"
    return head + "".join(record_to_csv_line(r, extensions=ext) for r in records)


def write_trace(prefix_path: str | os.PathLike, header: TraceHeader | None,
                records: Iterable[TraceRecord], *, field: str | None = None,
                batch: Batch | None = None) -> tuple[Path, Path]:
    """Write ``<prefix>.yaml`` and ``<prefix>.csv``; returns both paths.

    ``header`` None means BLIS's export header (version 2, µs, generated, no warm-up). Both
    files are staged (:mod:`blis_simpy.atomic`) and renamed only when both are complete, so a
    failure never leaves a half-written file nor one file of the pair. With ``batch`` the pair
    commits with the batch. Errors are ConfigErrors naming the user's file and ``field``.
    """
    prefix = Path(prefix_path)
    return write_trace_files(prefix.with_name(prefix.name + ".yaml"),
                             prefix.with_name(prefix.name + ".csv"), header, records,
                             field=field, batch=batch)


def write_trace_files(header_path: str | os.PathLike, data_path: str | os.PathLike,
                      header: TraceHeader | None, records: Iterable[TraceRecord], *,
                      field: str | None = None, batch: Batch | None = None) -> tuple[Path, Path]:
    """:func:`write_trace` to two explicit paths (``--trace-header`` / ``--trace-data`` of
    ``observe``): the same content, staged files and all-or-nothing renames."""
    yaml_path, csv_path = Path(header_path), Path(data_path)
    if header is None:
        header = TraceHeader(trace_version=2)
    body = trace_csv_text(records)
    own = batch is None
    pair = Batch()
    try:
        for path, text in ((yaml_path, header_to_yaml(header)), (csv_path, body)):
            staged = pair.open(path, field=field, what="cannot write trace", binary=False,
                               perm=0o666)
            try:
                staged.file.write(text)
            except OSError as exc:
                raise staged.error(exc) from None
        if own:
            pair.commit()
        else:
            for staged in pair.staged:
                batch.add(staged)
            pair.staged.clear()
    finally:
        pair.abort()
    return yaml_path, csv_path
