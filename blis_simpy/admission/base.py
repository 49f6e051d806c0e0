"""The admission-policy family and always-admit (docs/control-plane.md, "Admission").

An admission policy is a plain synchronous decider returning ``(admitted, reason)``::

    class ShortOnly(AdmissionPolicy, name="short-only"):
        def admit(self, req, state):
            return (req.input_len <= 4096, "too long")

Policies may keep state (a token bucket does); one policy object serves the whole run.
A policy that never looks at ``state.snapshots`` may say so (``uses_snapshots = False``).
A policy that sheds by SLO tier sets ``sheds_by_tier = True``: every rejection is then
counted per class in the anomaly counters (``Shed (<class>)``).
"""

from __future__ import annotations

from typing import ClassVar

from blis_simpy.plugins import Pluggable
from blis_simpy.snapshot import RouterState


class AdmissionPolicy(Pluggable, family="admission policy"):
    #: rejections are counted per SLO class (``shed_by_tier``)
    sheds_by_tier: ClassVar[bool] = False
    #: False for a policy that never reads ``state.snapshots``: with always-fresh snapshots
    #: the cluster then skips building them (``state.snapshots`` is empty)
    uses_snapshots: ClassVar[bool] = True

    def __init__(self, params=None, **_ignored):
        self.params = params if params is not None else type(self).Params()

    def admit(self, req, state: RouterState) -> tuple[bool, str]:
        raise NotImplementedError


class AlwaysAdmit(AdmissionPolicy, name="always-admit", aliases=("",)):
    uses_snapshots = False

    def admit(self, req, state: RouterState) -> tuple[bool, str]:
        return True, ""
