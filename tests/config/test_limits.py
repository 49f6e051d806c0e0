"""Every count, size and delay of a scenario has an upper bound (docs/scenarios.md, "Limits"):
the bound itself is accepted, one past it is a located error on that key."""

from __future__ import annotations

import pytest
import yaml

from blis_simpy.config.loader import Source, load_raw, validate
from blis_simpy.config.scenario import (
    MAX_BLOCK_SIZE,
    MAX_DELAY_US,
    MAX_FABRIC_GBPS,
    MAX_INSTANCES,
    MAX_KV_BLOCKS,
    MAX_KV_BYTES_PER_TOKEN,
    MAX_RELOAD_BLOCKS_PER_US,
    MAX_REQUESTS,
    MAX_RUNNING_REQS,
    MAX_TOKENS,
    MAX_TP,
    MIN_FABRIC_GBPS,
    MIN_RELOAD_BLOCKS_PER_US,
)
from blis_simpy.errors import ConfigError
from blis_simpy.latency.frontend import MAX_FRONTEND_US

# (key, the last accepted value, the first refused one)
BOUNDS = [
    ("engine.block_size", MAX_BLOCK_SIZE, MAX_BLOCK_SIZE + 1),
    ("engine.total_kv_blocks", MAX_KV_BLOCKS, MAX_KV_BLOCKS + 1),
    ("engine.kv_cpu_blocks", MAX_KV_BLOCKS, MAX_KV_BLOCKS + 1),
    ("engine.max_num_running_reqs", MAX_RUNNING_REQS, MAX_RUNNING_REQS + 1),
    ("engine.max_num_scheduled_tokens", MAX_TOKENS, MAX_TOKENS + 1),
    ("engine.long_prefill_token_threshold", MAX_TOKENS, MAX_TOKENS + 1),
    ("engine.max_model_len", MAX_TOKENS, MAX_TOKENS + 1),
    ("engine.kv_transfer_base_latency_us", MAX_DELAY_US, MAX_DELAY_US + 1),
    ("engine.kv_transfer_bandwidth", MAX_RELOAD_BLOCKS_PER_US, MAX_RELOAD_BLOCKS_PER_US * 2),
    ("engine.kv_transfer_bandwidth", MIN_RELOAD_BLOCKS_PER_US, MIN_RELOAD_BLOCKS_PER_US / 2),
    ("cluster.num_instances", MAX_INSTANCES, MAX_INSTANCES + 1),
    ("cluster.admission_latency_us", MAX_DELAY_US, MAX_DELAY_US + 1),
    ("cluster.routing_latency_us", MAX_DELAY_US, MAX_DELAY_US + 1),
    ("cluster.snapshot_refresh_interval_us", MAX_DELAY_US, MAX_DELAY_US + 1),
    ("trace.counterfactual_k", MAX_INSTANCES, MAX_INSTANCES + 1),
    ("cluster.gateway.max_depth", MAX_REQUESTS, MAX_REQUESTS + 1),
    ("cluster.gateway.band_queue_limit", MAX_REQUESTS, MAX_REQUESTS + 1),
    ("cluster.gateway.band_inflight_limit", MAX_REQUESTS, MAX_REQUESTS + 1),
    ("cluster.gateway.max_concurrency", MAX_REQUESTS, MAX_REQUESTS + 1),
    ("cluster.gateway.dispatch_tick_us", MAX_DELAY_US, MAX_DELAY_US + 1),
    ("workload.num_requests", MAX_REQUESTS, MAX_REQUESTS + 1),
    ("workload.prefix_tokens", MAX_TOKENS, MAX_TOKENS + 1),
    ("workload.arrival_cv", 1e3, 1e3 * 2),
    ("workload.arrival_cv", 1e-3, 1e-3 / 2),
    ("tp", MAX_TP, MAX_TP + 1),
    ("horizon_us", 2**63 - 1, 2**63),
    ("disaggregation.prefill_instances", MAX_INSTANCES, MAX_INSTANCES + 1),
    ("disaggregation.decode_instances", MAX_INSTANCES, MAX_INSTANCES + 1),
    ("disaggregation.transfer.bandwidth_gbps", MAX_FABRIC_GBPS, MAX_FABRIC_GBPS * 2),
    ("disaggregation.transfer.bandwidth_gbps", MIN_FABRIC_GBPS, MIN_FABRIC_GBPS / 2),
    ("disaggregation.transfer.base_latency_ms", MAX_DELAY_US / 1000, MAX_DELAY_US / 1000 * 2),
    ("disaggregation.transfer.kv_bytes_per_token", MAX_KV_BYTES_PER_TOKEN, MAX_KV_BYTES_PER_TOKEN + 1),
    ("disaggregation.decode_pool.tp", MAX_TP, MAX_TP + 1),
    ("disaggregation.prefill_pool.max_model_len", MAX_TOKENS, MAX_TOKENS + 1),
] + [(f"frontend.{k}", MAX_FRONTEND_US, MAX_FRONTEND_US * 2)
     for k in ("request_us", "input_token_us", "step_output_us", "output_token_us", "network_us")]


def _data(key: str, value) -> dict:
    data: dict = {"workload": {"kind": "distribution"}} if key.startswith("workload.") else {}
    *parents, last = key.split(".")
    cur = data
    for p in parents:
        cur = cur.setdefault(p, {})
    cur[last] = value
    return data


@pytest.mark.parametrize("key, ok, bad", BOUNDS, ids=lambda v: str(v))
def test_the_bound_is_accepted_and_one_past_it_is_located(tmp_path, key, ok, bad):
    validate(_data(key, ok), Source(None), semantic=False)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_data(key, bad)))
    data, src = load_raw(str(path))
    with pytest.raises(ConfigError) as e:
        validate(data, src, semantic=False)
    assert (e.value.file, e.value.field) == (str(path), key)
    leaf = key.split(".")[-1]
    assert path.read_text().splitlines()[e.value.line - 1].strip().startswith(f"{leaf}:")
    assert "than or equal to" in e.value.problem


def test_engine_ranks_in_all_are_bounded():
    validate({"dp": 4, "cluster": {"num_instances": MAX_INSTANCES // 4}}, Source(None), semantic=False)
    with pytest.raises(ConfigError) as e:
        validate({"dp": 4, "cluster": {"num_instances": MAX_INSTANCES // 4 + 1}}, Source(None), semantic=False)
    assert e.value.field == "cluster.num_instances"
    assert e.value.problem == (f"{MAX_INSTANCES // 4 + 1} instances x dp 4 = {MAX_INSTANCES + 4} engine "
                               f"ranks; at most {MAX_INSTANCES} can be simulated")
