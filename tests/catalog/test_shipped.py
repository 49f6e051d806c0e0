"""The shipped catalog files read with libyaml's loader give exactly what yaml.safe_load gives."""

from __future__ import annotations

from importlib import resources

import yaml

from blis_simpy.catalog.shipped import SAFE_LOADER, read_shipped

SHIPPED = ("gpus.yaml", "models.yaml", "coefficients.yaml")


def test_the_fast_loader_is_libyaml_when_pyyaml_has_it():
    assert SAFE_LOADER is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


def test_each_shipped_file_reads_as_safe_load_reads_it():
    for name in SHIPPED:
        text = resources.files("blis_simpy.catalog").joinpath(f"data/{name}").read_text("utf-8")
        expected = yaml.safe_load(text)
        got = read_shipped(name)
        assert got == expected, name
        # same key order and the same Python types (1 stays int, 1.0 stays float)
        assert repr(got) == repr(expected), name


def test_hand_checked_values():
    """H100's row as catalog/data/gpus.yaml writes it: floats stay floats, ints stay ints."""
    h100 = read_shipped("gpus.yaml")["H100"]
    assert h100["tflops_peak"] == 989.5 and h100["memory_torch_gib"] == 79.19
    assert h100["interconnect_gen"] == 4 and type(h100["interconnect_gen"]) is int
    assert h100["interconnect"] == "nvlink" and h100["description"] == "NVIDIA H100 SXM5 80GB"
