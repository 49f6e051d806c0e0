"""Admission policies: accept or reject an arriving request (spec/05 §3)."""

from blis_simpy.admission.base import AdmissionPolicy, AlwaysAdmit

__all__ = ["AdmissionPolicy", "AlwaysAdmit"]
