"""Tiny builders for engine tests: scenarios, requests and one-shot runs."""

from __future__ import annotations

import numpy as np

from blis_simpy.catalog.types import ModelConfig
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.resolve import Deployment
from blis_simpy.latency.base import BatchView, LatencyModel
from blis_simpy.request import Request
from blis_simpy.run.simulation import Simulation


def scenario(*, alpha=(100.0, 1.0, 50.0), beta=(1000.0, 10.0, 5.0), implementation="fast",
             num_instances=1, **engine) -> Scenario:
    eng = {"total_kv_blocks": 1000, "implementation": implementation}
    eng.update(engine)
    return Scenario(model="test/model",
                    latency={"model": "blackbox", "alpha_coeffs": list(alpha), "beta_coeffs": list(beta)},
                    engine=eng, cluster={"num_instances": num_instances})


def make_requests(specs, *, seed=1, prefixes=None) -> list[Request]:
    """``specs``: (arrival_us, input_len, output_len[, deadline_us[, prefix_group]]) tuples."""
    rng = np.random.default_rng(seed)
    prefixes = prefixes or {}
    pre_tokens = {g: rng.integers(0, 128000, size=n, dtype=np.int32) for g, n in sorted(prefixes.items())}
    out = []
    for i, spec in enumerate(specs):
        arr, n_in, n_out = spec[0], spec[1], spec[2]
        deadline = spec[3] if len(spec) > 3 else 0
        group = spec[4] if len(spec) > 4 else ""
        inp = rng.integers(0, 128000, size=n_in, dtype=np.int32)
        if group:
            inp = np.concatenate((pre_tokens[group], inp))
        outp = rng.integers(0, 128000, size=n_out, dtype=np.int32)
        out.append(Request(f"request_{i}", arr, inp, outp, deadline_us=deadline, prefix_group=group))
    out.sort(key=lambda r: r.arrival_us)
    return out


def run(sc: Scenario, requests, horizon_us=None):
    return Simulation(sc, requests, horizon_us=horizon_us).run()


# ------------------------------------------------------------------ data parallelism
MOE = ModelConfig(name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4,
                  intermediate_size=128, vocab_size=1000, bytes_per_param=2.0,
                  num_local_experts=4, num_experts_per_tok=2)
DENSE = ModelConfig(name="tiny-dense", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4,
                    intermediate_size=128, vocab_size=1000, bytes_per_param=2.0)


class TinyLatency(LatencyModel):
    """``step_time_us`` = 1000 µs + 100 µs per scheduled token (the dummy batch: 1100 µs);
    ``lockstep_step_time_us`` = the slowest rank + 10 µs. No queueing delay or overheads."""

    def step_time_us(self, batch: BatchView) -> int:
        return 1000 + 100 * (batch.prefill_tokens + batch.decode_tokens)

    def lockstep_step_time_us(self, views: list[BatchView]) -> int:
        return super().lockstep_step_time_us(views) + 10


def build_dp(model: ModelConfig, *, dp: int = 2, n: int = 1, impl: str = "fast", requests=(),
             kv_blocks: int = 1000, block_size: int = 16, horizon_us=None, **engine) -> Simulation:
    """A Simulation of ``n`` engines of ``dp`` ranks timed by :class:`TinyLatency`
    (``model`` decides lockstep: MoE or dense); ``engine`` keys go to the scenario."""
    sc = Scenario(model="test/tiny", dp=dp, cluster={"num_instances": n},
                  latency={"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1, 0, 0]},
                  engine={"implementation": impl, "block_size": block_size,
                          "total_kv_blocks": kv_blocks, **engine})
    dep = Deployment(total_kv_blocks=kv_blocks, block_size=block_size,
                     max_model_len=engine.get("max_model_len", 0),
                     latency_factory=TinyLatency, model_config=model, tp=1)
    return Simulation(sc, list(requests), deployment=dep, horizon_us=horizon_us)
