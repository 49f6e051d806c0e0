"""``blis-simpy catalog`` and the offline catalog path of ``blis-simpy run``."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.models import builtin_models

DATA = Path(__file__).resolve().parents[1] / "catalog" / "data"
ISSUE_MODELS = ("qwen/qwen3-14b", "qwen/qwen3-32b", "qwen/qwen3-30b-a3b", "mistralai/mixtral-8x7b-v0.1",
                "meta-llama/llama-3.1-70b", "deepseek-ai/deepseek-v3")
ISSUE_GPUS = ("H100", "A100-SXM", "A100-80", "L40S", "H200", "B200", "RTX-4090", "RTX-PRO-6000")


def _ok(res):
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr)
    return res


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network and an empty working directory: everything must come from the package."""
    def refuse(*a, **k):
        raise AssertionError("network access attempted")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.chdir(tmp_path)


def test_catalog_json_lists_every_model_and_gpu(cli, offline):
    doc = json.loads(_ok(cli("catalog", "--format", "json")).stdout)
    assert set(doc) == {"gpus", "models", "coefficients"}
    assert set(ISSUE_GPUS) <= set(doc["gpus"]) and set(doc["gpus"]) == set(builtin_gpus().names())
    assert set(ISSUE_MODELS) <= set(doc["models"]) and set(doc["models"]) == set(builtin_models().names())
    assert doc["gpus"]["H200"]["source"] and doc["gpus"]["B200"]["tflops_fp8"] == 4500.0
    q = doc["models"]["qwen/qwen3-14b"]
    assert q["num_layers"] == 40 and q["derived_max_model_len"] == 40960
    assert q["defaults"] == {"gpu": "H100", "tp": 1, "vllm": "v0.11.0"}
    assert len(doc["coefficients"]["blackbox"]) == 87
    assert doc["coefficients"]["crossmodel"]["beta"] == [116.11, 1226.868, 19.943, 9445.157]


def test_catalog_tables_list_every_model_and_gpu(cli, offline):
    out = _ok(cli("catalog")).stdout
    for name in builtin_gpus().names() + builtin_models().names():
        assert name in out, name
    assert "Blackbox coefficients (87 rows" in out and "trained-roofline" in out
    gpus_only = _ok(cli("catalog", "gpus")).stdout
    assert "H200" in gpus_only and "qwen/qwen3-14b" not in gpus_only and "Sources:" in gpus_only


def test_catalog_coefficients_of_one_model(cli):
    doc = json.loads(_ok(cli("catalog", "coefficients", "--model", "Qwen/Qwen3-14B", "--format", "json")).stdout)
    rows = doc["coefficients"]["blackbox"]
    assert [(r["gpu"], r["tp"], r["vllm"], r["kv_blocks"]) for r in rows] == [("H100", 1, "v0.11.0", 17600)]


def test_catalog_with_user_files(cli):
    res = _ok(cli("catalog", "--format", "json", "--hardware-config", DATA / "hardware_config.json",
                  "--defaults-filepath", DATA / "blis_defaults.yaml"))
    doc = json.loads(res.stdout)
    assert doc["gpus"]["TEST-GPU"]["memory_gib"] == 32.0
    assert any(r["model"] == "test/tiny-model" for r in doc["coefficients"]["blackbox"])


def test_run_qwen3_14b_on_h100_offline_with_no_files(cli, offline):
    res = _ok(cli("run", "--model", "qwen/qwen3-14b", "--hardware", "H100", "--num-requests", "20",
                  "--format", "json", "--log", "info"))
    doc = json.loads(res.stdout)
    cluster = doc["cluster"] if "cluster" in doc else doc
    assert json.dumps(cluster).count('"completed_requests": 20') >= 1
    err = res.stderr
    assert "tp 1: the smallest TP whose weights" in err                      # TP: the one rule
    assert "total_kv_blocks 17600: catalog row" in err                       # KV from the catalog row
    assert "model config: built-in catalog" in err
    assert list(Path.cwd().iterdir()) == []                                  # nothing written or cached


def test_run_resolves_physics_by_default(cli, offline):
    """Flag-only runs without coefficients use the physics backend (BLIS 89bece82: roofline)."""
    res = _ok(cli("run", "--model", "qwen/qwen3-14b", "--num-requests", "3", "--log", "info"))
    assert "physics" in res.stdout and "hardware H100: default" in res.stderr


