"""Latency models: how long one engine step takes, plus per-request overhead terms
(docs/latency-models.md).

Pure code: knows nothing of SimPy. The engine calls ``step_time_us`` once per step.
Importing this package registers every built-in backend: ``blackbox``, ``roofline``,
``crossmodel``, ``trained-roofline``, ``physics`` and ``trained-physics``.
"""

from blis_simpy.latency.base import BatchView, LatencyModel
from blis_simpy.latency.blackbox import BlackboxModel
from blis_simpy.latency.crossmodel import CrossModel
from blis_simpy.latency.physics import PhysicsModel
from blis_simpy.latency.roofline import RooflineModel
from blis_simpy.latency.trained_physics import TrainedPhysicsModel
from blis_simpy.latency.trained_roofline import TrainedRooflineModel

__all__ = ["BatchView", "LatencyModel", "BlackboxModel", "CrossModel", "RooflineModel",
           "PhysicsModel", "TrainedPhysicsModel", "TrainedRooflineModel"]
