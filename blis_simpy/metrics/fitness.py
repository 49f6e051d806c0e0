"""Fitness of a run (docs/metrics.md, "Fitness"): weighted, normalised throughput and latency components,
printed under ``=== Fitness Evaluation ===``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from blis_simpy.metrics.percentile import Distribution
from blis_simpy.metrics.raw import raw_throughput
from blis_simpy.metrics.records import InstanceMetrics

__all__ = ["FITNESS_KEYS", "FitnessResult", "compute_fitness"]

FITNESS_KEYS = ("throughput", "tokens_per_sec", "p99_ttft", "p50_ttft", "mean_ttft",
                "p99_e2e", "p50_e2e", "mean_e2e")


@dataclass(frozen=True, slots=True)
class FitnessResult:
    """``=== Fitness Evaluation ===``: the weighted score and each weighted component."""

    score: float
    components: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"score": self.score, "components": {k: self.components[k]
                                                    for k in sorted(self.components)}}


def compute_fitness(m: InstanceMetrics, weights: Mapping[str, float]) -> FitnessResult:
    """Fitness of the cluster record ``m`` for ``weights``.

    Components are normalised to [0, 1]: ``rps/(rps+100)``, ``tps/(tps+10000)`` and
    ``1/(1 + µs/1000)`` for the latency keys (TTFT/E2E distributions over the maps in
    sorted-ID order). Score = Σ weight × component over the keys in sorted order. Raises
    :class:`ValueError` for an unknown key or a weight that is negative or not finite.
    """
    for k, w in weights.items():
        if k not in FITNESS_KEYS:
            raise ValueError(f"unknown fitness key {k!r}; valid keys: {', '.join(sorted(FITNESS_KEYS))}")
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"fitness weight for {k!r} must be finite and >= 0, got {w!r}")
    rps, tps = raw_throughput(m)
    if m.streaming is not None:     # --streaming-metrics: sketched percentiles
        ttft = m.streaming.ttft.distribution()
        e2e = m.streaming.e2e.distribution()
    else:
        ttft = Distribution.from_map(m.ttft)
        e2e = Distribution.from_map(m.e2e)

    def lat(v: float) -> float:
        return 1.0 / (1.0 + v / 1000.0)

    extract = {
        "throughput": lambda: rps / (rps + 100.0),
        "tokens_per_sec": lambda: tps / (tps + 10000.0),
        "p99_ttft": lambda: lat(ttft.p99),
        "p50_ttft": lambda: lat(ttft.p50),
        "mean_ttft": lambda: lat(ttft.mean),
        "p99_e2e": lambda: lat(e2e.p99),
        "p50_e2e": lambda: lat(e2e.p50),
        "mean_e2e": lambda: lat(e2e.mean),
    }
    score = 0.0
    comps = {}
    for k in sorted(weights):
        c = extract[k]()
        comps[k] = c
        score += c * weights[k]
    return FitnessResult(score=score, components=comps)