@pytest.mark.parametrize("args, flag, words", [
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization", "must be in (0, 1]"),
    (["--kv-offload-threshold", "2"], "--kv-offload-threshold", "must be in [0, 1]"),
    (["--kv-cpu-blocks", "-1"], "--kv-cpu-blocks", "must be >= 0"),
    (["--kv-transfer-bandwidth", "0"], "--kv-transfer-bandwidth", "must be > 0"),
    (["--latency-compat", "bogus"], "--latency-compat", "must be one of fixed, checkout"),
    (["--hardware", "H300"], "--hardware", "unknown GPU 'H300'"),
    (["--hardware-config", "nope.json"], "--hardware-config", "no such file"),
    (["--model", "acme/x"], "--model", "unknown model acme/x"),     # before "needs a GPU": the root cause
    (["--latency-model", "blackbox", "--tp", "8"], "--latency-model", "No trained coefficients found"),
])
def test_bad_catalog_flags_are_one_line_errors(cli, args, flag, words):
    base = {"--model": "qwen/qwen3-14b", "--num-requests": "3"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    res = cli("run", *[x for kv in base.items() for x in kv])
    assert res.exit_code != 0
    line = res.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert words in line, line
    assert line.startswith(f"error: {flag}: "), line


def test_gpu_memory_utilization_changes_auto_kv(cli, offline):
    def blocks(*extra):
        res = _ok(cli("run", "--model", "qwen/qwen3-14b", "--hardware", "A100-SXM", "--num-requests", "1",
                      "--log", "info", *extra))
        return int(res.stderr.split("total_kv_blocks ")[1].split(":")[0])
    assert blocks("--kv-capacity-model", "blis") == 15_909            # BLIS's formula (B18b)
    assert blocks("--kv-capacity-model", "blis", "--gpu-memory-utilization", "0.8") < 15_909
    assert blocks() == 17_376                                         # vLLM's rule, the default
    assert blocks("--gpu-memory-utilization", "0.8") < 17_376


def test_catalog_gpus_show_the_interconnect_and_driver_memory(cli, offline, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")       # every column on one line per GPU
    out = _ok(cli("catalog", "gpus")).stdout
    assert "interconnect" in out and "driver GiB" in out
    for label in ("NVLink4 450 GB/s P2P", "NVLink5 900 GB/s P2P", "PCIe4 31.5 GB/s no P2P", "PCIe5 63 GB/s P2P"):
        assert label in out, label
    rtx = next(line for line in out.splitlines() if "RTX-4090" in line and "GeForce" in line)
    assert "23.52" in rtx and "PCIe4 31.5 GB/s no P2P" in rtx
    doc = json.loads(_ok(cli("catalog", "gpus", "--format", "json")).stdout)["gpus"]
    g = doc["RTX-4090"]
    assert g["memory_torch_gib"] * 2**30 == 25_250_627_584
    assert (g["interconnect"], g["interconnect_gen"], g["link_bw_gbps"], g["p2p"]) == ("pcie", 4, 31.5, False)
    assert g["interconnect_label"] == "PCIe4 31.5 GB/s no P2P"
    assert doc["H100"]["interconnect_label"] == "NVLink4 450 GB/s P2P"


def test_catalog_models_show_head_dim(cli, offline, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")       # every column on one line per model
    out = _ok(cli("catalog", "models")).stdout
    assert "head dim" in out
    q = next(line for line in out.splitlines() if "qwen/qwen3-32b" in line)
    assert "128" in q and "(d/H)" not in q
    llama = next(line for line in out.splitlines() if "meta-llama/llama-3.1-8b " in line)
    assert "128 (d/H)" in llama
    doc = json.loads(_ok(cli("catalog", "models", "--format", "json")).stdout)["models"]
    assert (doc["qwen/qwen3-32b"]["head_dim"], doc["qwen/qwen3-32b"]["real_head_dim"]) == (128, 128)
    assert (doc["meta-llama/llama-3.1-8b"]["head_dim"], doc["meta-llama/llama-3.1-8b"]["real_head_dim"]) == (0, 128)
    mav = doc["meta-llama/llama-4-maverick-17b-128e-instruct-fp8"]
    assert (mav["interleave_moe_layer_step"], mav["dense_intermediate_size"], mav["num_moe_layers"]) == (2, 16384, 24)
    assert doc["deepseek-ai/deepseek-v3"]["kv_lora_rank"] == 512


def test_catalog_model_filter_applies_to_the_models_too(cli, offline):
    doc = json.loads(_ok(cli("catalog", "--model", "Qwen/Qwen3-14B", "--format", "json")).stdout)
    assert list(doc["models"]) == ["qwen/qwen3-14b"]
    assert {r["model"] for r in doc["coefficients"]["blackbox"]} == {"qwen/qwen3-14b"}
    assert len(doc["gpus"]) == len(builtin_gpus().entries)       # every built-in GPU holds it
    out = _ok(cli("catalog", "models", "--model", "qwen/qwen3-14b")).stdout
    assert "Models (1 of " in out and "qwen/qwen3-32b" not in out


def test_catalog_unknown_model_says_so(cli, offline):
    out = _ok(cli("catalog", "models", "--model", "nope/x")).stdout
    assert out.startswith("nope/x is not in the model catalog (")
    assert "Models (" not in out                                    # no empty table


def test_catalog_coefficients_without_rows_name_where_they_are(cli):
    from blis_simpy.catalog.coefficients import builtin_coefficients
    cat = builtin_coefficients()
    assert "meta-llama/llama-3.1-70b" not in cat.blackbox            # the case: a catalog model, no rows
    out = _ok(cli("catalog", "coefficients", "--model", "meta-llama/llama-3.1-70b")).stdout
    lines = out.splitlines()
    assert lines[0] == "No blackbox coefficients for meta-llama/llama-3.1-70b. Models and GPUs that have them:"
    listed = [ln.strip() for ln in lines[1:1 + len(cat.blackbox)]]
    assert "qwen/qwen3-14b: H100" in listed
    assert "meta-llama/llama-3.1-8b-instruct: A100-80, H100" in listed
    assert {ln.split(":")[0] for ln in listed} == set(cat.blackbox)
    assert "Blackbox coefficients (0 rows" not in out


def test_catalog_model_filter_keeps_the_gpus_that_hold_it(cli, offline, tmp_path):
    """Qwen3-14B's weights are 27.5 GiB: an RTX 4090 (23.52 GiB x 0.9) needs TP 2; a made-up
    1 GiB GPU cannot hold it at any TP that divides its 40 heads (8 at most: 3.4 GiB a GPU)."""
    from blis_simpy.kv.vllm_capacity import vllm_kv_capacity
    hw = tmp_path / "hw.json"
    tiny = {"TFlopsPeak": 10.0, "TFlopsFP8": 0, "BwPeakTBs": 0.5, "mfuPrefill": 0.5, "mfuDecode": 0.25}
    hw.write_text(json.dumps({"TINY-GPU": {**tiny, "MemoryGiB": 1.0}, "Z-GPU": {**tiny, "MemoryGiB": 0}}))
    args = ("catalog", "gpus", "--model", "qwen/qwen3-14b", "--hardware-config", hw)
    doc = json.loads(_ok(cli(*args, "--format", "json")).stdout)["gpus"]
    assert set(doc) == set(builtin_gpus().names())                # TINY-GPU, Z-GPU left out
    assert doc["RTX-4090"]["min_tp"] == 2 and doc["H100"]["min_tp"] == 1
    q14 = builtin_models().find("qwen/qwen3-14b").config
    for key in ("H100", "RTX-4090"):
        cap = vllm_kv_capacity(q14, builtin_gpus().get(key), tp=doc[key]["min_tp"])
        assert doc[key]["kv_tokens_per_gpu"] == cap.tokens > 0
    out = _ok(cli(*args)).stdout
    assert f"GPUs that hold qwen/qwen3-14b ({len(doc)} of {len(doc) + 2};" in out
    assert "Too small for qwen/qwen3-14b at any TP up to 64: TINY-GPU\n" in out
    # a GPU that cannot be sized at all is not called too small: the reason is given
    assert "Cannot size qwen/qwen3-14b on Z-GPU: GPU Z-GPU memory must be > 0 GiB" in out
    assert "TINY-GPU:" not in out                                 # nor among the sources


@pytest.mark.parametrize("args, flag", [
    (["--model", "qwen/qwen3-14b", "--tp=-1"], "--tp"),
    (["gpus", "--hardware", "H100"], "--hardware"),
    (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization"),
    (["models", "--enable-expert-parallel"], "--enable-expert-parallel"),
    (["--dp", "1"], "--dp"),             # given, even at its default value
])
def test_capacity_options_are_refused_by_the_listing(cli, offline, args, flag):
    # they would be ignored without a word: the listing reads none of them
    res = cli("catalog", *args)
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {flag}: is read only by `catalog capacity` (or --capacity)"


def test_capacity_options_still_serve_capacity(cli, offline):
    res = _ok(cli("catalog", "--capacity", "--model", "meta-llama/llama-3.1-8b-instruct",
                  "--hardware", "H100", "--tp", "1", "--dp", "1"))
    assert "KV capacity: 28,242 blocks" in res.stdout
