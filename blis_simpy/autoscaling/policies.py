"""The built-in autoscaling policies (docs/control-plane.md, "Autoscaling").

* ``target-utilization`` — Kubernetes' Horizontal Pod Autoscaler rule on KV utilisation or
  batch occupancy: ``desired = ceil(current × metric / target)``, no change while the ratio
  ``metric / target`` is within ``tolerance`` of 1, then the HPA's stabilisation windows
  (:class:`Stabilizer`). Source: kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale
  ("Algorithm details", "Stabilization window").
* ``queue-depth`` — the same rule on the waiting requests per instance against
  ``target_per_instance``.
* ``scheduled`` — the instance count by time of day, from a schedule.

``metric`` of a pool is the mean over the instances serving or loading (a loading instance
counts as idle, as the HPA counts a not-yet-ready pod when it scales up), so
``current × metric`` is the sum over the serving instances.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from blis_simpy.autoscaling.base import AutoscalePolicy, AutoscaleState, PoolState
from blis_simpy.units import seconds_to_us

#: one simulated day, µs (the period of a schedule)
DAY_US = 86_400_000_000
#: a ratio this close to an integer from above is that integer (float noise in ``ceil``)
_CEIL_SLACK = 1e-9
MAX_WINDOW_S = 86_400.0


def ceil_count(x: float) -> int:
    """``ceil(x)`` for a count computed in floating point (``x`` ≥ 0), with
    :data:`_CEIL_SLACK` of slack so that 2.0000000000000004 is 2."""
    return max(0, math.ceil(x - _CEIL_SLACK))


class StabilizedParams(BaseModel):
    """Hysteresis of the HPA: ``tolerance`` (a ratio within it of 1 keeps the count; the HPA's
    default 0.1) and the stabilisation windows, s (the HPA's defaults: 300 down, 0 up)."""

    model_config = ConfigDict(extra="forbid")
    tolerance: float = Field(0.1, ge=0, lt=1, allow_inf_nan=False)
    scale_down_stabilization_s: float = Field(300.0, ge=0, le=MAX_WINDOW_S, allow_inf_nan=False)
    scale_up_stabilization_s: float = Field(0.0, ge=0, le=MAX_WINDOW_S, allow_inf_nan=False)


class Stabilizer:
    """The HPA's stabilisation of recommendations, per pool: among the recommendations of the
    last ``down`` µs (this one included) the highest bounds a scale-down, among those of the
    last ``up`` µs the lowest bounds a scale-up; the count changes only past both."""

    def __init__(self, down_us: int, up_us: int):
        self.down_us = down_us
        self.up_us = up_us
        self.history: dict[str, deque[tuple[int, int]]] = {}

    def apply(self, pool: str, current: int, raw: int, now_us: int) -> int:
        hist = self.history.setdefault(pool, deque())
        hist.append((now_us, raw))
        keep = max(self.down_us, self.up_us)
        while hist[0][0] <= now_us - keep and len(hist) > 1:
            hist.popleft()
        down = max(n for t, n in hist if t > now_us - self.down_us or t == now_us)
        up = min(n for t, n in hist if t > now_us - self.up_us or t == now_us)
        out = current
        if out < up:
            out = up
        if out > down:
            out = down
        return out


class _HPARule(AutoscalePolicy):
    """``desired = ceil(total / target)`` per pool with the HPA's tolerance and windows;
    subclasses say what ``total`` and ``target`` are (:meth:`load`)."""

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        p = self.params
        self.stabilizer = Stabilizer(seconds_to_us(p.scale_down_stabilization_s),
                                     seconds_to_us(p.scale_up_stabilization_s))

    def load(self, pool: PoolState, state: AutoscaleState) -> tuple[float, float]:
        """``(total over the serving instances, target per instance)``."""
        raise NotImplementedError

    def recommend(self, pool: PoolState, state: AutoscaleState | None = None) -> int:
        """The HPA's raw recommendation for ``pool`` (before stabilisation)."""
        if state is None:
            state = AutoscaleState((pool,), 0)
        total, target = self.load(pool, state)
        current = pool.current
        if current > 0 and abs(total / current / target - 1.0) <= self.params.tolerance:
            return current
        return ceil_count(total / target)

    def desired(self, state: AutoscaleState) -> dict[str, int]:
        return {p.name: self.stabilizer.apply(p.name, p.current, self.recommend(p, state),
                                              state.clock_us)
                for p in state.pools}


class TargetUtilization(_HPARule, name="target-utilization"):
    """KV utilisation (``metric: kv``) or batch occupancy (``batch``: running requests over
    ``max_num_running_reqs``) per instance against ``target`` (a fraction)."""

    class Params(StabilizedParams):
        metric: Literal["kv", "batch"] = "kv"
        target: float = Field(0.7, gt=0, le=1, allow_inf_nan=False)

    def load(self, pool: PoolState, state: AutoscaleState) -> tuple[float, float]:
        snaps = pool.serving
        if self.params.metric == "kv":
            vals = pool.per_instance(s.kv_utilization for s in snaps)
        else:
            cap = max(pool.max_num_running_reqs, 1)
            vals = pool.per_instance(s.batch_size / cap for s in snaps)
        return sum(vals), self.params.target


class QueueDepth(_HPARule, name="queue-depth"):
    """Waiting requests (queue depth, summed over an instance's ranks) per instance against
    ``target_per_instance``. Requests waiting in a gateway queue in front of the cluster wait
    too: they count for the pool they enter first (the one pool, or ``prefill``)."""

    class Params(StabilizedParams):
        target_per_instance: float = Field(4.0, gt=0, le=1e9, allow_inf_nan=False)

    def load(self, pool: PoolState, state: AutoscaleState) -> tuple[float, float]:
        waiting = sum(s.queue_depth for s in pool.serving)
        if pool.name in ("", "prefill"):
            waiting += state.gateway_queued
        return float(waiting), self.params.target_per_instance


class ScheduleEntry(BaseModel):
    """From ``at_s`` (seconds after midnight) on, ``instances`` instances: one count for every
    pool, or ``{pool: count}`` (prefill/decode pools; a pool not named keeps its count)."""

    model_config = ConfigDict(extra="forbid")
    at_s: float = Field(ge=0, lt=86_400, allow_inf_nan=False)
    instances: Annotated[int, Field(ge=0, le=1_000_000)] | dict[
        Literal["", "prefill", "decode"], Annotated[int, Field(ge=0, le=1_000_000)]]


class Scheduled(AutoscalePolicy, name="scheduled"):
    """The instance count by time of day: the entry with the latest ``at_s`` at or before the
    time of day (the last entry before the first one: the schedule wraps at midnight). The
    run starts at ``start_s`` seconds after midnight; the time of day is
    ``(start_s + t) mod 86400 s``."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        schedule: list[ScheduleEntry] = Field(min_length=1, max_length=100_000)
        start_s: float = Field(0.0, ge=0, lt=86_400, allow_inf_nan=False)

        @field_validator("schedule")
        @classmethod
        def _sorted(cls, v: list[ScheduleEntry]) -> list[ScheduleEntry]:
            times = [e.at_s for e in v]
            if any(b <= a for a, b in zip(times, times[1:], strict=False)):
                raise ValueError("entries must be in increasing at_s order, each time once")
            return v

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        self.times_us = [seconds_to_us(e.at_s) for e in self.params.schedule]
        self.counts = [e.instances for e in self.params.schedule]
        self.start_us = seconds_to_us(self.params.start_s)

    def count_at(self, t_us: int) -> int | dict[str, int]:
        """The scheduled count (or counts by pool) at simulated time ``t_us`` (µs)."""
        tod = (self.start_us + t_us) % DAY_US
        k = -1                       # the last entry (yesterday's) until the first one
        for i, at in enumerate(self.times_us):
            if at <= tod:
                k = i
            else:
                break
        return self.counts[k]

    def check_pools(self, names: list[str]) -> str | None:
        """An entry naming a pool the deployment does not have is an error."""
        for k, e in enumerate(self.params.schedule):
            if isinstance(e.instances, dict):
                unknown = sorted(set(e.instances) - set(names))
                if unknown:
                    return (f"schedule[{k}] names the pool(s) {unknown}; this deployment's pools "
                            f"are {names} (one count for every pool: an int)")
        return None

    def desired(self, state: AutoscaleState) -> dict[str, int]:
        n = self.count_at(state.clock_us)
        if isinstance(n, dict):
            return {p.name: n.get(p.name, p.current) for p in state.pools}
        return {p.name: n for p in state.pools}
