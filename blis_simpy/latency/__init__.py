"""Latency models: how long one engine step takes, plus per-request overhead terms (spec/04).

Pure code: knows nothing of SimPy. The engine calls ``step_time`` once per step.
"""

from blis_simpy.latency.base import BatchView, LatencyModel
from blis_simpy.latency.blackbox import BlackboxModel

__all__ = ["BatchView", "LatencyModel", "BlackboxModel"]
