"""Tiny builders for engine tests: scenarios, requests and one-shot runs."""

from __future__ import annotations

import numpy as np

from blis_simpy.cluster.simulation import Simulation
from blis_simpy.config.scenario import Scenario
from blis_simpy.request import Request


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
