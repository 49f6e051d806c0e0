"""Read-only views of instances that control-plane policies decide on (spec/05 §2).

Policies never see an :class:`~blis_simpy.engine.instance.Instance`; they get a
:class:`RouterState`: one :class:`InstanceSnapshot` per routable instance (index order) and
the clock. ``effective_load`` counts queued requests twice on purpose (queue depth plus the
synchronous in-flight count compensates stale snapshots).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    id: str
    index: int
    queue_depth: int = 0
    batch_size: int = 0
    kv_utilization: float = 0.0
    free_kv_blocks: int = 0
    cache_hit_rate: float = 0.0
    in_flight_requests: int = 0
    model: str = ""

    @property
    def effective_load(self) -> int:
        return self.queue_depth + self.batch_size + self.in_flight_requests


@dataclass(frozen=True, slots=True)
class RouterState:
    """What admission and routing policies see for one request."""

    snapshots: tuple[InstanceSnapshot, ...]
    clock_us: int
