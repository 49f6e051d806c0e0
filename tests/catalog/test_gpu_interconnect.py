"""The GPU catalog's extra figures (issue 8): driver-reported memory and the interconnect of
TP/EP collectives, in gpus.yaml, a BLIS hardware_config.json and a scenario's ``gpus:``."""

from __future__ import annotations

import json
import math
from importlib import resources

import pytest

from blis_simpy.catalog.hardware import EXTRA_FIELDS, builtin_gpus, gpu_catalog, read_hardware_json
from blis_simpy.catalog.types import GPUSpec
from blis_simpy.config.loader import load_scenario
from blis_simpy.errors import ConfigError

from .conftest import DATA

#: nominal per-direction GB/s of each (interconnect, generation) the catalog uses
LINK_GBPS = {("nvlink", 3): 300.0, ("nvlink", 4): 450.0, ("nvlink", 5): 900.0,
             ("pcie", 4): 31.5, ("pcie", 5): 63.0}
RTX4090_TORCH_BYTES = 25_250_627_584


def test_every_gpu_has_every_extra_figure_and_they_are_sane():
    for name, e in builtin_gpus().entries.items():
        g = e.spec
        assert g.source, name
        for f in ("tflops_peak", "bw_peak_tbs", "memory_gib", "memory_torch_gib", "link_bw_gbps",
                  "collective_latency_us", "mfu_prefill", "mfu_decode"):
            v = getattr(g, f)
            assert isinstance(v, float) and math.isfinite(v) and v > 0, (name, f, v)
        # the driver reports less than the datasheet, but not much less (reserved memory, ECC)
        assert 0.9 * g.memory_gib < g.memory_torch_gib < g.memory_gib, name
        assert LINK_GBPS[(g.interconnect, g.interconnect_gen)] == g.link_bw_gbps, name
        assert g.interconnect == "pcie" or g.p2p, name                  # NVLink is peer-to-peer
        assert 1.0 <= g.collective_latency_us <= 100.0, name


def test_every_extra_figure_cites_its_source_in_the_data_file():
    text = resources.files("blis_simpy.catalog").joinpath("data/gpus.yaml").read_text("utf-8")
    seen = dict.fromkeys(EXTRA_FIELDS, 0)
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            key = line.strip().split(":")[0]
            if key in seen:
                seen[key] += 1
                assert "#" in line and len(line.split("#", 1)[1].strip()) > 10, line
    n = len(builtin_gpus().entries)
    assert seen == dict.fromkeys(EXTRA_FIELDS, n)          # written out for every GPU


def test_rtx_4090_driver_memory_is_the_measured_byte_count():
    g = builtin_gpus().get("RTX-4090")
    assert g.memory_torch_gib * 2**30 == RTX4090_TORCH_BYTES      # exact, to the byte
    assert f"{g.memory_torch_gib:.2f}" == "23.52"                  # what vLLM logs print
    assert (g.interconnect, g.interconnect_gen, g.link_bw_gbps, g.p2p) == ("pcie", 4, 31.5, False)


@pytest.mark.parametrize("name, figures", [
    # memory_torch_gib, interconnect, gen, GB/s per direction, p2p
    ("H100", (79.19, "nvlink", 4, 450.0, True)),
    ("A100-SXM", (79.15, "nvlink", 3, 300.0, True)),
    ("A100-80", (79.15, "nvlink", 3, 300.0, True)),
    ("H200", (139.81, "nvlink", 4, 450.0, True)),
    ("B200", (178.35, "nvlink", 5, 900.0, True)),
    ("L40S", (44.39, "pcie", 4, 31.5, True)),
    ("H100-PCIe", (79.19, "pcie", 5, 63.0, True)),
    ("RTX-PRO-6000", (94.97, "pcie", 5, 63.0, True)),
])
def test_reference_figures(name, figures):
    g = builtin_gpus().get(name)
    assert (g.memory_torch_gib, g.interconnect, g.interconnect_gen, g.link_bw_gbps, g.p2p) == figures


