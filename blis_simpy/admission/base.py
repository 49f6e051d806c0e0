"""The admission-policy family and always-admit (spec/05 §3).

An admission policy is a plain synchronous decider returning ``(admitted, reason)``::

    class ShortOnly(AdmissionPolicy, name="short-only"):
        def admit(self, req, state):
            return (req.input_len <= 4096, "too long")
"""

from __future__ import annotations

from blis_simpy.cluster.snapshot import RouterState
from blis_simpy.plugins import Pluggable


class AdmissionPolicy(Pluggable, family="admission policy"):
    def __init__(self, params=None):
        self.params = params

    def admit(self, req, state: RouterState) -> tuple[bool, str]:
        raise NotImplementedError


class AlwaysAdmit(AdmissionPolicy, name="always-admit", aliases=("",)):
    def admit(self, req, state: RouterState) -> tuple[bool, str]:
        return True, ""
