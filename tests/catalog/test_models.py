"""The offline model catalog: every model of the issue, shapes equal to the parsed config.json."""

from __future__ import annotations

import dataclasses

import pytest

from blis_simpy.catalog.hfconfig import derive_max_model_len, parse_hf_config
from blis_simpy.catalog.models import builtin_models, parse_models
from blis_simpy.errors import ConfigError
from tests.conftest import conformance_case

from .conftest import COUNTS

EXTRA_MODELS = ("qwen/qwen3-32b", "qwen/qwen3-30b-a3b", "mistralai/mixtral-8x7b-v0.1",
                "meta-llama/llama-3.1-70b", "deepseek-ai/deepseek-v3")


def test_every_model_of_defaults_yaml_is_in_the_catalog(reference, blis_defaults):
    ids = set(blis_defaults["defaults"]) | {m["id"] for m in blis_defaults["models"]}
    assert len(ids) == COUNTS[reference.kind][3]
    missing = sorted(i for i in ids if i not in builtin_models())
    assert not missing


def test_the_issue_s_extra_models_are_in_the_catalog():
    cat = builtin_models()
    for name in EXTRA_MODELS:
        c = cat.get(name)
        assert c.num_layers > 0 and c.hidden_size % c.num_heads == 0, name
    assert cat.get("Qwen/Qwen3-32B").num_layers == 64                      # lookups lower-case


def test_every_model_is_well_formed():
    for name, e in builtin_models().entries.items():
        c = e.config
        assert name == name.lower() and e.hf_repo.lower().endswith(name.split("/", 1)[1]), name
        assert c.num_layers > 0 and c.hidden_size > 0 and c.num_heads > 0 and c.vocab_size > 0, name
        assert 0 < c.num_kv_heads <= c.num_heads and c.num_heads % c.num_kv_heads == 0, name
        assert c.bytes_per_param == 2.0 and c.hidden_act == "silu", name
        assert c.max_position_embeddings > 0 and c.intermediate_size > 0, name
        assert not c.is_moe or 0 < c.num_experts_per_tok <= c.num_local_experts, name


@pytest.mark.parametrize("case, model", [
    ("B13_roofline_qwen3_14b_h100_tp1", "qwen/qwen3-14b"),
    ("B15_roofline_mixtral_moe_h100_tp2", "mistralai/mixtral-8x7b-instruct-v0.1"),
])
def test_catalog_shape_equals_the_parsed_config_json(case, model):
    """The catalog entry is what the HF parser makes of the model's real config.json."""
    path = conformance_case(case) / "model_config.json"
    parsed = parse_hf_config(str(path), name=model)
    ours = builtin_models().get(model)
    for f in dataclasses.fields(ours):
        if f.name not in ("rope_scaling",):
            assert getattr(ours, f.name) == getattr(parsed, f.name), f.name


def test_quantised_variants_inherit_the_base_shape():
    cat = builtin_models()
    base = cat.get("microsoft/phi-4")
    for name, w in (("redhatai/phi-4-fp8-dynamic", 1.0), ("redhatai/phi-4-quantized.w4a16", 0.5),
                    ("redhatai/phi-4-quantized.w8a8", 1.0)):
        q = cat.get(name)
        assert q.weight_bytes_per_param == w and q.effective_weight_bytes_per_param == w
        assert dataclasses.replace(q, name=base.name, weight_bytes_per_param=0.0) == base
    assert base.effective_weight_bytes_per_param == 2.0
    assert cat.find("redhatai/phi-4-fp8-dynamic").hf_repo == "RedHatAI/phi-4-FP8-dynamic"


def test_moe_shapes():
    cat = builtin_models()
    ds = cat.get("deepseek-ai/deepseek-v3")
    assert (ds.num_local_experts, ds.num_experts_per_tok, ds.moe_intermediate_size,
            ds.shared_expert_intermediate_size, ds.weight_bytes_per_param) == (256, 8, 2048, 2048, 1.0)
    q = cat.get("qwen/qwen3-30b-a3b")
    assert (q.num_local_experts, q.num_experts_per_tok, q.moe_intermediate_size) == (128, 8, 768)
    assert not cat.get("qwen/qwen3-32b").is_moe and cat.get("mistralai/mixtral-8x7b-v0.1").is_moe