def test_blis_figures_are_unchanged():
    """BLIS's hardware_config.json figures (conformance depends on them), written out."""
    blis = {"H100": (989.5, 1979.0, 3.35, 0.45, 0.30, 80.0),
            "A100-SXM": (312.0, 0.0, 2.039, 0.38, 0.18, 80.0),
            "A100-80": (312.0, 0.0, 2.039, 0.38, 0.18, 80.0),
            "L40S": (362.05, 0.0, 0.864, 0.32, 0.08, 48.0)}
    for name, want in blis.items():
        g = builtin_gpus().get(name)
        assert (g.tflops_peak, g.tflops_fp8, g.bw_peak_tbs, g.mfu_prefill, g.mfu_decode, g.memory_gib) == want


def test_h100_pcie_is_listed_with_its_product_brief_figures():
    cat = builtin_gpus()
    g = cat.get("h100 pcie")                                        # alias, any case
    assert g.name == "H100-PCIe"
    assert (g.tflops_peak, g.tflops_fp8, g.bw_peak_tbs, g.memory_gib) == (756.5, 1513.0, 2.0, 80.0)


# ------------------------------------------------------------------ BLIS hardware_config.json
def _json(tmp_path, doc) -> str:
    p = tmp_path / "hw.json"
    p.write_text(json.dumps(doc))
    return str(p)


BLIS_FIGS = {"TFlopsPeak": 100.0, "TFlopsFP8": 0, "BwPeakTBs": 1.0, "mfuPrefill": 0.5, "mfuDecode": 0.25,
             "MemoryGiB": 32.0}


def test_a_blis_file_without_the_new_keys_loads_with_the_defaults():
    g = gpu_catalog(str(DATA / "hardware_config.json")).get("TEST-GPU")
    d = GPUSpec(name="x", tflops_peak=0, tflops_fp8=0, bw_peak_tbs=0, mfu_prefill=0, mfu_decode=0, memory_gib=0)
    assert (g.memory_torch_gib, g.interconnect, g.interconnect_gen, g.link_bw_gbps, g.p2p,
            g.collective_latency_us) == (d.memory_torch_gib, d.interconnect, d.interconnect_gen,
                                         d.link_bw_gbps, d.p2p, d.collective_latency_us)
    assert g.memory_torch_gib == 0.0 and g.interconnect == "pcie"


def test_a_blis_file_replacing_a_catalog_gpu_keeps_its_interconnect(tmp_path):
    same = dict(BLIS_FIGS, MemoryGiB=80.0)
    g = gpu_catalog(_json(tmp_path, {"H100": same})).get("H100")
    assert g.tflops_peak == 100.0                                              # the file wins ...
    assert (g.interconnect, g.link_bw_gbps, g.p2p, g.memory_torch_gib) == ("nvlink", 450.0, True, 79.19)
    g = gpu_catalog(_json(tmp_path, {"H100": BLIS_FIGS})).get("H100")         # 32 GiB, not 80
    assert g.memory_torch_gib == 0.0 and g.interconnect == "nvlink"           # driver figure unknown


def test_a_blis_file_may_carry_the_new_keys(tmp_path):
    extra = {"memory_torch_gib": 30.5, "interconnect": "nvlink", "interconnect_gen": 4,
             "link_bw_gbps": 450, "p2p": True, "collective_latency_us": 5}
    g = read_hardware_json(_json(tmp_path, {"X": {**BLIS_FIGS, **extra}}))["X"].spec
    assert (g.memory_torch_gib, g.interconnect, g.interconnect_gen, g.link_bw_gbps, g.p2p,
            g.collective_latency_us) == (30.5, "nvlink", 4, 450.0, True, 5.0)
    g = gpu_catalog(_json(tmp_path, {"H100": {**BLIS_FIGS, "p2p": False}})).get("H100")
    assert g.p2p is False and g.interconnect == "nvlink"                      # given beats inherited


