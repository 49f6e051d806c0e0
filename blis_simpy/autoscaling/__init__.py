"""Autoscaling policies (docs/control-plane.md, "Autoscaling"): the registry family and its
built-in members. Importing the package registers them."""

from blis_simpy.autoscaling import policies  # noqa: F401  (registers the built-in policies)
from blis_simpy.autoscaling.base import AutoscalePolicy, AutoscaleState, PoolState

__all__ = ["AutoscalePolicy", "AutoscaleState", "PoolState"]
