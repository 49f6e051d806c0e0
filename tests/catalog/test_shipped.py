"""The shipped catalog files: their compiled JSON copies are current and load to exactly what
yaml.safe_load gives; a stale or broken copy is never used."""

from __future__ import annotations

import json
import shutil
from importlib import resources

import pytest
import yaml

from blis_simpy.catalog import shipped
from blis_simpy.catalog.shipped import SHIPPED, compiled_text, read_shipped, safe_loader


def _yaml_text(name: str) -> str:
    return resources.files("blis_simpy.catalog").joinpath(f"data/{name}").read_text("utf-8")


def test_the_fast_loader_is_libyaml_when_pyyaml_has_it():
    assert safe_loader() is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


@pytest.mark.parametrize("name", SHIPPED)
def test_each_compiled_copy_is_current(name):
    """Fails after an edit of the YAML until ``make catalog`` rewrites the copy."""
    on_disk = resources.files("blis_simpy.catalog").joinpath(
        f"data/compiled/{name.rsplit('.', 1)[0]}.json").read_text("utf-8")
    assert on_disk == compiled_text(name), f"run `make catalog`: compiled/{name} is out of date"


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_file_reads_as_safe_load_reads_it(name):
    expected = yaml.safe_load(_yaml_text(name))
    got = read_shipped(name)
    assert got == expected, name
    # same key order and the same Python types (1 stays int, 1.0 stays float)
    assert repr(got) == repr(expected), name


def _copy_of_data(tmp_path, monkeypatch):
    """A copy of catalog/data that read_shipped reads instead of the package's."""
    src = resources.files("blis_simpy.catalog").joinpath("data")
    dst = tmp_path / "data"
    shutil.copytree(str(src), dst)
    monkeypatch.setattr(shipped, "_data", lambda: dst)
    return dst


def test_a_stale_copy_is_not_used(tmp_path, monkeypatch):
    """The YAML changed after the copy was made: the YAML's values are read."""
    dst = _copy_of_data(tmp_path, monkeypatch)
    text = (dst / "gpus.yaml").read_text("utf-8")
    assert "tflops_peak: 989.5" in text
    (dst / "gpus.yaml").write_text(text.replace("tflops_peak: 989.5", "tflops_peak: 123.5", 1))
    assert read_shipped("gpus.yaml")["H100"]["tflops_peak"] == 123.5


def test_a_copy_with_the_right_hash_is_what_is_read(tmp_path, monkeypatch):
    """The copy, not the YAML, is read when its hash matches (a changed value in the copy
    shows), so the fast path is the one taken."""
    dst = _copy_of_data(tmp_path, monkeypatch)
    blob = json.loads((dst / "compiled/gpus.json").read_text("utf-8"))
    blob["data"]["H100"]["tflops_peak"] = 1.5
    (dst / "compiled/gpus.json").write_text(json.dumps(blob))
    assert read_shipped("gpus.yaml")["H100"]["tflops_peak"] == 1.5


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]", '{"yaml_sha256": 3}', "no data"])
def test_a_missing_or_broken_copy_falls_back_to_the_yaml(tmp_path, monkeypatch, content):
    dst = _copy_of_data(tmp_path, monkeypatch)
    target = dst / "compiled/models.json"
    if content == "no data":    # the right hash but no values
        blob = json.loads(target.read_text("utf-8"))
        del blob["data"]
        target.write_text(json.dumps(blob))
    elif content:
        target.write_text(content)
    else:
        target.unlink()
    assert read_shipped("models.yaml") == yaml.safe_load(_yaml_text("models.yaml"))


def test_values_json_would_change_are_refused(tmp_path, monkeypatch):
    """A YAML int key or date would come back from JSON as a string: compiling refuses it."""
    dst = _copy_of_data(tmp_path, monkeypatch)
    (dst / "gpus.yaml").write_text("H100:\n  tp:\n    1: 2\n")
    with pytest.raises(ValueError, match=r"gpus.yaml.H100.tp: key 1 is not a string"):
        compiled_text("gpus.yaml")
    (dst / "gpus.yaml").write_text("H100:\n  released: 2022-03-22\n")
    with pytest.raises(ValueError, match="date value"):
        compiled_text("gpus.yaml")


def test_hand_checked_values():
    """H100's row as catalog/data/gpus.yaml writes it: floats stay floats, ints stay ints."""
    h100 = read_shipped("gpus.yaml")["H100"]
    assert h100["tflops_peak"] == 989.5 and h100["memory_torch_gib"] == 79.19
    assert h100["interconnect_gen"] == 4 and type(h100["interconnect_gen"]) is int
    assert h100["interconnect"] == "nvlink" and h100["description"] == "NVIDIA H100 SXM5 80GB"
