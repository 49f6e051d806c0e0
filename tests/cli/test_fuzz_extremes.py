"""Fuzzing the numeric extremes of the engine, cluster and workload keys (issue 13).

Each example sets one to three keys of a tiny scenario (at most 3 requests, a 1 s horizon,
steps of at least 1 ms) to an extreme: 0, -1, the documented bound and one past it
(docs/scenarios.md, "Limits"), int64's limits, 2^70, 1e-308, 1e308, NaN, inf. Whatever it
draws, ``run`` must exit 0 with a valid report whose counters add up, or exit 2 with one
``error:`` line and no results file — never a traceback, an exit 1 or a hang.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_simpy.config.scenario import (
    MAX_BLOCK_SIZE,
    MAX_DELAY_US,
    MAX_INSTANCES,
    MAX_KV_BLOCKS,
    MAX_REQUESTS,
    MAX_RUNNING_REQS,
    MAX_TOKENS,
)

INT64_MAX = 2**63 - 1


def ints(bound: int | None = None, *, small: tuple[int, ...] = (0, 1, 2)) -> list[int]:
    """Extreme integers for a key whose upper bound is ``bound``."""
    out = [-1, *small, 2**31, INT64_MAX, INT64_MAX + 1, 2**70]
    if bound is not None:
        out += [bound, bound + 1]
    return out


FLOATS = [0.0, -1.0, 5e-324, 1e-308, 1e-6, 1e-3, 1.0, 1e6, 1e308, math.nan, math.inf, -math.inf]

KEYS: dict[str, list] = {
    "engine.total_kv_blocks": ints(MAX_KV_BLOCKS),
    "engine.block_size": ints(MAX_BLOCK_SIZE),
    "engine.max_num_running_reqs": ints(MAX_RUNNING_REQS),
    "engine.max_num_scheduled_tokens": ints(MAX_TOKENS),
    "engine.long_prefill_token_threshold": ints(MAX_TOKENS),
    "engine.max_model_len": ints(MAX_TOKENS, small=(0, 1, 64)),
    "engine.kv_cpu_blocks": ints(MAX_KV_BLOCKS),
    "engine.kv_transfer_bandwidth": FLOATS,
    "engine.kv_transfer_base_latency_us": ints(MAX_DELAY_US),
    "engine.gpu_memory_utilization": FLOATS,
    "engine.implementation": ["fast", "reference"],
    "cluster.num_instances": ints(MAX_INSTANCES),
    "cluster.admission_latency_us": ints(MAX_DELAY_US),
    "cluster.routing_latency_us": ints(MAX_DELAY_US),
    "cluster.snapshot_refresh_interval_us": ints(MAX_DELAY_US),
    "workload.rate": FLOATS,
    # never 0: no cap would generate requests for the whole horizon at the drawn rate
    "workload.num_requests": [-1, 1, 3, MAX_REQUESTS + 1, INT64_MAX, 2**70],
    "workload.prefix_tokens": ints(MAX_TOKENS),
    "workload.prompt_tokens.max": ints(MAX_TOKENS, small=(0, 1, 300)),
    "workload.output_tokens.max": ints(MAX_TOKENS, small=(0, 1, 30)),
    "workload.arrival_cv": FLOATS,
    "disaggregation.transfer.bandwidth_gbps": FLOATS,
    "disaggregation.transfer.base_latency_ms": FLOATS,
}

BASE = {
    "seed": 7,
    "model": "test/model",
    "horizon_us": 1_000_000,
    "latency": {"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1000, 1, 1]},
    "engine": {"total_kv_blocks": 200, "max_num_running_reqs": 8},
    "cluster": {"num_instances": 1},
    "workload": {"kind": "distribution", "rate": 20.0, "num_requests": 3, "arrival": "gamma",
                 "prompt_tokens": {"mean": 40, "stdev": 10, "min": 1, "max": 300},
                 "output_tokens": {"mean": 5, "stdev": 2, "min": 1, "max": 30}},
}


def _scenario(changes: dict) -> str:
    data = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        *parents, last = key.split(".")
        cur = data
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[last] = value
    return yaml.safe_dump(data, sort_keys=False)


@settings(max_examples=60)
@given(st.lists(st.sampled_from(sorted(KEYS)), min_size=1, max_size=3, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({k: st.sampled_from(KEYS[k]) for k in keys})))
def test_numeric_extremes_exit_0_or_2_never_a_traceback(tmp_path_factory, changes):
    from typer.testing import CliRunner

    from blis_simpy.cli.app import app

    folder = tmp_path_factory.mktemp("fuzz")
    sc = folder / "s.yaml"
    sc.write_text(_scenario(changes))
    out = folder / "r.json"
    res = CliRunner().invoke(app, ["run", "--scenario", str(sc), "--format", "json",
                                   "--results-path", str(out)])
    assert "Traceback" not in res.stderr, (changes, res.stderr)
    assert res.exit_code in (0, 2), (changes, res.exit_code, res.stderr)
    if res.exit_code == 2:
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (changes, res.stderr)
        assert not out.exists()
        return
    json.loads(res.stdout)
    c = json.loads(out.read_text())
    assert (c["completed_requests"] + c["still_queued"] + c["still_running"]
            + c["dropped_unservable"] + c["timed_out_requests"]) == c["injected_requests"], changes


@pytest.mark.parametrize("key", sorted(KEYS))
def test_every_fuzzed_key_exists_in_the_scenario(key):
    """The fuzzer's keys are scenario keys (a renamed key would only be 'unknown key')."""
    from blis_simpy.config.loader import Source, validate

    value = {"engine.implementation": "fast"}.get(key, 1)
    if key.endswith("_tokens.max"):
        value = 300
    validate(yaml.safe_load(_scenario({key: value})), Source(None))
