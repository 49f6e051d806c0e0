"""Admission policies: accept or reject an arriving request (docs/control-plane.md,
"Admission").

Importing the package registers every built-in policy.
"""

from blis_simpy.admission.base import AdmissionPolicy, AlwaysAdmit
from blis_simpy.admission.policies import RejectAll, TierShed, TokenBucket, tier_priority

__all__ = ["AdmissionPolicy", "AlwaysAdmit", "RejectAll", "TierShed", "TokenBucket", "tier_priority"]
