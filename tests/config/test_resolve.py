"""Scenario → Deployment resolution (docs/latency-models.md, "Catalogs and resolution"): what
comes from where."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.models import builtin_models
from blis_simpy.config.loader import load_scenario
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.kv_capacity import DEFAULT_TOTAL_KV_BLOCKS
from blis_simpy.deploy.resolve import resolve
from blis_simpy.errors import ConfigError
from blis_simpy.kv.capacity import kv_capacity_blocks
from blis_simpy.kv.vllm_capacity import vllm_kv_capacity
from blis_simpy.latency import BatchView, BlackboxModel, CrossModel, RooflineModel, TrainedRooflineModel

DATA = Path(__file__).resolve().parents[1] / "catalog" / "data"
QWEN = "qwen/qwen3-14b"
BLIS_KV = {"kv_capacity_model": "blis"}     # BLIS's KV formula (docs/kv-capacity.md)


def sc(**kw) -> Scenario:
    latency = kw.pop("latency", {"model": "roofline"})
    return Scenario.model_validate({"model": QWEN, "latency": latency, **kw})


class Req:
    def __init__(self, pi, n_in, new, n_out=10):
        self.pi, self.input_len, self.num_new_tokens, self.output_len = pi, n_in, new, n_out


def decode_batch(n=8, ctx=1000) -> BatchView:
    return BatchView.of([Req(ctx, 500, 1) for _ in range(n)])


# ---------------------------------------------------------------------------- identity
def test_qwen3_14b_on_h100_resolves_everything_from_the_catalogs():
    d = resolve(sc(hardware="H100"))
    assert (d.backend, d.hardware, d.tp, d.vllm_version) == ("roofline", "H100", 1, "v0.11.0")
    assert d.total_kv_blocks == 17_600                    # the catalog row's measured KV blocks
    assert d.max_model_len == 40_960                      # max_position_embeddings, no rope scaling
    assert d.model_config == builtin_models().get(QWEN) and d.gpu == builtin_gpus().get("H100")
    assert isinstance(d.new_latency_model(), RooflineModel) and type(d.new_kv_cache()).__name__ == "KVCache"
    text = "\n".join(d.notes)
    for fact in ("tp 1: the smallest TP whose weights and a KV cache fit on H100", "vllm version v0.11.0", "built-in catalog",
                 "total_kv_blocks 17600: catalog row", "max_model_len 40960: derived"):
        assert fact in text
    assert d.warnings == []


def test_hardware_defaults_too_and_given_values_win():
    d = resolve(sc())
    assert (d.hardware, d.tp) == ("H100", 1) and "hardware H100: default" in "\n".join(d.notes)
    d = resolve(sc(hardware="H100", tp=2, vllm_version="v0.8.4", engine=BLIS_KV))
    assert (d.tp, d.vllm_version) == (2, "v0.8.4")
    assert d.total_kv_blocks == kv_capacity_blocks(builtin_models().get(QWEN), builtin_gpus().get("H100"), 2, 16)
    assert d.total_kv_blocks == 89_941


def test_gpu_names_are_canonicalised_for_lookups():
    assert resolve(sc(hardware="h100")).total_kv_blocks == 17_600


# ---------------------------------------------------------------------------- KV blocks
def test_kv_blocks_explicit_beats_catalog():
    assert resolve(sc(hardware="H100", engine={"total_kv_blocks": 5000})).total_kv_blocks == 5000


def test_kv_blocks_auto_calculated_without_a_catalog_row_b18b():
    d = resolve(sc(hardware="A100-SXM", tp=1, engine=BLIS_KV))
    assert d.total_kv_blocks == 15_909 and "auto-calculated" in "\n".join(d.notes)
    half = resolve(sc(hardware="A100-SXM", tp=1, engine={**BLIS_KV, "gpu_memory_utilization": 0.5}))
    assert 0 < half.total_kv_blocks < 15_909


def test_a_model_that_does_not_fit_is_refused_by_how_much_under_blis_too():
    # BLIS's formula: 131.56 GiB of weights + 5.5 activations + 0.15 non-torch on 80 x 0.9 = 72 GiB;
    # the run once fell back to 1,000,000 blocks with a warning
    s = sc(model="meta-llama/llama-3.1-70b", hardware="H100", tp=1, engine=BLIS_KV)
    with pytest.raises(ConfigError) as e:
        resolve(s, quiet=True)
    assert e.value.field == "hardware"
    assert e.value.problem.startswith("KV capacity: meta-llama/llama-3.1-70b on 1 x H100: the model does "
                                      "not fit: short by ")
    assert "GiB needed >= 72.00 GiB usable on 1 x H100" in e.value.problem


def test_quiet_resolution_logs_nothing(caplog):
    s = sc(model="qwen/qwen3-14b", hardware="A100-SXM", tp=1, engine=BLIS_KV)
    with caplog.at_level(logging.DEBUG, logger="blis_simpy"):
        d = resolve(s, quiet=True)
    assert d.notes and not caplog.records


def test_blackbox_auto_sizes_kv_only_with_a_model_config():
    coeffs = {"model": "blackbox", "alpha_coeffs": [1.0, 0.0, 0.0], "beta_coeffs": [100.0, 1.0, 1.0]}
    d = resolve(sc(latency=coeffs, hardware="A100-SXM", tp=1, engine=BLIS_KV))
    assert d.total_kv_blocks == 15_909                     # catalog model + A100 memory
    d = resolve(sc(latency=coeffs, hardware="A100-SXM", tp=1))
    a100 = vllm_kv_capacity(builtin_models().get(QWEN), builtin_gpus().get("A100-SXM"))
    assert d.total_kv_blocks == a100.blocks == 17_376 and d.kv_source == "vllm"    # the default
    d = resolve(sc(model="acme/model", latency=coeffs, hardware="H100", tp=1))
    assert d.total_kv_blocks == DEFAULT_TOTAL_KV_BLOCKS and not d.warnings
    d = resolve(sc(model="acme/model", latency=coeffs))
    assert d.total_kv_blocks == DEFAULT_TOTAL_KV_BLOCKS and d.hardware == ""


# ---------------------------------------------------------------------------- MaxModelLen
def test_max_model_len_is_capped_to_the_kv_capacity_with_a_warning():
    d = resolve(sc(hardware="H100", engine={"total_kv_blocks": 100}))
    assert d.max_model_len == 1600 and any("capped to 1600" in w for w in d.warnings)
    d = resolve(sc(hardware="H100", engine={"total_kv_blocks": 100, "max_model_len": 800}))
    assert d.max_model_len == 800 and not d.warnings
    d = resolve(sc(hardware="H100", engine={"total_kv_blocks": 100, "max_model_len": 5000}))
    assert d.max_model_len == 1600                        # analytical: even a given value is capped


def test_blackbox_max_model_len_is_not_derived():
    d = resolve(sc(latency={"model": "blackbox"}, hardware="H100"))
    assert d.max_model_len == 0


def test_rope_scaling_from_a_config_folder(tmp_path):
    d = resolve(sc(model="test/tiny-model", hardware="H100", tp=1,
                   model_config_folder=str(DATA / "model_configs" / "tiny-model")))
    assert d.max_model_len == 8192                        # 4096 x linear factor 2
    assert d.model_config.num_layers == 8 and d.model_config.tie_word_embeddings


# ---------------------------------------------------------------------------- coefficients
def test_blackbox_coefficients_come_from_the_catalog_row():
    d = resolve(sc(latency={"model": "blackbox"}, hardware="H100"))
    m = d.new_latency_model()
    assert isinstance(m, BlackboxModel)
    assert m.alpha == [8888.089034078324, 0.18488961143592303, 0.0]
    assert m.beta == [13578.186662538783, 39.44465647189146, 27.3227753326911]


def test_blackbox_missing_combination_lists_what_exists():
    with pytest.raises(ConfigError) as e:
        resolve(sc(latency={"model": "blackbox"}, hardware="A100-SXM"))
    assert "No trained coefficients found" in str(e.value) and "H100 TP1 v0.11.0" in str(e.value)


def test_blackbox_all_zero_coefficients_are_an_error():
    with pytest.raises(ConfigError, match="No trained coefficients found"):
        resolve(sc(latency={"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [0, 0, 0]}))


def test_roofline_with_coefficients_is_an_error():
    with pytest.raises(ConfigError, match="roofline takes no alpha/beta") as e:
        resolve(sc(latency={"model": "roofline", "alpha_coeffs": [1, 2, 3], "beta_coeffs": [1, 2, 3]}))
    assert e.value.field == "latency.model"


def test_crossmodel_and_trained_roofline_use_the_global_sets_unless_given():
    m = resolve(sc(latency={"model": "crossmodel"}, hardware="H100")).new_latency_model()
    assert isinstance(m, CrossModel) and m.beta == [116.11, 1226.868, 19.943, 9445.157]
    m = resolve(sc(latency={"model": "crossmodel", "beta_coeffs": [1, 2, 3, 4]}, hardware="H100")).new_latency_model()
    assert m.beta == [1, 2, 3, 4] and m.alpha == [13732.0, 0.0, 860.6]
    m = resolve(sc(latency={"model": "trained-roofline"}, hardware="H100")).new_latency_model()
    assert isinstance(m, TrainedRooflineModel) and m.queueing_time_us(Req(0, 10, 10)) == 9315
    with pytest.raises(ConfigError, match="at least 4"):
        resolve(sc(latency={"model": "crossmodel", "beta_coeffs": [1, 2, 3]}, hardware="H100"))


def test_latency_compat_checkout_reproduces_blis_moe_roofline():
    mx = "mistralai/mixtral-8x7b-instruct-v0.1"
    fixed = resolve(sc(model=mx, hardware="H100", tp=2)).new_latency_model()
    blis = resolve(sc(model=mx, hardware="H100", tp=2, latency={"model": "roofline", "compat": "checkout"}))
    b = decode_batch()
    assert blis.new_latency_model().step_time_us(b) < fixed.step_time_us(b)    # BLIS: expert weights free


# ---------------------------------------------------------------------------- sources
def test_unknown_model_for_an_analytical_backend_lists_what_was_tried():
    with pytest.raises(ConfigError) as e:
        resolve(sc(model="acme/model", hardware="H100", tp=1))
    msg = str(e.value)
    assert e.value.field == "model"             # the key written (no model_config_folder given)
    assert "built-in model catalog" in msg and "--model-config-folder" in msg and "never downloads" in msg


def test_missing_gpu_and_tp_are_errors():
    with pytest.raises(ConfigError, match="needs a GPU") as e:
        resolve(sc(model="acme/model", model_config_folder=str(DATA / "model_configs" / "tiny-model")))
    assert e.value.field == "hardware"
    with pytest.raises(ConfigError, match="unknown GPU 'H300'"):
        resolve(sc(hardware="H300"))


def test_custom_gpu_from_scenario_yaml_is_used_by_roofline(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(f"""
model: {QWEN}
hardware: LAB-GPU
tp: 1
latency: {{model: roofline}}
gpus:
  LAB-GPU: {{tflops_peak: 100.0, bw_peak_tbs: 0.5, mfu_prefill: 0.5, mfu_decode: 0.25,
            memory_gib: 96.0, source: "lab measurement"}}
