"""Counterfactual candidates and regret of a routing decision (docs/metrics.md,
"Decision trace").

Over the snapshots the policy was given, each instance is scored by the policy's score map
or, when the policy has none, by ``−effective_load``. Instances are ranked by score
(descending) then instance ID (ascending, string order); the top K are the candidates and
``regret = max(0, best − score(chosen))``. A chosen instance that is not among the
snapshots gives no candidates and regret 0. With K = 0 nothing is computed.
"""

from __future__ import annotations

from blis_simpy.snapshot import InstanceSnapshot
from blis_simpy.trace.records import Candidate


def counterfactual(snapshots: tuple[InstanceSnapshot, ...], scores: dict[str, float] | None,
                   chosen_id: str, k: int) -> tuple[tuple[Candidate, ...], float]:
    """``(candidates, regret)`` for choosing ``chosen_id`` among ``snapshots``."""
    if k <= 0 or not snapshots:
        return (), 0.0
    if scores is not None:
        scored = [(scores.get(s.id, 0.0), s) for s in snapshots]
    else:
        scored = [(-float(s.effective_load), s) for s in snapshots]
    chosen = next((sc for sc, s in scored if s.id == chosen_id), None)
    if chosen is None:
        return (), 0.0
    scored.sort(key=lambda t: (-t[0], t[1].id))
    best = scored[0][0]
    cands = tuple(Candidate(s.id, sc, s.queue_depth, s.batch_size, s.in_flight_requests,
                            s.kv_utilization, s.free_kv_blocks) for sc, s in scored[:k])
    return cands, max(0.0, best - chosen)
