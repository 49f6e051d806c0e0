"""Deployment size and cost of a run (docs/metrics.md, "Deployment and cost").

* total GPUs = Σ over the instances of TP × DP (every instance of a prefill or decode pool
  with its pool's TP; data parallelism is refused with pools);
* the price of a GPU-hour (USD) is the one given (``--gpu-hour-cost`` / ``cost.gpu_hour_usd``,
  for every GPU), else each instance's GPU catalog ``price_per_hour_usd`` — unknown when an
  instance's GPU has none (the shipped catalog carries no prices);
* cost per hour = Σ GPUs × price; cost per million output tokens = cost per hour over the
  output tokens of one simulated hour at the run's ``tokens_per_sec``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DeploymentCost", "deployment_cost"]


@dataclass(frozen=True)
class DeploymentCost:
    """The ``"deployment"`` section. USD; None = unknown."""

    total_gpus: int
    #: USD per GPU-hour: the one price, or the mean over the GPUs when instances differ
    gpu_hour_usd: float | None = None
    cost_per_hour_usd: float | None = None
    cost_per_million_output_tokens_usd: float | None = None

    @property
    def priced(self) -> bool:
        return self.cost_per_hour_usd is not None

    def to_dict(self) -> dict:
        return {"total_gpus": self.total_gpus, "gpu_hour_usd": self.gpu_hour_usd,
                "cost_per_hour_usd": self.cost_per_hour_usd,
                "cost_per_million_output_tokens_usd": self.cost_per_million_output_tokens_usd}


def deployment_cost(instances: Iterable[tuple[int, float | None]], tokens_per_sec: float, *,
                    gpu_hour_usd: float | None = None) -> DeploymentCost:
    """``instances``: ``(GPUs, catalog price per GPU-hour or None)`` of each configured
    instance (an engine of DP ranks counts its TP × DP GPUs). ``gpu_hour_usd`` (given)
    replaces every catalog price. ``tokens_per_sec``: output tokens per simulated second."""
    gpus = 0
    cost: float | None = 0.0
    for n, price in instances:
        gpus += n
        p = gpu_hour_usd if gpu_hour_usd is not None else price
        if p is None or cost is None:
            cost = None
        else:
            cost += n * p
    if cost is None or gpus == 0:
        return DeploymentCost(gpus)
    per_m = cost / (tokens_per_sec * 3600.0) * 1e6 if tokens_per_sec > 0 else None
    return DeploymentCost(gpus, gpu_hour_usd if gpu_hour_usd is not None else cost / gpus, cost,
                          per_m)
