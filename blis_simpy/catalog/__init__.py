"""Offline catalogs: GPUs, model architectures and trained latency coefficients.

Pure data and lookups (no SimPy, no network). The figures are facts carried from BLIS's
reference data and public model/GPU specifications into the project's own YAML format.
"""

from blis_simpy.catalog.types import GPUSpec, ModelConfig

__all__ = ["GPUSpec", "ModelConfig"]