@pytest.mark.parametrize("extra, words", [
    ({"interconnect": "infiniband"}, "interconnect must be one of nvlink, pcie"),
    ({"interconnect": "NVLink"}, "interconnect must be one of nvlink, pcie"),
    ({"p2p": "yes"}, "p2p must be true or false"),
    ({"interconnect_gen": 4.5}, "interconnect_gen must be an integer >= 0"),
    ({"interconnect_gen": -1}, "interconnect_gen must be an integer >= 0"),
    ({"link_bw_gbps": -1}, "link_bw_gbps must be a finite number >= 0"),
    ({"collective_latency_us": float("inf")}, "collective_latency_us must be a finite number >= 0"),
    ({"memory_torch_gib": float("nan")}, "memory_torch_gib must be a finite number >= 0"),
    ({"memory_torch_gib": True}, "memory_torch_gib must be a finite number >= 0"),
])
def test_bad_new_keys_in_a_blis_file(tmp_path, extra, words):
    with pytest.raises(ConfigError) as e:
        read_hardware_json(_json(tmp_path, {"X": {**BLIS_FIGS, **extra}}))
    assert words in str(e.value) and "'X'" in str(e.value)


# ------------------------------------------------------------------ scenario gpus:
GPU_YAML = """gpus:
  LAB:
    tflops_peak: 100
    bw_peak_tbs: 1.5
    mfu_prefill: 0.5
    mfu_decode: 0.2
    memory_gib: 48
"""


def test_scenario_gpus_accept_the_new_keys(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(GPU_YAML + "    memory_torch_gib: 44.39\n    interconnect: nvlink\n    interconnect_gen: 4\n"
                 "    link_bw_gbps: 450\n    p2p: true\n    collective_latency_us: 12.5\n"
                 "  H100:\n    tflops_peak: 1\n    bw_peak_tbs: 1\n    mfu_prefill: 0.5\n    mfu_decode: 0.5\n"
                 "    memory_gib: 80\n")
    s = load_scenario(str(p))
    cat = gpu_catalog("", s.gpus)
    g = cat.get("LAB")
    assert (g.memory_torch_gib, g.interconnect, g.interconnect_gen, g.link_bw_gbps, g.p2p,
            g.collective_latency_us) == (44.39, "nvlink", 4, 450.0, True, 12.5)
    h = cat.get("H100")                                   # replaces the built-in: keeps its link
    assert h.tflops_peak == 1.0 and (h.interconnect, h.memory_torch_gib) == ("nvlink", 79.19)


def test_scenario_gpu_without_the_new_keys_takes_the_defaults(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(GPU_YAML)
    g = gpu_catalog("", load_scenario(str(p)).gpus).get("LAB")
    assert (g.memory_torch_gib, g.interconnect, g.p2p) == (0.0, "pcie", False)


@pytest.mark.parametrize("line, field, words", [
    ("    interconnect: infiniband\n", "gpus.LAB.interconnect", "must be one of nvlink, pcie, got 'infiniband'"),
    ("    link_bw_gbps: -1\n", "gpus.LAB.link_bw_gbps", "greater than or equal to 0"),
    ("    collective_latency_us: .inf\n", "gpus.LAB.collective_latency_us", "finite"),
    ("    memory_torch_gib: .nan\n", "gpus.LAB.memory_torch_gib", "finite"),
    ("    interconnect_gen: 4.5\n", "gpus.LAB.interconnect_gen", "integer"),
    ("    p2p: maybe\n", "gpus.LAB.p2p", "boolean"),
    ("    link_speed: 3\n", "gpus.LAB.link_speed", "unknown key"),
])
def test_scenario_gpus_reject_bad_new_keys_with_a_located_error(tmp_path, line, field, words):
    p = tmp_path / "s.yaml"
    p.write_text(GPU_YAML + line)
    with pytest.raises(ConfigError) as e:
        load_scenario(str(p))
    assert (e.value.file, e.value.line, e.value.field) == (str(p), 8, field), str(e.value)
    assert words in e.value.problem, e.value.problem
