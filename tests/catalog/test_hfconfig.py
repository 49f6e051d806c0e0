"""HuggingFace config.json parsing and max_model_len derivation (docs/latency-models.md)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from blis_simpy.catalog.hfconfig import (
    cap_max_model_len,
    derive_max_model_len,
    load_hf_json,
    looks_like_hf_config,
    parse_hf_config,
    weight_bytes_from_quantization,
)
from blis_simpy.catalog.types import ModelConfig
from blis_simpy.errors import ConfigError
from tests.conftest import conformance_case

BASE = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "intermediate_size": 11008, "vocab_size": 32000, "torch_dtype": "bfloat16",
        "max_position_embeddings": 4096}


def cfg(**kw) -> dict:
    d = dict(BASE)
    for k, v in kw.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return d


# ------------------------------------------------------------------------- basic fields
def test_qwen3_conformance_config():
    path = conformance_case("B13_roofline_qwen3_14b_h100_tp1") / "model_config.json"
    m = parse_hf_config(path, name="qwen/qwen3-14b")
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads) == (40, 5120, 40, 8)
    assert (m.intermediate_size, m.vocab_size, m.bytes_per_param) == (17408, 151936, 2.0)
    assert m.weight_bytes_per_param == 0.0 and m.effective_weight_bytes_per_param == 2.0
    assert m.hidden_act == "silu" and m.tie_word_embeddings is False
    assert m.max_position_embeddings == 40960 and m.rope_scaling is None
    assert m.model_type == "qwen3" and m.name == "qwen/qwen3-14b"
    assert not m.is_moe and not m.moe_count_missing
    assert derive_max_model_len(m) == 40960


def test_mixtral_conformance_config():
    path = conformance_case("B15_roofline_mixtral_moe_h100_tp2") / "model_config.json"
    m = parse_hf_config(path)
    assert (m.num_local_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (8, 2, 0)
    assert m.is_moe and m.shared_expert_intermediate_size == 0
    assert derive_max_model_len(m) == 32768


def test_missing_fields_are_zero():
    m = parse_hf_config({})
    assert m == ModelConfig()
    m = parse_hf_config({"hidden_size": 8, "num_hidden_layers": None})
    assert m.hidden_size == 8 and m.num_layers == 0 and m.num_kv_heads == 0


def test_integers_are_truncated_toward_zero():
    m = parse_hf_config(cfg(hidden_size=4096.9, num_hidden_layers=-3.7, vocab_size=1e5))
    assert (m.hidden_size, m.num_layers, m.vocab_size) == (4096, -3, 100000)


@pytest.mark.parametrize("key,value", [
    ("hidden_size", "4096"), ("num_hidden_layers", True), ("num_attention_heads", [32]),
    ("intermediate_size", float("nan")), ("vocab_size", 1e19), ("hidden_act", 3),
    ("tie_word_embeddings", "yes"), ("torch_dtype", 16),
])
def test_wrong_types_name_the_file_and_field(tmp_path, key, value):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg(**{key: value})))
    with pytest.raises(ConfigError) as ei:
        parse_hf_config(p)
    assert ei.value.file == str(p) and ei.value.field == key
    with pytest.raises(ConfigError) as ei:
        parse_hf_config(cfg(**{key: value}), file="inline.json")
    assert ei.value.file == "inline.json" and ei.value.field == key


def test_text_config_pivot_overwrites_top_level():
    raw = {"model_type": "llava", "hidden_size": 1024, "vocab_size": 5,
           "text_config": {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                           "num_attention_heads": 32, "num_key_value_heads": 8,
                           "max_position_embeddings": 32768}}
    m = parse_hf_config(raw)
    assert m.model_type == "mistral" and m.hidden_size == 4096 and m.num_kv_heads == 8
    assert m.vocab_size == 5            # kept from the top level (not in text_config)
    assert looks_like_hf_config({"text_config": {"hidden_size": 1}})
    assert looks_like_hf_config({"num_hidden_layers": 1})
    assert not looks_like_hf_config({"text_config": {"foo": 1}})
    assert not looks_like_hf_config([1, 2])


def test_kv_heads_chain():
    assert parse_hf_config(cfg(num_key_value_heads=8)).num_kv_heads == 8
    assert parse_hf_config(cfg(num_key_value_heads=0, num_kv_heads=4)).num_kv_heads == 4
    assert parse_hf_config(cfg(num_key_value_heads=None, multi_query_group_num=2)).num_kv_heads == 2
    assert parse_hf_config(cfg(num_kv_heads=0, multi_query_group_num=0)).num_kv_heads == 32
    # first non-zero wins
    assert parse_hf_config(cfg(num_key_value_heads=2, num_kv_heads=4)).num_kv_heads == 2


def test_intermediate_fallback():
    assert parse_hf_config(cfg(intermediate_size=..., ffn_hidden_size=13696)).intermediate_size == 13696
    assert parse_hf_config(cfg(intermediate_size=0, ffn_hidden_size=7)).intermediate_size == 7
    assert parse_hf_config(cfg(ffn_hidden_size=7)).intermediate_size == 11008


@pytest.mark.parametrize("fields,bpp", [
    ({"torch_dtype": "float32"}, 4.0), ({"torch_dtype": "float16"}, 2.0),
    ({"torch_dtype": "bfloat16"}, 2.0), ({"torch_dtype": "int8"}, 1.0), ({"torch_dtype": "uint8"}, 1.0),
    ({"torch_dtype": "fp8"}, 1.0), ({"torch_dtype": "int4"}, 1.0), ({"torch_dtype": "nf4"}, 1.0),
    ({"torch_dtype": ..., "dtype": "float16"}, 2.0), ({"torch_dtype": None, "dtype": "float32"}, 4.0),
    ({"torch_dtype": "float64"}, 0.0), ({"torch_dtype": ...}, 0.0),
])
def test_bytes_per_param(fields, bpp):
    assert parse_hf_config(cfg(**fields)).bytes_per_param == bpp


# ------------------------------------------------------------------------------ experts
@pytest.mark.parametrize("fields,experts", [
    ({"num_local_experts": 8}, 8),
    ({"num_local_experts": 1, "num_experts": 1}, 1),          # single expert: dense
    ({"num_local_experts": 1, "num_experts": 64}, 64),
    ({"num_routed_experts": 1, "n_routed_experts": 64, "num_experts": 128}, 64),
    ({"num_routed_experts": 16, "n_routed_experts": 64}, 16),
    ({"num_experts": 128}, 128),
    ({"num_experts": 1}, 0),
    ({}, 0),
])
def test_expert_count_chain(fields, experts):
    m = parse_hf_config(cfg(num_experts_per_tok=1, **fields))
    assert m.num_local_experts == experts
    assert m.is_moe == (experts > 1)


def test_moe_dims_and_shared_experts():
    qwen_moe = cfg(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                   shared_expert_intermediate_size=5632)
    m = parse_hf_config(qwen_moe)
    assert (m.num_local_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (60, 4, 1408)
    assert m.shared_expert_intermediate_size == 5632
    ds = parse_hf_config(cfg(n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408,
                             n_shared_experts=2))
    assert ds.shared_expert_intermediate_size == 2 * 1408
    no_moe_dim = parse_hf_config(cfg(n_routed_experts=64, n_shared_experts=1))
    assert no_moe_dim.shared_expert_intermediate_size == 11008
    assert parse_hf_config(cfg(num_local_experts=8)).shared_expert_intermediate_size == 0


def test_head_dim_present_absent_or_null():
    qwen3_32b = cfg(num_hidden_layers=64, hidden_size=5120, num_attention_heads=64, num_key_value_heads=8,
                    head_dim=128)
    m = parse_hf_config(qwen3_32b)
    assert m.head_dim == 128 and m.real_head_dim == 128 and m.hidden_size // m.num_heads == 80
    absent = parse_hf_config(cfg())                                  # 4096 / 32
    assert absent.head_dim == 0 and absent.real_head_dim == 128
    assert parse_hf_config(cfg(head_dim=None)).head_dim == 0          # Mixtral writes null
    nested = parse_hf_config({"text_config": cfg(head_dim=64, hidden_size=2880, num_attention_heads=64)})
    assert (nested.head_dim, nested.real_head_dim) == (64, 64)       # gpt-oss shape, via text_config


def test_head_dim_of_the_wrong_type_names_the_key():
    with pytest.raises(ConfigError) as e:
        parse_hf_config(cfg(head_dim="128"), file="c.json")
    assert (e.value.file, e.value.field) == ("c.json", "head_dim")


def test_moe_layout_and_mla_fields():
    llama4 = {"architectures": ["Llama4ForConditionalGeneration"],
              "text_config": cfg(num_hidden_layers=48, hidden_size=5120, num_attention_heads=40, head_dim=128,
                                 num_local_experts=128, num_experts_per_tok=1, intermediate_size=8192,
                                 intermediate_size_mlp=16384, interleave_moe_layer_step=2)}
    m = parse_hf_config(llama4)
    assert (m.interleave_moe_layer_step, m.dense_intermediate_size, m.intermediate_size) == (2, 16384, 8192)
    assert m.num_moe_layers == 24 and m.first_k_dense_replace == 0
    ds = parse_hf_config(cfg(num_hidden_layers=61, n_routed_experts=256, num_experts_per_tok=8,
                             first_k_dense_replace=3, kv_lora_rank=512, qk_rope_head_dim=64))
    assert (ds.first_k_dense_replace, ds.kv_lora_rank, ds.qk_rope_head_dim) == (3, 512, 64)
    assert ds.num_moe_layers == 58 and ds.head_dim == 0 and ds.dense_intermediate_size == 0
    dense = parse_hf_config(cfg(first_k_dense_replace=3))
    assert dense.num_moe_layers == 0                                  # no experts: nothing is MoE


def test_moe_count_missing():
    assert parse_hf_config(cfg(num_experts_per_tok=2)).moe_count_missing
    assert parse_hf_config(cfg(n_shared_experts=1)).moe_count_missing
    assert parse_hf_config(cfg(num_local_experts=1, num_experts_per_tok=1)).moe_count_missing
    assert not parse_hf_config(cfg(num_local_experts=8, num_experts_per_tok=2)).moe_count_missing
    assert not parse_hf_config(cfg()).moe_count_missing


def test_hidden_act_and_tied_embeddings():
    m = parse_hf_config(cfg(hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True))
    assert m.hidden_act == "gelu_pytorch_tanh" and m.tie_word_embeddings
    m = parse_hf_config(cfg())
    assert m.hidden_act == "" and not m.tie_word_embeddings


# -------------------------------------------------------------------------- quantisation
@pytest.mark.parametrize("qc,name,wbpp", [
    ({"bits": 4, "quant_method": "gptq"}, "", 0.5),
    ({"bits": "8"}, "", 1.0),
    ({"bits": " 4 ", "quant_method": "fp8"}, "", 0.5),           # bits beat quant_method
    ({"bits": "four", "quant_method": "FP8"}, "", 1.0),          # unparsable bits: next rule
    ({"bits": 0, "quant_method": "fp8"}, "", 1.0),
    ({"quant_method": "Fp8", "activation_scheme": "dynamic"}, "", 1.0),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "group_1": {"weights": {"num_bits": 8}}, "group_0": {"weights": {"num_bits": 4}}}}, "", 0.5),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 0}}, "group_1": {"weights": {"num_bits": 8}}}}, "", 1.0),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": None}}}, "", 0.0),
    ({"quant_method": "awq"}, "redhatai/phi-4-quantized.w4a16", 0.5),       # falls to the name
    ({"bits": 8}, "redhatai/phi-4-quantized.w4a16", 1.0),                    # config wins
    (None, "redhatai/phi-4-quantized.w8a8", 1.0),
    (None, "w4a16", 0.5),
    (None, "org/model_w4a16_v2", 0.5),
    (None, "redhatai/smollm3-3b-fp8-dynamic", 1.0),
    (None, "org/fp8", 1.0),
    (None, "org/model-w4a16x", 0.0),          # not bounded
    (None, "org/xw4a16", 0.0),
    (None, "org/model-fp8x", 0.0),
    (None, "org/model-fp16", 0.0),
    (None, "", 0.0),
])
def test_quantisation_tiers(qc, name, wbpp):
    raw = cfg() if qc is None else cfg(quantization_config=qc)
    assert weight_bytes_from_quantization(raw, name) == wbpp
    m = parse_hf_config(raw, name=name)
    assert m.weight_bytes_per_param == wbpp
    assert m.effective_weight_bytes_per_param == (wbpp or 2.0)


# ------------------------------------------------------------------------ max_model_len
def mml(**kw) -> int:
    return derive_max_model_len(parse_hf_config(cfg(**kw)))


@pytest.mark.parametrize("kw,expected", [
    ({}, 4096),
    ({"rope_scaling": None}, 4096),
    ({"rope_scaling": "linear"}, 4096),                                         # not an object
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, 8192),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4}}, 16384),
    ({"rope_scaling": {"rope_type": "default", "factor": 1.5}}, 6144),
    ({"rope_scaling": {"type": "mrope", "factor": 2.5}}, 10240),
    ({"rope_scaling": {"factor": 2.0}}, 8192),                                  # no type: scales
    ({"rope_scaling": {"type": "su", "factor": 8.0}}, 4096),
    ({"rope_scaling": {"type": "longrope", "factor": 8.0}}, 4096),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 4096),
    ({"rope_scaling": {"type": "su", "rope_type": "linear", "factor": 8.0}}, 4096),  # type wins
    ({"rope_scaling": {"type": "linear", "factor": 1.0}}, 4096),                # must be > 1
    ({"rope_scaling": {"type": "linear", "factor": 0.5}}, 4096),
    ({"rope_scaling": {"type": "linear", "factor": "2"}}, 4096),                # not a number
    ({"rope_scaling": {"type": "linear", "factor": True}}, 4096),
    ({"rope_scaling": {"type": "linear", "factor": float("inf")}}, 4096),
    ({"rope_scaling": {"type": "linear"}}, 4096),
    ({"rope_scaling": {"type": "linear", "factor": 1.3}}, 5324),                # int(5324.8)
    # yarn: the original length is scaled, not max_position_embeddings
    ({"max_position_embeddings": 131072,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131072),
    ({"max_position_embeddings": 40960,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131072),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 16384),            # no original: M
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}}, 16384),
    ({"rope_scaling": {"type": "linear", "factor": 2.0, "original_max_position_embeddings": 100}}, 8192),
    # overflow: unchanged
    ({"max_position_embeddings": 2**62, "rope_scaling": {"type": "linear", "factor": 4.0}}, 2**62),
    ({"max_position_embeddings": ...}, 0),
    ({"max_position_embeddings": ..., "rope_scaling": {"type": "linear", "factor": 2.0}}, 0),
    ({"max_position_embeddings": -5}, 0),
])
def test_rope_scaling_rules(kw, expected):
    assert mml(**kw) == expected


def test_gemma3_is_never_rescaled():
    rope = {"rope_type": "linear", "factor": 8.0}
    assert mml(model_type="gemma3", max_position_embeddings=131072, rope_scaling=rope) == 131072
    pivoted = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34,
        "max_position_embeddings": 131072, "rope_scaling": rope}}
    assert derive_max_model_len(parse_hf_config(pivoted)) == 131072
    assert mml(model_type="gemma2", rope_scaling=rope) == 32768


def test_rope_scaling_kept_raw():
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "beta_fast": 32}
    m = parse_hf_config(cfg(rope_scaling=rope))
    assert m.rope_scaling == rope
    assert derive_max_model_len(dataclasses.replace(m, max_position_embeddings=1000)) == 131072


def test_cap_to_kv_capacity():
    assert cap_max_model_len(40960, 17600, 16) == 40960
    assert cap_max_model_len(40960, 100, 16) == 1600
    assert cap_max_model_len(1601, 100, 16) == 1600       # ceil(1601/16) = 101 > 100
    assert cap_max_model_len(1600, 100, 16) == 1600
    assert cap_max_model_len(0, 100, 16) == 0


# ---------------------------------------------------------------------------- files
def test_load_from_file_and_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(cfg(num_key_value_heads=8)))
    assert parse_hf_config(tmp_path).num_kv_heads == 8
    assert parse_hf_config(str(tmp_path / "config.json")).num_kv_heads == 8
    assert load_hf_json(tmp_path)["hidden_size"] == 4096


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file") as ei:
        parse_hf_config(tmp_path / "nope.json")
    assert ei.value.file.endswith("nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(ConfigError, match="invalid JSON") as ei:
        parse_hf_config(bad)
    assert ei.value.file == str(bad) and ei.value.line == 3
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        parse_hf_config(arr)
    with pytest.raises(TypeError):
        parse_hf_config(42)


@pytest.mark.parametrize(("data", "problem"), [
    (b'{"hidden_size": "\xff"}', r"not valid UTF-8 \(invalid start byte at byte 17\)"),
    (b"\xff\xfe\x00{}", "not valid UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid JSON: nested too deeply"),
    (b" " * (4 << 20) + b"{}", "larger than 4194304 bytes"),
])
def test_unreadable_config_json_is_a_located_error(tmp_path, data, problem):
    """Found by CLI fuzzing: these were UnicodeDecodeError and RecursionError internal errors
    (exit 1), and a file of any size was read whole."""
    (tmp_path / "config.json").write_bytes(data)
    with pytest.raises(ConfigError, match=problem) as ei:
        load_hf_json(tmp_path)
    assert ei.value.file == str(tmp_path / "config.json")
