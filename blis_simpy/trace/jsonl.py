"""The decision trace as JSON Lines (``--trace-output-decisions FILE``; docs/metrics.md,
"Decision trace").

One JSON object per record, ``"kind"`` first, then the record's fields as
:mod:`blis_simpy.trace.records` names them (times in integer µs, the ``_us`` keys; ``scores``
an object or null; ``candidates`` a list of objects). The kinds come in this order, each in
event order: ``admission``, ``gateway`` (with a gateway queue), ``routing``, ``disaggregation``, ``prefill_routing``,
``decode_routing``, ``kv_transfer``. The file is written all-or-nothing
(:mod:`blis_simpy.atomic`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict

from blis_simpy.trace.records import TraceRecords

#: (kind, the TraceRecords list it comes from), in file order
KINDS = (("admission", "admissions"), ("gateway", "gateway"), ("routing", "routings"), ("disaggregation", "disaggregations"),
         ("prefill_routing", "prefill_routings"), ("decode_routing", "decode_routings"),
         ("kv_transfer", "kv_transfers"))

FIELD = "--trace-output-decisions"


def record_lines(records: TraceRecords) -> Iterator[str]:
    """One JSON text per record (no newline), in file order."""
    for kind, attr in KINDS:
        for rec in getattr(records, attr):
            yield json.dumps({"kind": kind, **asdict(rec)}, separators=(",", ":"))


def write_jsonl(records: TraceRecords, path: str | os.PathLike, batch=None) -> None:
    """Write ``records`` to ``path``; with ``batch`` (:class:`blis_simpy.atomic.Batch`) the
    file commits with the batch's other outputs, else now."""
    from blis_simpy.atomic import atomic_write
    with atomic_write(path, batch=batch, field=FIELD, what="cannot write the decision trace",
                      binary=False) as f:
        for line in record_lines(records):
            f.write(line + "\n")
