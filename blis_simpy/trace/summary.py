"""The decision-trace summary printed under ``=== Trace Summary ===``
(docs/metrics.md, "Decision trace")."""

from __future__ import annotations

from collections import Counter

from blis_simpy.metrics.report import TraceSummary
from blis_simpy.trace.records import TraceRecords


def summarize(records: TraceRecords) -> TraceSummary:
    """Counts, target distribution and regret over the standard routing records.

    ``total_decisions`` = admission records; mean/max regret over standard routing records
    (0 when there are none); PD fields from the disaggregation and KV-transfer records.
    """
    admitted = sum(1 for r in records.admissions if r.admitted)
    targets = Counter(r.chosen_instance for r in records.routings)
    total_regret = 0.0
    max_regret = 0.0
    for r in records.routings:
        total_regret += r.regret
        if r.regret > max_regret:
            max_regret = r.regret
    n = len(records.routings)
    transfers = records.kv_transfers
    dur = 0.0
    for t in transfers:
        dur += float(t.transfer_duration_us)
    return TraceSummary(
        total_decisions=len(records.admissions),
        admitted_count=admitted,
        rejected_count=len(records.admissions) - admitted,
        unique_targets=len(targets),
        target_distribution={k: targets[k] for k in sorted(targets)},
        mean_regret=total_regret / n if n else 0.0,
        max_regret=max_regret,
        disaggregation_count=len(records.disaggregations),
        disaggregated_count=sum(1 for r in records.disaggregations if r.disaggregate),
        kv_transfer_count=len(transfers),
        mean_transfer_duration=dur / len(transfers) if transfers else 0.0,
    )