workload: {{kind: distribution, num_requests: 5}}
""")
    d = resolve(load_scenario(str(p)))
    assert d.gpu.name == "LAB-GPU" and d.gpu.bw_peak_tbs == 0.5
    assert d.total_kv_blocks == vllm_kv_capacity(d.model_config, d.gpu).blocks       # its 96 GiB
    h100 = resolve(sc(hardware="H100")).new_latency_model()
    b = decode_batch()
    # decode is memory bound: 6.7x less bandwidth ⇒ 6.7x slower steps (± truncation)
    assert d.new_latency_model().step_time_us(b) == pytest.approx(h100.step_time_us(b) * 3.35 / 0.5, rel=1e-3)


def test_hardware_config_json_gpu_is_usable():
    # 27.5 GiB of Qwen3-14B weights: vllm needs util 0.95 on 32 GiB (at 0.9 it is 0.01 GiB short)
    d = resolve(sc(hardware="TEST-GPU", tp=1, hardware_config=str(DATA / "hardware_config.json"),
                   engine={"gpu_memory_utilization": 0.95}))
    assert d.gpu.memory_gib == 32.0 and d.total_kv_blocks > 0


def test_defaults_filepath_overrides_and_finds_files_beside_it():
    path = str(DATA / "blis_defaults.yaml")
    d = resolve(sc(model="test/tiny-model", latency={"model": "blackbox"}, defaults_filepath=path))
    assert (d.hardware, d.tp, d.vllm_version, d.total_kv_blocks) == ("TEST-GPU", 2, "v9.9.9", 4321)
    assert d.new_latency_model().beta == [1000.0, 2.0, 3.0]
    # roofline: model_configs/tiny-model/config.json and hardware_config.json next to the file
    d = resolve(sc(model="test/tiny-model", defaults_filepath=path))
    assert d.gpu.name == "TEST-GPU" and d.model_config.hidden_size == 1024
    assert d.total_kv_blocks == 4321                      # the file's row, for every backend
    assert resolve(sc(hardware="H100", defaults_filepath=path)).total_kv_blocks == 1234


# ---------------------------------------------------------------------------- KV store
def test_cpu_tier_uses_the_tiered_cache():
    from blis_simpy.kv.tiered import TieredKVCache
    d = resolve(sc(latency={"model": "blackbox", "alpha_coeffs": [1, 0, 0], "beta_coeffs": [1, 1, 1]},
                   model="acme/m", engine={"total_kv_blocks": 100, "kv_cpu_blocks": 400,
                                           "kv_transfer_bandwidth": 50.0, "kv_transfer_base_latency_us": 100,
                                           "kv_offload_threshold": 0.0}))
    kv = d.new_kv_cache()
    assert isinstance(kv, TieredKVCache) and kv.total_blocks == 100 and kv.cpu_capacity == 400
    assert kv.reload_cost_us == 100 + 1 and "CPU KV tier: 400 blocks" in "\n".join(d.notes)
    no_tier = resolve(sc(latency={"model": "blackbox", "alpha_coeffs": [1, 0, 0], "beta_coeffs": [1, 1, 1]},
                         model="acme/m", engine={"total_kv_blocks": 100}))
    assert not isinstance(no_tier.new_kv_cache(), TieredKVCache)


@pytest.mark.parametrize("model, tp", [
    ("meta-llama/llama-3.1-8b", 1),          # no catalog defaults: needed --tp
    ("qwen/qwen3-14b", 1),                   # catalog defaults (BLIS's defaults.yaml): TP 1
    ("meta-llama/llama-3.3-70b-instruct", 2),  # catalog said TP 4; 141 GB of weights need 2 x 80 GB
    ("ibm-granite/granite-3.1-8b-instruct", 1),  # catalog said TP 4
])
def test_the_default_tp_of_an_analytical_run_is_one_rule_for_every_model(model, tp):
    """`--model meta-llama/llama-3.1-8b --hardware H100` needed --tp where qwen/qwen3-14b did
    not (a catalog default). Now: the smallest of 1, 2, 4, 8 whose weights leave a KV cache."""
    d = resolve(Scenario(model=model, hardware="H100", latency={"model": "physics"}))
    assert d.tp == tp
    assert f"tp {tp}: the smallest TP whose weights and a KV cache fit on H100 (no tp given)" in d.notes
    if tp > 1:   # the TP below does not fit
        with pytest.raises(ConfigError, match="does not fit"):
            resolve(Scenario(model=model, hardware="H100", tp=tp // 2, latency={"model": "physics"}))


def test_blackbox_keeps_the_catalog_tp_its_rows_are_keyed_by():
    d = resolve(Scenario(model="ibm-granite/granite-3.1-8b-instruct", latency={"model": "blackbox"}))
    assert (d.hardware, d.tp) == ("H100", 4) and "tp 4: default of ibm-granite/granite-3.1-8b-instruct" in d.notes


def test_an_unknown_model_says_so_with_the_closest_catalog_names():
    """Was "--tp: physics needs tensor parallelism > 0" for a typo in the model name."""
    with pytest.raises(ConfigError) as e:
        resolve(Scenario(model="qwen/qwen3-15b", hardware="H100", latency={"model": "physics"}))
    assert e.value.field == "model"
    assert e.value.problem.startswith("unknown model qwen/qwen3-15b (did you mean qwen/qwen3-14b or ")
