"""Token bucket, reject-all and tier-shed admission (docs/control-plane.md, "Admission")."""

from __future__ import annotations

import logging
import math
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from blis_simpy.admission.base import AdmissionPolicy
from blis_simpy.snapshot import RouterState

log = logging.getLogger("blis_simpy.admission")


def _positive(v: float) -> float:
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"must be finite and > 0, got {v:g}")
    return v


PositiveFinite = Annotated[float, AfterValidator(_positive)]


class TokenBucket(AdmissionPolicy, name="token-bucket"):
    """Capacity C tokens, refilled at r tokens/s; a request costs its prompt length.

    Starts full with ``last = 0``. On each call, if ``clock > last``:
    ``tokens = min(C, tokens + (clock − last)·r/1e6)`` and ``last = clock``. Admit and
    subtract when ``tokens >= cost``, else reject (``"insufficient tokens"``).
    """

    uses_snapshots = False

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        capacity: PositiveFinite = Field(10000.0, description="bucket size, tokens")
        refill_rate: PositiveFinite = Field(1000.0, description="tokens per second")

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        self.capacity = float(self.params.capacity)
        self.refill_rate = float(self.params.refill_rate)
        self.tokens = self.capacity
        self.last_us = 0

    def admit(self, req, state: RouterState) -> tuple[bool, str]:
        clock = state.clock_us
        if clock > self.last_us:
            refill = float(clock - self.last_us) * self.refill_rate / 1e6
            self.tokens = min(self.capacity, self.tokens + refill)
            self.last_us = clock
        cost = float(req.input_len)
        if self.tokens >= cost:
            self.tokens -= cost
            return True, ""
        return False, "insufficient tokens"


class RejectAll(AdmissionPolicy, name="reject-all"):
    """Rejects everything (a test policy)."""

    uses_snapshots = False

    def admit(self, req, state: RouterState) -> tuple[bool, str]:
        return False, "reject-all"


#: SLO tier priorities; empty or unknown classes count as ``standard``.
TIER_PRIORITY = {"critical": 4, "standard": 3, "sheddable": 2, "batch": 1, "background": 0}


def tier_priority(slo_class: str) -> int:
    return TIER_PRIORITY.get(slo_class, 3)


class TierShed(AdmissionPolicy, name="tier-shed"):
    """Under overload, shed classes below a minimum priority (docs/control-plane.md; the
    parameters BLIS cannot set: divergences.md #12).

    ``batch`` and ``background`` are always admitted. ``max_load`` = the highest effective
    load over the snapshots (0 if none); at or below ``threshold`` everything is admitted,
    above it a request whose class priority is below ``min_priority`` is rejected.
    """

    sheds_by_tier = True

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        threshold: int = Field(0, ge=0, description="max effective load still admitting everyone")
        min_priority: int = Field(3, ge=0, le=4, description="lowest class priority admitted under overload")

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        if self.params.min_priority == 0:
            log.warning("tier-shed with min priority 0 admits every request (behaves like always-admit)")

    def admit(self, req, state: RouterState) -> tuple[bool, str]:
        cls = req.slo_class
        if cls in ("batch", "background"):
            return True, ""
        max_load = max((s.effective_load for s in state.snapshots), default=0)
        p = self.params
        if max_load <= p.threshold:
            return True, ""
        prio = tier_priority(cls)
        if prio < p.min_priority:
            return False, f"tier-shed: class={cls} priority={prio} < min={p.min_priority} load={max_load}"
        return True, ""
