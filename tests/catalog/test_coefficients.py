"""The coefficient catalog: BLIS's rows, first-match lookup, defaults, errors, overrides."""

from __future__ import annotations

import pytest

from blis_simpy.catalog.coefficients import builtin_coefficients, normalize_vllm, read_blis_defaults
from blis_simpy.errors import ConfigError

from .conftest import COUNTS, DATA


def test_every_defaults_yaml_row_is_found_first_match_wins(reference, blis_defaults):
    cat = builtin_coefficients()
    seen = set()
    for m in blis_defaults["models"]:
        key = (m["id"], m["GPU"], m["tensor_parallelism"], m["vllm_version"])
        r = cat.find(*key)
        assert r is not None, key
        if key in seen:                       # a later duplicate never matches in BLIS either
            continue
        seen.add(key)
        assert list(r.alpha) == m["alpha_coeffs"] and list(r.beta) == m["beta_coeffs"], key
        assert r.kv_blocks == m["total_kv_blocks"], key
        assert r.loss == m.get("best_loss"), key
    assert sum(len(rows) for rows in cat.blackbox.values()) == 87    # the shadowed duplicates left out
    assert (len(blis_defaults["models"]), len(seen)) == COUNTS[reference.kind][:2]


def test_deployment_defaults_and_global_sets_match_defaults_yaml(reference, blis_defaults):
    cat = builtin_coefficients()
    assert len(cat.defaults) == 30 and len(blis_defaults["defaults"]) == COUNTS[reference.kind][2]
    for mid, d in blis_defaults["defaults"].items():
        ours = cat.deployment_defaults(mid)
        assert (ours.gpu, ours.tp, ours.vllm) == (d["GPU"], d["tensor_parallelism"],
                                                  normalize_vllm(d["vllm_version"]))
    for ours, theirs in ((cat.crossmodel, "crossmodel_defaults"),
                         (cat.trained_roofline, "trained_roofline_defaults")):
        assert list(ours.alpha) == blis_defaults[theirs]["alpha_coeffs"]
        assert list(ours.beta) == blis_defaults[theirs]["beta_coeffs"]


def test_reading_blis_defaults_yaml_gives_the_same_catalog(reference):
    theirs = read_blis_defaults(str(reference.path("defaults.yaml")))
    ours = builtin_coefficients()
    assert len(theirs.defaults) == COUNTS[reference.kind][2]
    assert theirs.defaults == {m: ours.defaults[m] for m in theirs.defaults}
    for model, rows in theirs.blackbox.items():
        for r in rows:
            assert ours.find(model, r.gpu, r.tp, r.vllm) == theirs.find(model, r.gpu, r.tp, r.vllm)
    assert (theirs.crossmodel, theirs.trained_roofline) == (ours.crossmodel, ours.trained_roofline)


def test_key_rows_of_the_spec():
    cat = builtin_coefficients()
    r = cat.blackbox_row("qwen/qwen3-14b", "H100", 1, "vllm/vllm-openai:v0.11.0")
    assert r.alpha == (8888.089034078324, 0.18488961143592303, 0.0)
    assert r.beta == (13578.186662538783, 39.44465647189146, 27.3227753326911) and r.kv_blocks == 17600
    assert cat.kv_blocks("meta-llama/llama-3.1-8b-instruct", "H100", 4, "v0.8.4") == 559190
    assert cat.kv_blocks("qwen/qwen3-14b", "A100-SXM", 1, "v0.11.0") is None
    d = cat.deployment_defaults("Qwen/Qwen3-14B")
    assert (d.gpu, d.tp, d.vllm) == ("H100", 1, "v0.11.0")


def test_missing_combination_is_one_line_listing_what_exists():
    cat = builtin_coefficients()
    with pytest.raises(ConfigError) as e:
        cat.blackbox_row("meta-llama/llama-3.1-8b-instruct", "H100", 8, "v0.8.4")
    msg = str(e.value)
    assert "\n" not in msg and msg.count("No trained coefficients found") == 1
    assert "TP=8" in msg
    for listed in ("A100-80 TP1 v0.8.4", "H100 TP1 v0.11.0", "H100 TP2 v0.8.4", "H100 TP4 v0.8.4"):
        assert listed in msg
    with pytest.raises(ConfigError) as e:
        cat.blackbox_row("qwen/qwen3-32b", "H100", 1, "v0.11.0")
    assert "no blackbox coefficients exist for qwen/qwen3-32b" in str(e.value)
    assert "qwen/qwen3-14b" in str(e.value)


def test_vllm_versions_with_or_without_the_image_prefix():
    assert normalize_vllm("vllm/vllm-openai:v0.8.4") == normalize_vllm(" v0.8.4 ") == "v0.8.4"
    cat = builtin_coefficients()
    assert cat.find("microsoft/phi-4", "H100", 2, "v0.8.4") == cat.find("microsoft/phi-4", "H100", 2,
                                                                          "vllm/vllm-openai:v0.8.4")
    assert cat.find("microsoft/phi-4", "H100", 2, "v0.11.0") is None


def test_a_blis_defaults_file_overrides_the_builtin_catalog():
    over = read_blis_defaults(str(DATA / "blis_defaults.yaml")).layered_over(builtin_coefficients())
    r = over.find("qwen/qwen3-14b", "H100", 1, "v0.11.0")
    assert r.alpha == (1.0, 0.0, 0.0) and r.kv_blocks == 1234                  # the file's row first
    assert over.find("test/tiny-model", "TEST-GPU", 2, "v9.9.9").kv_blocks == 4321
    assert over.find("microsoft/phi-4", "H100", 2, "v0.8.4") is not None        # built-ins remain
    assert over.deployment_defaults("test/tiny-model").gpu == "TEST-GPU"
    assert over.crossmodel.beta == (10.0, 20.0, 30.0, 40.0)
    assert over.trained_roofline == builtin_coefficients().trained_roofline   # not in the file


@pytest.mark.parametrize("content, problem", [
    ("colour: red\n", "unknown top-level keys"),
    ("models:\n  - GPU: H100\n", "needs an id"),
    ("models:\n  - {id: a/b, alpha_coeffs: [x], beta_coeffs: [1]}\n", "must be a list of numbers"),
    ("defaults: [\n", "invalid YAML"),
])
def test_bad_blis_defaults_files(tmp_path, content, problem):
    p = tmp_path / "defaults.yaml"
    p.write_text(content)
    with pytest.raises(ConfigError, match=problem):
        read_blis_defaults(str(p))
