"""Counters whose definition the metrics audit sharpened (docs/metrics.md, docs/engine.md),
pinned on tiny runs whose every figure is worked out by hand.

Timing: blackbox alpha = (0, 0, 0), beta = (1000, 0, 0) — every step takes 1000 µs, no
queueing delay, no per-token overhead. Two requests arrive at 0 with 16-token prompts:
``request_0`` wants 3 output tokens, ``request_1`` 100. The step at 0 prefills both (TTFT
1000 µs each); every later step decodes one token of each running request.
"""

from __future__ import annotations

import json

import pytest

from .support import trace_row, write_trace_files

TIMING = ("--model", "meta-llama/llama-3.1-8b-instruct", "--alpha-coeffs", "0,0,0",
          "--beta-coeffs", "1000,0,0")
#: request_1 as trace_row makes it, with a deadline of 4500 µs
R1_DEADLINE_4500 = "1,c,,,,0,,0,false,16,100,0,0,0,0,0,,4500,0,0,0,0,0,0,ok,,"


def _replay(cli, tmp_path, rows, *extra):
    h, d = write_trace_files(tmp_path, rows)
    out = tmp_path / "rows.jsonl"
    res = cli("replay", "--trace-header", h, "--trace-data", d, *TIMING, *extra,
              "--format", "json", "--requests-out", out)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout), [json.loads(x) for x in out.read_text().splitlines()]


@pytest.mark.parametrize(("extra", "r1", "decoded_by_r1", "timed_out", "still_running"), [
    # horizon 5500: request_1 decodes in the steps at 1000, 2000, 3000, 4000 and 5000
    (("--horizon", "5500"), trace_row(1, 0, 16, 100), 5, 0, 1),
    # deadline 4500: it decodes at 1000..4000, then times out
    ((), R1_DEADLINE_4500, 4, 1, 0),
])
def test_output_tokens_count_every_decode_step_itl_only_completed_requests(
        cli, tmp_path, extra, r1, decoded_by_r1, timed_out, still_running):
    doc, rows = _replay(cli, tmp_path, [trace_row(0, 0, 16, 3), r1], *extra)
    c = doc["cluster"]
    # request_0 decodes at 1000 and 2000 and completes: E2E 1000 + 2 x 1000 = 3000 µs
    assert (c["completed_requests"], c["timed_out_requests"], c["still_running"]) == (
        1, timed_out, still_running)
    assert c["e2e_count"] == 1 and c["e2e_mean_ms"] == 3
    # total_output_tokens: request_0's L - 1 = 2, plus what the unfinished request decoded
    assert c["total_output_tokens"] == 2 + decoded_by_r1
    # the last event is the step at 5000 µs (the stale one after the timeout, too)
    assert c["vllm_estimated_duration_s"] == 0.005
    assert c["tokens_per_sec"] == (2 + decoded_by_r1) / 0.005
    # the ITL histogram holds request_0's two 1000 µs samples only
    assert (c["itl_count"], c["itl_mean_ms"], c["itl_p99_ms"]) == (2, 1, 1)
    # TTFT and scheduling delay count both requests
    assert (c["ttft_count"], c["ttft_mean_ms"], c["scheduling_delay_count"]) == (2, 1, 2)
    assert [(r["requestID"], r["e2e_ms"], r["itl_ms"]) for r in rows] == [
        ("request_0", 3, 1), ("request_1", None, None)]


def test_pd_rows_only_for_completed_disaggregated_requests(cli, tmp_path):
    # 1 prefill + 1 decode instance, every request disaggregated, horizon 20 ms. Both prefills
    # end at 1000 µs; the two 16-token KV transfers (131,072 B/token for Llama-3.1-8B: 2 MiB
    # each) share 25 GB/s: ceil(50 + 2,097,152 / 12,500) = 218 µs. request_0's decode starts
    # at 1218 and runs its 2 steps: TTFT 1218 + 1000, E2E 1218 + 2000. request_1 is still
    # decoding at the horizon: it counts as running but has no row.
    doc, rows = _replay(cli, tmp_path, [trace_row(0, 0, 16, 3), trace_row(1, 0, 16, 100)],
                        "--horizon", "20000", "--num-instances", "2", "--prefill-instances", "1",
                        "--decode-instances", "1", "--pd-decider", "always")
    c = doc["cluster"]
    assert (c["completed_requests"], c["still_running"], c["injected_requests"]) == (1, 1, 2)
    assert rows == [{"arrived_at": 0, "requestID": "request_0", "num_prefill_tokens": 16,
                     "num_decode_tokens": 3, "ttft_ms": 2.218, "itl_ms": 1, "e2e_ms": 3.218,
                     "scheduling_delay_ms": 0, "handled_by": "instance_1"}]
    pd = doc["pd"]
    assert pd["disaggregated_count"] == 2
    assert (pd["transfer_duration"]["count"], pd["transfer_duration"]["mean_ms"]) == (2, 0.218)
    assert (pd["parent_ttft"]["count"], pd["parent_ttft"]["p50_ms"]) == (1, 2.218)
