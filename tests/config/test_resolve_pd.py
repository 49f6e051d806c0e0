"""PD pools resolved from a scenario (docs/disaggregation.md; divergences.md P1–P8)."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.hfconfig import parse_hf_config
from blis_simpy.catalog.models import builtin_models
from blis_simpy.catalog.types import ModelConfig
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.pools import (
    BLIS_KV_BYTES_PER_TOKEN,
    check_topology,
    kv_bytes_per_token,
    resolve_pools,
)
from blis_simpy.deploy.resolve import resolve
from blis_simpy.errors import ConfigError
from blis_simpy.kv.vllm_capacity import vllm_kv_capacity
from blis_simpy.latency import BlackboxModel, RooflineModel
from tests.conftest import conformance_case

QWEN = "qwen/qwen3-14b"
LLAMA = "meta-llama/llama-3.1-8b-instruct"
BLIS_KV = {"kv_capacity_model": "blis"}     # BLIS's KV formula (docs/kv-capacity.md)


def sc(pd: dict | None = None, n: int = 4, **kw) -> Scenario:
    """Qwen3-14B, roofline, H100 TP 1 (catalog KV 17,600 blocks, max_model_len 40,960)."""
    base = {"model": QWEN, "latency": {"model": "roofline"}, "hardware": "H100", "tp": 1,
            "cluster": {"num_instances": n}}
    if pd is not None:
        base["disaggregation"] = pd
    return Scenario.model_validate({**base, **kw})


def pools(pd: dict | None = None) -> dict:
    """2 prefill + 2 decode instances plus ``pd``."""
    return {"prefill_instances": 2, "decode_instances": 2, **(pd or {})}


@pytest.fixture
def logs():
    """Records of the ``blis_simpy`` loggers (independent of propagation settings)."""
    records: list[logging.LogRecord] = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record)

    h, logger = H(logging.DEBUG), logging.getLogger("blis_simpy")
    old = logger.level
    logger.addHandler(h)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(h)
    logger.setLevel(old)


def warned(records, text: str) -> bool:
    return any(r.levelno == logging.WARNING and text in r.getMessage() for r in records)


# ---------------------------------------------------------------------------- topology
@pytest.mark.parametrize("P, D, N, field, message", [
    (3, 2, 4, "disaggregation.prefill_instances",
     "Invalid PD pool topology: prefill-instances (3) + decode-instances (2) = 5 exceeds num-instances (4)"),
    (2, 0, 4, "disaggregation.prefill_instances",
     "Invalid PD pool topology: prefill-instances (2) and decode-instances (0) must both be > 0 "
     "(or both 0 to disable disaggregation)"),
    (0, 1, 4, "disaggregation.decode_instances",
     "Invalid PD pool topology: prefill-instances (0) and decode-instances (1) must both be > 0 "
     "(or both 0 to disable disaggregation)"),
    (-1, 1, 4, "disaggregation.prefill_instances",
     "Invalid PD pool topology: prefill-instances must be >= 0, got -1"),
])
def test_invalid_topologies_name_the_key_with_blis_message(P, D, N, field, message):
    with pytest.raises(ConfigError) as e:
        check_topology(P, D, N)
    assert (e.value.field, e.value.problem) == (field, message)


def test_topology_errors_come_from_resolve_pools_too():
    with pytest.raises(ConfigError, match=r"= 5 exceeds num-instances \(4\)"):
        resolve_pools(sc({"prefill_instances": 3, "decode_instances": 2}), quiet=True)


def test_both_zero_disables_pd_and_every_instance_is_unassigned_on_the_global_deployment():
    s = sc(n=3)
    glob = resolve(s, quiet=True)
    plan = resolve_pools(s, quiet=True, deployment=glob)
    assert not plan.enabled and plan.roles == ("unassigned",) * 3
    assert plan.deployment_for(2) is glob is plan.global_deployment
    assert plan.decider == "never" and plan.contention == "none" and plan.warnings == ()


def test_membership_by_index_with_unassigned_tail():
    plan = resolve_pools(sc(pools({"compat": "checkout"}), n=6), quiet=True)
    assert plan.roles == ("prefill", "prefill", "decode", "decode", "unassigned", "unassigned")
    assert plan.members("prefill") == (0, 1) and plan.members("decode") == (2, 3)
    assert plan.members("unassigned") == (4, 5)
    assert (plan.prefill_instances, plan.decode_instances, plan.num_instances) == (2, 2, 6)
    assert plan.role_of(3) == "decode"


def test_pool_plan_is_frozen():
    plan = resolve_pools(sc(pools()), quiet=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.enabled = False            # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.deployments["prefill"] = None   # type: ignore[index]


# ---------------------------------------------------------------------------- per-pool overrides
def test_pools_without_overrides_share_the_global_deployment():
    plan = resolve_pools(sc(pools()), quiet=True)
    glob = plan.global_deployment
    assert plan.deployments["prefill"] is glob and plan.deployments["decode"] is glob


def test_overrides_apply_to_a_copy_and_never_touch_the_global_config():
    s = sc(pools({"prefill_pool": {"tp": 2, "max_model_len": 8192},
                  "decode_pool": {"hardware": "A100-80", "latency_model": "roofline"}}), n=5)
    before = s.model_dump()
    plan = resolve_pools(s, quiet=True)
    assert s.model_dump() == before                                   # INV-P2-1
    g = plan.global_deployment
    assert (g.tp, g.hardware, g.total_kv_blocks, g.max_model_len) == (1, "H100", 17_600, 40_960)
    pf, dc = plan.deployments["prefill"], plan.deployments["decode"]
    assert (pf.tp, pf.hardware, pf.max_model_len) == (2, "H100", 8192)
    assert (dc.tp, dc.hardware, dc.max_model_len) == (1, "A100-80", 40_960)
    assert plan.deployment_for(4) is g and plan.deployment_for(0) is pf and plan.deployment_for(2) is dc
    lm = pf.new_latency_model()
    assert isinstance(lm, RooflineModel) and lm.tp == 2 and lm.gpu.name == "H100"


def test_gpu_override_feeds_the_pool_latency_model_hardware():
    plan = resolve_pools(sc(pools({"decode_pool": {"hardware": "A100-80"}})), quiet=True)
    dc = plan.deployments["decode"]
    assert dc.new_latency_model().gpu == builtin_gpus().get("A100-80")       # divergences.md P5
    assert plan.global_deployment.new_latency_model().gpu.name == "H100"


def test_gpu_override_under_checkout_changes_only_the_label_and_the_kv_capacity():
    plan = resolve_pools(sc(pools({"decode_pool": {"hardware": "A100-80"}, "compat": "checkout"}),
                            engine=BLIS_KV), quiet=True)
    dc = plan.deployments["decode"]
    assert dc.hardware == "A100-80"
    assert dc.new_latency_model().gpu.name == "H100"                          # P5, checkout
    assert dc.total_kv_blocks == 15_909                                       # A100-SXM (kv-capacity.md)


def test_tp_override_auto_calculates_the_pool_kv_blocks():
    plan = resolve_pools(sc(pools({"prefill_pool": {"tp": 2}}), engine=BLIS_KV), quiet=True)
    pf = plan.deployments["prefill"]
    assert pf.total_kv_blocks == 89_941                                       # H100 TP 2 golden
    assert pf.max_model_len == 40_960                                         # capacity is larger
    assert "total_kv_blocks 89941: auto-calculated for 2 x H100" in "\n".join(plan.notes)


def test_small_pool_kv_lowers_the_pool_max_model_len():
    gpus = {"SMALL": {"tflops_peak": 500, "bw_peak_tbs": 2, "mfu_prefill": 0.5, "mfu_decode": 0.3,
                      "memory_gib": 38}}
    plan = resolve_pools(sc(pools({"decode_pool": {"hardware": "SMALL"}}), gpus=gpus), quiet=True)
    blocks = vllm_kv_capacity(builtin_models().get(QWEN), plan.deployments["decode"].gpu).blocks
    dc = plan.deployments["decode"]
    assert dc.total_kv_blocks == blocks and blocks * 16 < 40_960
    assert dc.max_model_len == blocks * 16
    assert plan.deployments["prefill"].max_model_len == 40_960


def test_given_pool_max_model_len_is_kept_unless_the_analytical_pool_kv_cannot_hold_it():
    gpus = {"SMALL": {"tflops_peak": 500, "bw_peak_tbs": 2, "mfu_prefill": 0.5, "mfu_decode": 0.3,
                      "memory_gib": 40}}
    plan = resolve_pools(sc(pools({"decode_pool": {"hardware": "SMALL", "max_model_len": 4096}}),
                            gpus=gpus), quiet=True)
    assert plan.deployments["decode"].max_model_len == 4096
    plan = resolve_pools(sc(pools({"decode_pool": {"total_kv_blocks": 100, "max_model_len": 4096}})),
                         quiet=True)
    dc = plan.deployments["decode"]
    assert (dc.total_kv_blocks, dc.max_model_len) == (100, 1600)
    assert any("capped to 1600" in w for w in plan.warnings)


def test_a_pool_whose_model_does_not_fit_is_refused_on_its_key():
    # BLIS's formula once warned and kept the global 17,600 blocks for the pool
    gpus = {"TINY": {"tflops_peak": 100, "bw_peak_tbs": 1, "mfu_prefill": 0.5, "mfu_decode": 0.3,
                     "memory_gib": 8}}
    with pytest.raises(ConfigError) as e:
        resolve_pools(sc(pools({"prefill_pool": {"hardware": "TINY"}}), gpus=gpus, engine=BLIS_KV))
    assert e.value.field == "disaggregation.prefill_pool.hardware"
    assert e.value.problem.startswith("KV capacity for 1 x TINY: qwen/qwen3-14b on 1 x TINY: the model "
                                      "does not fit: short by ")


def test_unknown_pool_gpu_is_an_error_naming_the_pool_key():
    with pytest.raises(ConfigError) as e:
        resolve_pools(sc(pools({"decode_pool": {"hardware": "H9000"}})), quiet=True)
    assert e.value.field == "disaggregation.decode_pool.hardware" and "unknown GPU 'H9000'" in e.value.problem


def test_pool_latency_backend_override_uses_that_backends_catalog_coefficients():
    plan = resolve_pools(sc(pools({"decode_pool": {"latency_model": "blackbox"}})), quiet=True)
    dc = plan.deployments["decode"]
    assert dc.backend == "blackbox" and isinstance(dc.new_latency_model(), BlackboxModel)
    assert isinstance(plan.deployments["prefill"].new_latency_model(), RooflineModel)
    assert dc.total_kv_blocks == 17_600                          # same TP and GPU: global KV


def test_blackbox_pool_with_another_tp_takes_its_catalog_row_unless_checkout():
    s = {"model": LLAMA, "latency": {"model": "blackbox"}, "hardware": "A100-80", "tp": 1,
         "vllm_version": "v0.8.4", "cluster": {"num_instances": 2}}
    pd = {"prefill_instances": 1, "decode_instances": 1, "decode_pool": {"tp": 2}}
    plan = resolve_pools(Scenario.model_validate({**s, "disaggregation": pd}), quiet=True)
    g, dc = plan.global_deployment, plan.deployments["decode"]
    assert dc.beta != g.beta and "catalog row" in "\n".join(dc.notes)
    plan = resolve_pools(Scenario.model_validate({**s, "disaggregation": {**pd, "compat": "checkout"}}),
                         quiet=True)
    assert plan.deployments["decode"].beta == plan.global_deployment.beta


# ---------------------------------------------------------------------------- KV bytes per token
def test_kv_bytes_per_token_of_qwen3_14b_is_hand_computed_and_matches_d29():
    # 2 (K and V) x 40 layers x 8 KV heads x (5120 / 40 = 128) head dim x 2 bytes (bf16)
    assert kv_bytes_per_token(builtin_models().get(QWEN)) == 2 * 40 * 8 * 128 * 2 == 163_840
    plan = resolve_pools(sc(pools()), quiet=True)
    assert plan.kv_bytes_per_token == 163_840
    d29 = conformance_case("D29_pd_transfer_contention")
    args = json.loads((d29 / "case.json").read_text())["args"]
    assert int(args[args.index("--pd-kv-bytes-per-token") + 1]) == 163_840
    assert kv_bytes_per_token(parse_hf_config(d29 / "model_config.json", name=QWEN)) == 163_840


def test_kv_bytes_without_kv_heads_use_all_heads():
    m = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, bytes_per_param=4.0)
    assert kv_bytes_per_token(m) == 2 * 2 * 4 * 16 * 4
    with pytest.raises(ValueError):
        kv_bytes_per_token(ModelConfig(num_layers=2, hidden_size=64, num_heads=4))


def test_kv_bytes_given_beats_checkout_default_beats_derived():
    assert resolve_pools(sc(pools({"transfer": {"kv_bytes_per_token": 1000}})), quiet=True).kv_bytes_per_token == 1000
    assert resolve_pools(sc(pools({"compat": "checkout"})), quiet=True).kv_bytes_per_token == BLIS_KV_BYTES_PER_TOKEN
    given = {"transfer": {"kv_bytes_per_token": 7}, "compat": "checkout"}
    assert resolve_pools(sc(pools(given)), quiet=True).kv_bytes_per_token == 7


def test_blackbox_derives_kv_bytes_from_the_catalog_and_falls_back_to_512_with_a_warning(logs):
    bb = {"model": "blackbox", "alpha_coeffs": [1.0, 0, 0], "beta_coeffs": [100.0, 1, 1]}
    plan = resolve_pools(sc(pools(), latency=bb))
    assert plan.kv_bytes_per_token == 163_840                      # built-in model catalog
    plan = resolve_pools(sc(pools(), latency=bb, model="acme/unknown-model"))
    assert plan.kv_bytes_per_token == 512
    assert any("no model config for acme/unknown-model" in w for w in plan.warnings)
    assert warned(logs, "using BLIS's default 512")


# ---------------------------------------------------------------------------- transfer, decider, warnings
def test_contention_default_is_fair_share_or_none_under_checkout_and_needs_pools():
    assert resolve_pools(sc(pools()), quiet=True).contention == "fair-share"
    assert resolve_pools(sc(pools({"compat": "checkout"})), quiet=True).contention == "none"
    snap = {"transfer": {"contention": "snapshot", "bandwidth_gbps": 5.0, "base_latency_ms": 0.1}}
    plan = resolve_pools(sc(pools(snap)), quiet=True)
    assert (plan.contention, plan.bandwidth_gbps, plan.base_latency_ms) == ("snapshot", 5.0, 0.1)
    with pytest.raises(ConfigError) as e:
        resolve_pools(sc({"transfer": {"contention": "fair-share"}}), quiet=True)
    assert e.value.field == "disaggregation.transfer.contention" and "needs PD pools" in e.value.problem
    assert not resolve_pools(sc({"transfer": {"contention": "none"}}), quiet=True).enabled


def test_a_decider_without_pools_is_an_error_or_a_checkout_warning():
    with pytest.raises(ConfigError) as e:
        resolve_pools(sc({"decider": {"policy": "always"}}), quiet=True)
    assert e.value.field == "disaggregation.decider.policy" and "needs PD pools" in e.value.problem
    plan = resolve_pools(sc({"decider": {"policy": "always"}, "compat": "checkout"}), quiet=True)
    assert not plan.enabled and plan.decider == "never"
    assert any("has no effect" in w for w in plan.warnings)


def test_decider_name_and_params_are_checked():
    with pytest.raises(ConfigError) as e:
        resolve_pools(sc(pools({"decider": {"policy": "sometimes"}})), quiet=True)
    assert e.value.field == "disaggregation.decider.policy" and "sometimes" in e.value.problem
    with pytest.raises(ConfigError) as e:
        resolve_pools(sc(pools({"decider": {"policy": "prefix-threshold", "params": {"threshold": -1}}})),
                      quiet=True)
    assert e.value.field.startswith("disaggregation.decider.params")
    plan = resolve_pools(sc(pools({"decider": {"policy": "prefix-threshold", "params": {"threshold": 150}}})),
                         quiet=True)
    assert (plan.decider, dict(plan.decider_params)) == ("prefix-threshold", {"threshold": 150})


def test_direct_to_decode_threshold_zero_warns():
    plan = resolve_pools(sc(pools({"decider": {"policy": "direct-to-decode", "params": {"threshold": 0}}})),
                         quiet=True)
    assert any("every non-empty request" in w for w in plan.warnings)


def test_unassigned_instances_warn_that_they_sit_idle_except_under_checkout(logs):
    plan = resolve_pools(sc(pools(), n=6))
    assert plan.local_routing == "decode-pool"
    assert any("2 unassigned instance(s) (instance_4 … instance_5) sit idle" in w for w in plan.warnings)
    assert warned(logs, "sit idle")
    plan = resolve_pools(sc(pools({"compat": "checkout"}), n=6), quiet=True)
    assert plan.local_routing == "all" and plan.warnings == ()


def test_interference_with_always_warns_and_factors_are_exposed():
    plan = resolve_pools(sc(pools({"decider": {"policy": "always"},
                                   "interference": {"prefill": 0.5, "decode": 1.0}})), quiet=True)
    assert (plan.interference_prefill, plan.interference_decode, plan.interference) == (0.5, 1.0, True)
    assert any("interference factors do not affect pool instances" in w for w in plan.warnings)
    plan = resolve_pools(sc({"interference": {"prefill": 0.5}}), quiet=True)    # non-PD: allowed
    assert plan.interference and plan.warnings == ()


def test_pool_overrides_while_pd_is_disabled_warn(logs):
    plan = resolve_pools(sc({"prefill_pool": {"tp": 2}, "decode_pool": {"hardware": "A100-80"}}))
    assert not plan.enabled
    assert any(w.startswith("prefill pool overrides (tp) have no effect") for w in plan.warnings)
    assert any(w.startswith("decode pool overrides (hardware) have no effect") for w in plan.warnings)
    assert warned(logs, "have no effect")


def test_quiet_logs_nothing(logs):
    resolve_pools(sc(pools(), n=6), quiet=True)
    assert logs == []


def test_pool_routing_is_checked_and_inherits_the_main_tie_break():
    pd = pools({"decode_pool": {"routing": {"policy": "weighted",
                                            "params": {"scorers": [{"name": "queue-depth", "weight": 1.0}]}}}})
    plan = resolve_pools(sc(pd, cluster={"num_instances": 4, "routing": {
        "policy": "weighted", "params": {"tie_break": "first"}}}), quiet=True)
    assert plan.routing_for("prefill") is None
    dc = plan.routing_for("decode")
    assert dc.policy == "weighted" and dc.params["tie_break"] == "first"
    assert dc.params["scorers"] == [{"name": "queue-depth", "weight": 1.0}]
    bad = pools({"prefill_pool": {"routing": {"policy": "weighted", "params": {"scorers": "nope:1"}}}})
    with pytest.raises(ConfigError) as e:
        resolve_pools(sc(bad), quiet=True)
    assert e.value.field.startswith("disaggregation.prefill_pool.routing.params")


def test_compat_switches():
    fixed, checkout = (resolve_pools(sc(pools({"compat": c})), quiet=True) for c in ("fixed", "checkout"))
    assert (fixed.shares_main_router, fixed.checkout_parent_timing, fixed.local_routing) == (False, False, "decode-pool")
    assert (checkout.shares_main_router, checkout.checkout_parent_timing, checkout.local_routing) == (True, True, "all")
