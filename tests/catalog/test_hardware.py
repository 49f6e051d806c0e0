"""The GPU catalog: built-in figures, lookups, BLIS hardware_config.json, scenario GPUs."""

from __future__ import annotations

import json
import math

import pytest

from blis_simpy.catalog.hardware import BLIS_KEYS, builtin_gpus, gpu_catalog, read_hardware_json
from blis_simpy.config.scenario import GPUEntry
from blis_simpy.errors import ConfigError

from .conftest import DATA

ISSUE_GPUS = ("H100", "A100-SXM", "A100-80", "L40S", "H200", "B200", "RTX-4090", "RTX-PRO-6000")


def test_every_gpu_of_the_issue_is_in_the_catalog_with_a_source():
    cat = builtin_gpus()
    assert set(ISSUE_GPUS) <= set(cat.names())
    for name in ISSUE_GPUS:
        g = cat.get(name)
        assert g.name == name and g.source, name
        assert g.tflops_peak > 0 and g.bw_peak_tbs > 0 and g.memory_gib > 0, name
        assert 0 < g.mfu_prefill <= 1 and 0 < g.mfu_decode <= 1, name
        assert g.tflops_fp8 == 0 or g.tflops_fp8 >= g.tflops_peak, name   # FP8 is never slower


def test_new_gpus_have_their_datasheet_figures():
    cat = builtin_gpus()
    figures = {  # dense BF16, dense FP8, TB/s, GB
        "H200": (989.5, 1979.0, 4.8, 141.0), "B200": (2250.0, 4500.0, 8.0, 180.0),
        "RTX-4090": (165.2, 330.3, 1.008, 24.0), "RTX-PRO-6000": (503.8, 1007.6, 1.792, 96.0)}
    for name, (bf16, fp8, bw, mem) in figures.items():
        g = cat.get(name)
        assert (g.tflops_peak, g.tflops_fp8, g.bw_peak_tbs, g.memory_gib) == (bf16, fp8, bw, mem)


def test_every_gpu_figure_cites_its_source_in_the_data_file():
    from importlib import resources
    text = resources.files("blis_simpy.catalog").joinpath("data/gpus.yaml").read_text("utf-8")
    for line in text.splitlines():
        key = line.strip().split(":")[0]
        if key in BLIS_KEYS:
            assert "#" in line and len(line.split("#", 1)[1].strip()) > 10, line


def test_blis_gpus_match_hardware_config_json(reference):
    ref = json.loads(reference.path("hardware_config.json").read_text())
    assert len(ref) == (4 if reference.full else 2)        # the excerpt keeps H100 and L40S
    cat = builtin_gpus()
    for name, fig in ref.items():
        g = cat.get(name)
        for ours, theirs in BLIS_KEYS.items():
            assert getattr(g, ours) == float(fig[theirs]), (name, ours)


def test_lookup_is_exact_then_case_insensitive_with_aliases():
    cat = builtin_gpus()
    assert cat.get("h100").name == "H100"
    assert cat.get("RTX 4090").name == "RTX-4090"
    assert cat.get("rtx pro 6000 blackwell").name == "RTX-PRO-6000"
    with pytest.raises(ConfigError) as e:
        cat.get("H300")
    msg = str(e.value)
    assert "H300" in msg and all(n in msg for n in ISSUE_GPUS) and e.value.field == "hardware"


def test_hardware_config_json_adds_gpus():
    cat = gpu_catalog(str(DATA / "hardware_config.json"))
    g = cat.get("TEST-GPU")
    assert (g.tflops_peak, g.bw_peak_tbs, g.mfu_prefill, g.mfu_decode, g.memory_gib) == (100.0, 1.0, 0.5, 0.25, 32.0)
    assert "H100" in cat                                       # built-ins stay


@pytest.mark.parametrize("content, problem", [
    ("{", "invalid JSON"), ("[1]", "expected an object"),
    ('{"X": {"TFlopsPeak": -1}}', "TFlopsPeak must be a finite number >= 0"),
    ('{"X": {"TFlopsPeak": "fast"}}', "TFlopsPeak must be a finite number >= 0"),
])
def test_bad_hardware_config_json(tmp_path, content, problem):
    p = tmp_path / "hw.json"
    p.write_text(content)
    with pytest.raises(ConfigError) as e:
        read_hardware_json(str(p))
    assert problem in str(e.value)


def test_missing_hardware_config_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        gpu_catalog(str(tmp_path / "none.json"))


def test_scenario_gpus_override_and_extend():
    mine = GPUEntry(tflops_peak=10.0, bw_peak_tbs=0.5, mfu_prefill=0.5, mfu_decode=0.5, memory_gib=8.0,
                    source="my lab")
    cat = gpu_catalog("", {"H100": mine, "LAB": mine})
    assert cat.get("LAB").tflops_peak == 10.0 and cat.get("LAB").source == "my lab"
    assert cat.get("H100").tflops_peak == 10.0                 # the scenario wins
    assert not math.isclose(builtin_gpus().get("H100").tflops_peak, 10.0)


@pytest.mark.parametrize(("text", "problem"), [
    ("[" * 100_000 + "]" * 100_000, "invalid JSON: nested too deeply"),
    (" " * (4 << 20) + "{}", "larger than 4194304 characters"),
])
def test_an_unreadable_hardware_config_is_a_located_error(tmp_path, text, problem):
    """A deeply nested file was a RecursionError internal error; a file of any size was read."""
    path = tmp_path / "hw.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem) as ei:
        read_hardware_json(str(path))
    assert ei.value.file == str(path) and ei.value.field == "hardware_config"