@pytest.mark.parametrize("model, expected", [
    ("qwen/qwen3-14b", 40960),                          # no rope scaling
    ("meta-llama/llama-3.1-8b-instruct", 131072),       # llama3 rope: already the full context
    ("openai/gpt-oss-120b", 4096 * 32),                 # yarn: original_max_position_embeddings x factor
    ("deepseek-ai/deepseek-v3", 4096 * 40),
])
def test_derived_max_model_len(model, expected):
    assert derive_max_model_len(builtin_models().get(model)) == expected


def test_unknown_model_error_says_what_to_do():
    with pytest.raises(ConfigError) as e:
        builtin_models().get("acme/unknown-7b")
    assert "--model-config-folder" in str(e.value) and "qwen/qwen3-14b" in str(e.value)


@pytest.mark.parametrize("table, problem", [
    ({"a/x": {"num_layers": 2, "dtype": "bfloat16", "colour": "red"}}, "unknown keys"),
    ({"a/x": {"num_layers": -2, "dtype": "bfloat16"}}, "num_layers must be an integer >= 0"),
    ({"a/x": {"num_layers": 2, "dtype": "float13"}}, "dtype must be one of"),
    ({"a/x": {"like": "a/y"}}, "unknown or circular"),
    ({"a/x": {"like": "a/x"}}, "unknown or circular"),
])
def test_bad_catalog_entries_are_rejected(table, problem):
    with pytest.raises(ConfigError, match=problem):
        parse_models(table)


# ------------------------------------------------------------------ issue 8: head_dim, MoE layout
@pytest.mark.parametrize("model, head_dim, hidden_over_heads", [
    ("qwen/qwen3-14b", 128, 128), ("qwen/qwen3-32b", 128, 80), ("qwen/qwen3-30b-a3b", 128, 64),
    ("mistralai/mistral-small-24b-instruct-2501", 128, 160),
    ("redhatai/mistral-small-3.1-24b-instruct-2503-quantized.w4a16", 128, 160),   # via like:
    ("openai/gpt-oss-120b", 64, 45), ("openai/gpt-oss-20b", 64, 45),
    ("meta-llama/llama-4-maverick-17b-128e-instruct-fp8", 128, 128),
])
def test_declared_head_dim(model, head_dim, hidden_over_heads):
    c = builtin_models().get(model)
    assert (c.head_dim, c.real_head_dim, c.hidden_size // c.num_heads) == (head_dim, head_dim, hidden_over_heads)


def test_models_without_head_dim_fall_back_to_hidden_over_heads():
    for name, e in builtin_models().entries.items():
        c = e.config
        if c.head_dim == 0:
            assert c.real_head_dim == c.hidden_size // c.num_heads, name


def test_moe_layouts_of_llama4_and_deepseek():
    cat = builtin_models()
    scout = cat.get("meta-llama/llama-4-scout-17b-16e-instruct")
    assert (scout.interleave_moe_layer_step, scout.dense_intermediate_size, scout.num_moe_layers) == (1, 16384, 48)
    mav = cat.get("meta-llama/llama-4-maverick-17b-128e-instruct-fp8")
    assert (mav.interleave_moe_layer_step, mav.dense_intermediate_size, mav.num_moe_layers) == (2, 16384, 24)
    ds = cat.get("deepseek-ai/deepseek-v3")
    assert (ds.first_k_dense_replace, ds.kv_lora_rank, ds.qk_rope_head_dim, ds.num_moe_layers) == (3, 512, 64, 58)
    assert cat.get("qwen/qwen3-30b-a3b").num_moe_layers == 48 and cat.get("qwen/qwen3-32b").num_moe_layers == 0


def test_llama_3_1_8b_base_model_of_the_real_runs():
    cat = builtin_models()
    base, inst = cat.find("meta-llama/Llama-3.1-8B"), cat.get("meta-llama/llama-3.1-8b-instruct")
    assert base.hf_repo == "meta-llama/Llama-3.1-8B"
    assert dataclasses.replace(base.config, name=inst.name) == inst                # same shape
    assert (base.config.num_layers, base.config.hidden_size, base.config.num_kv_heads,
            base.config.intermediate_size, base.config.vocab_size) == (32, 4096, 8, 14336, 128256)


def test_new_catalog_keys_are_validated():
    with pytest.raises(ConfigError, match="head_dim must be an integer >= 0"):
        parse_models({"a/x": {"num_layers": 2, "dtype": "bfloat16", "head_dim": -64}})
    with pytest.raises(ConfigError, match="kv_lora_rank must be an integer >= 0"):
        parse_models({"a/x": {"num_layers": 2, "dtype": "bfloat16", "kv_lora_rank": 1.5}})
