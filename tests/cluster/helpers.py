"""Shared builders for the control-plane tests: snapshots, requests, small scenarios."""

from __future__ import annotations

import numpy as np

from blis_simpy.config.scenario import Scenario
from blis_simpy.request import Request
from blis_simpy.snapshot import InstanceSnapshot, RouterState

ALPHA = [1000.0, 0.0, 0.0]
BETA = [5000.0, 10.0, 100.0]


def snap(index: int, *, q: int = 0, b: int = 0, kv: float = 0.0, free: int = 100,
         inflight: int = 0, model: str = "") -> InstanceSnapshot:
    return InstanceSnapshot(f"instance_{index}", index, q, b, kv, free, 0.0, inflight, model)


def state(*snaps: InstanceSnapshot, clock: int = 0) -> RouterState:
    return RouterState(tuple(snaps), clock)


def request(rid: int | str = 0, *, arrival: int = 0, n_in: int = 32, n_out: int = 4,
            prefix: np.ndarray | None = None, slo: str = "", model: str = "", seed: int | None = None,
            deadline: int = 0) -> Request:
    """A request whose prompt is ``prefix`` (if any) followed by distinct token IDs."""
    rng = np.random.default_rng(seed if seed is not None else hash(str(rid)) & 0xFFFF)
    body = rng.integers(0, 30000, size=n_in - (len(prefix) if prefix is not None else 0))
    toks = np.concatenate([prefix, body]) if prefix is not None else body
    name = rid if isinstance(rid, str) else f"request_{rid}"
    return Request(name, arrival, toks, rng.integers(0, 30000, size=n_out), slo_class=slo,
                   model=model, deadline_us=deadline)


def scenario(*, n: int = 2, admission: str = "always-admit", admission_params: dict | None = None,
             routing: str = "round-robin", routing_params: dict | None = None, kv_blocks: int = 2000,
             max_running: int = 64, block_size: int = 16, refresh_us: int = 0, trace: str = "none",
             k: int = 0, seed: int = 42, model: str = "m", scheduler: str = "fcfs",
             priority: str = "constant", max_model_len: int = 0) -> Scenario:
    return Scenario.model_validate({
        "seed": seed, "model": model,
        "latency": {"model": "blackbox", "alpha_coeffs": ALPHA, "beta_coeffs": BETA},
        "engine": {"total_kv_blocks": kv_blocks, "max_num_running_reqs": max_running,
                   "block_size": block_size, "scheduler": scheduler, "priority_policy": priority,
                   "max_model_len": max_model_len},
        "cluster": {"num_instances": n,
                    "admission": {"policy": admission, "params": admission_params or {}},
                    "routing": {"policy": routing, "params": routing_params or {}},
                    "snapshot_refresh_interval_us": refresh_us},
        "trace": {"level": trace, "counterfactual_k": k},
    })
