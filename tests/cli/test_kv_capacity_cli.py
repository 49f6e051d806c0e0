"""KV capacity on the command line: ``catalog capacity``, the run header, ``total_kv_blocks`` in
JSON, and the one-line error of a model that does not fit."""

from __future__ import annotations

import json

import pytest

HEADER = ("KV capacity: 2,588 blocks (vllm: total 23.52 GiB x 0.9 − weights 14.99 − activation 0.94 − "
          "non-torch 0.18 = 5.06 GiB)")
LLAMA_4090 = ("--model", "meta-llama/llama-3.1-8b", "--hardware", "RTX-4090")
RUN = ("run", *LLAMA_4090, "--tp", "1", "--latency-model", "roofline", "--num-requests", "4")


def _ok(res):
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr)
    return res


def _one_line_error(res) -> str:
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


@pytest.mark.parametrize("spelling", [("catalog", "capacity"), ("catalog", "--capacity")])
def test_catalog_capacity_prints_the_pieces(cli, spelling):
    out = _ok(cli(*spelling, *LLAMA_4090)).stdout
    for row in ("total memory per GPU (driver)", "25,250,627,584", "22,725,564,826", "16,094,076,928",
                "lm_head", "rope cache", "sampler over 256 rows (peak)", "197,132,288", "5,428,378,010",
                "2,097,152", "2,588", "41,408"):
        assert row in out, row
    assert out.rstrip().endswith(HEADER)


def test_catalog_capacity_json_and_options(cli):
    doc = json.loads(_ok(cli("catalog", "capacity", *LLAMA_4090, "--format", "json")).stdout)
    cap = doc["kv_capacity"]
    assert doc["model"] == "meta-llama/llama-3.1-8b" and cap["blocks"] == 2588 and cap["tokens"] == 41_408
    assert cap["available_bytes"] == (cap["requested_bytes"] - cap["weights_bytes"] - cap["activation_bytes"]
                                      - cap["non_torch_bytes"])
    assert sum(cap["weights"].values()) == cap["weights_bytes"]
    tp2 = json.loads(_ok(cli("catalog", "capacity", *LLAMA_4090, "--tp", "2", "--format", "json")).stdout)
    assert tp2["kv_capacity"]["blocks"] == 12_834 and tp2["kv_capacity"]["block_bytes"] == 2**20
    seqs = json.loads(_ok(cli("catalog", "--capacity", *LLAMA_4090, "--max-num-seqs", "128",
                              "--format", "json")).stdout)
    assert seqs["kv_capacity"]["max_num_seqs"] == 128 and seqs["kv_capacity"]["blocks"] > 2588
    blis = json.loads(_ok(cli("catalog", "capacity", "--model", "qwen/qwen3-14b", "--hardware", "A100-SXM",
                              "--kv-capacity-model", "blis", "--format", "json")).stdout)
    assert blis["kv_capacity"]["blocks"] == 15_909 and blis["kv_capacity"]["capacity_model"] == "blis"
    moe = _ok(cli("catalog", "capacity", "--model", "qwen/qwen3-30b-a3b", "--hardware", "H100", "--tp", "2",
                  "--dp", "2", "--enable-expert-parallel")).stdout
    assert "routed experts" in moe and "KV blocks per DP rank" in moe and "(2 DP ranks)" in moe


def test_catalog_capacity_errors_are_one_line(cli):
    line = _one_line_error(cli("catalog", "capacity", "--model", "meta-llama/llama-3.1-70b",
                               "--hardware", "RTX-4090"))
    assert "short by 111.42 GiB" in line and "TP 8 (8 GPUs) would fit" in line
    assert _one_line_error(cli("catalog", "capacity", *LLAMA_4090, "--tp", "3")).startswith(
        "error: --hardware: KV capacity: num_attention_heads 32 is not divisible by TP 3")
    assert "--hardware" in _one_line_error(cli("catalog", "capacity", "--model", "meta-llama/llama-3.1-8b"))
    assert "--model" in _one_line_error(cli("catalog", "capacity", "--model", "acme/none", "--hardware", "H100"))
    assert "--kv-capacity-model" in _one_line_error(cli("catalog", "capacity", *LLAMA_4090,
                                                        "--kv-capacity-model", "lss"))


def test_run_header_shows_the_capacity_and_json_has_total_kv_blocks(cli):
    out = _ok(cli(*RUN)).stdout
    assert HEADER in out.splitlines()[1]
    doc = json.loads(_ok(cli(*RUN, "--format", "json")).stdout)
    assert doc["total_kv_blocks"] == 2588 and doc["kv_capacity"]["blocks"] == 2588
    given = json.loads(_ok(cli(*RUN, "--total-kv-blocks", "700", "--format", "json")).stdout)
    assert given["total_kv_blocks"] == 700 and given["kv_capacity"] is None
    assert "KV capacity: 700 blocks (given)" in _ok(cli(*RUN, "--total-kv-blocks", "700")).stdout
    # BLIS's formula: datasheet 24 GiB and a fixed 5.5 GiB reserve -> the 508 blocks of issue 8
    blis = _ok(cli(*RUN, "--kv-capacity-model", "blis")).stdout.splitlines()[1]
    assert blis == ("KV capacity: 508 blocks (blis: total 24.00 GiB x 0.9 − weights 14.96 − activation 5.50 "
                    "− non-torch 0.15 = 0.99 GiB)")


def test_json_lists_the_blocks_per_instance_where_pools_differ(cli):
    args = ("run", "--model", "qwen/qwen3-14b", "--hardware", "H100", "--tp", "1", "--latency-model", "roofline",
            "--num-instances", "3", "--prefill-instances", "1", "--decode-instances", "2",
            "--pd-decider", "always", "--decode-tp", "2", "--num-requests", "4")
    doc = json.loads(_ok(cli(*args, "--format", "json")).stdout)
    assert doc["total_kv_blocks"] == [17_600, 46_048, 46_048]
    header = _ok(cli(*args)).stdout.splitlines()[1]
    assert header.startswith("KV capacity: prefill 17,600 blocks (catalog row); decode 46,048 blocks (vllm: ")


def test_run_with_a_model_that_does_not_fit_exits_2_with_the_shortfall(cli):
    line = _one_line_error(cli("run", "--model", "meta-llama/llama-3.1-70b", "--hardware", "RTX-4090",
                               "--tp", "1", "--num-requests", "3"))
    assert line.startswith("error: --hardware: KV capacity: meta-llama/llama-3.1-70b does not fit on "
                           "RTX-4090 at TP 1: short by 111.42 GiB per GPU")
