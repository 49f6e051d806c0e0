"""The decision-trace summary printed under ``=== Trace Summary ===``
(docs/metrics.md, "Decision trace")."""

from __future__ import annotations

from collections import Counter

from blis_simpy.metrics.report import TraceSummary
from blis_simpy.trace.records import TraceRecords


def summarize(records: TraceRecords) -> TraceSummary:
    """Counts, target distribution and regret over the standard routing records; the PD
    pools' routing targets apart (``pool_target_distribution``).

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
    pools = {pool: Counter(r.chosen_instance for r in recs)
             for pool, recs in (("prefill", records.prefill_routings), ("decode", records.decode_routings))
             if recs}
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
        pool_target_distribution={pool: {k: c[k] for k in sorted(c)} for pool, c in pools.items()},
    )
