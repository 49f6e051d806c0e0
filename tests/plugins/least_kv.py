"""A user-written routing plugin, as docs/extending.md describes.

``least-kv`` sends each request to the instance with the lowest KV-cache utilisation (the
most free cache), optionally skipping instances whose wait queue is too long. It declares
its own parameters; ``tie_break`` has the name the built-in routers use, so
``--routing-tie-break`` reaches it too. ``free-blocks`` is a scorer for the weighted router.

Load it from a scenario::

    plugins: [least_kv]            # a least_kv.py next to the scenario, or any importable module
    cluster:
      routing:
        policy: least-kv
        params: {max_queue: 8}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from blis_simpy.routing import Router, RoutingDecision, Scorer, break_tie


class LeastKV(Router, name="least-kv"):
    """Lowest ``kv_utilization`` wins; ties go to the lowest instance index by default."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        max_queue: int | None = Field(None, ge=0, description="skip instances with a longer wait queue")
        tie_break: Literal["random", "first"] = "first"

    def route(self, req, state):
        p = self.params
        snaps = state.snapshots
        cands = [j for j, s in enumerate(snaps) if p.max_queue is None or s.queue_depth <= p.max_queue]
        cands = cands or list(range(len(snaps)))
        best = min(snaps[j].kv_utilization for j in cands)
        tied = [j for j in cands if snaps[j].kv_utilization == best]
        chosen = snaps[break_tie(tied, p.tie_break, self.rng)]
        scores = {s.id: 1.0 - s.kv_utilization for s in snaps}   # for counterfactual regret
        return RoutingDecision(chosen.index, f"least-kv ({best:.3f})", scores)


class FreeBlocks(Scorer, name="free-blocks"):
    """Free KV blocks relative to the instance with the most."""

    def score(self, req, snapshots):
        most = max(s.free_kv_blocks for s in snapshots)
        return [s.free_kv_blocks / most if most > 0 else 1.0 for s in snapshots]
