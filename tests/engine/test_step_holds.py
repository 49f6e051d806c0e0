"""A step holds its instance until it ends, even when every request in it finishes
(docs/engine.md, "A step holds the engine"); ``engine.step_model: blis`` keeps BLIS's idle
instance, where an arrival during such a step starts a step that overlaps it.

All cases: blackbox alpha = (0, 0, 0), beta = (1000, 0, 0) — every step takes exactly
1000 µs —, one running request at a time, requests of 32 prompt tokens arriving 100 µs
apart. A request with one output token finishes in its prefill step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blis_simpy.run.simulation import Simulation
from tests.cli.support import trace_row, write_trace_files
from tests.engine.helpers import make_requests, scenario

IMPLS = ["reference", "fast"]
FIVE = [(100 * i, 32, 1) for i in range(5)]


def _ttfts(impl: str, step_model: str, async_scheduling: bool, specs=FIVE) -> list[int]:
    sc = scenario(alpha=(0, 0, 0), beta=(1000, 0, 0), implementation=impl, max_num_running_reqs=1,
                  async_scheduling=async_scheduling, step_model=step_model)
    ttft = Simulation(sc, make_requests(specs)).run().instances[0].ttft
    return [ttft[f"request_{i}"] for i in range(len(specs))]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_finished_step_holds_the_instance_until_it_ends(impl, async_scheduling):
    """r0's step is [0, 1000): r1 (queued at 100) waits for its end, then [1000, 2000) gives
    TTFT 1900; r2 [2000, 3000) 2800; r3 3700; r4 4600. Under async scheduling the step at
    1000 is chosen when it starts (the engine was waiting for input), so the same times."""
    assert _ttfts(impl, "vllm", async_scheduling) == [1000, 1900, 2800, 3700, 4600]


@pytest.mark.parametrize("impl", IMPLS)
def test_blis_parity_starts_overlapping_steps(impl):
    """BLIS: the instance is idle once r0 finished at its step's start, so r1's step starts at
    its arrival (100) while r0's still runs: every TTFT is one step, 1000 µs."""
    assert _ttfts(impl, "blis", False) == [1000] * 5


@pytest.mark.parametrize("impl", IMPLS)
def test_a_request_that_stays_is_unchanged(impl):
    """With an output of 2 tokens r0 stays running after its prefill step, so both models
    agree: r0 [0, 1000) prefill, [1000, 2000) its last token; r1 [2000, 3000): TTFT 2900."""
    specs = [(0, 32, 2), (100, 32, 2)]
    got = {m: _ttfts(impl, m, False, specs) for m in ("vllm", "blis")}
    assert got == {"vllm": [1000, 2900], "blis": [1000, 2900]}


def _pd_transfer_starts(tmp_path: Path, step_model: str) -> list[int]:
    """A PD run (1 prefill + 1 decode instance, every request split) of the five requests;
    the KV-transfer start of each, from the decision trace."""
    from typer.testing import CliRunner

    from blis_simpy.cli.app import app

    write_trace_files(tmp_path, [trace_row(i, 100 * i, 32, 3) for i in range(5)], name="five")
    sc = tmp_path / "pd.yaml"
    sc.write_text(
        "model: m\n"
        "latency: {model: blackbox, alpha_coeffs: [0, 0, 0], beta_coeffs: [1000, 0, 0]}\n"
        f"engine: {{total_kv_blocks: 100, max_num_running_reqs: 1, step_model: {step_model}}}\n"
        "cluster: {num_instances: 2}\n"
        "disaggregation:\n  prefill_instances: 1\n  decode_instances: 1\n"
        "  decider: {policy: always}\n"
        "  transfer: {bandwidth_gbps: 1.0, base_latency_ms: 0, kv_bytes_per_token: 1000}\n"
        "horizon_us: 10000000\nworkload: {kind: trace, header: five.yaml, data: five.csv}\n")
    dec = tmp_path / f"dec-{step_model}.jsonl"
    res = CliRunner().invoke(app, ["run", "--scenario", str(sc), "--format", "json",
                                   "--trace-output-decisions", str(dec)])
    assert res.exit_code == 0, res.stderr
    rows = [json.loads(line) for line in dec.read_text().splitlines()]
    return [r["transfer_start_time_us"] for r in rows if r["kind"] == "kv_transfer"]


def test_a_prefill_instance_serves_one_step_at_a_time(tmp_path):
    """The prefill pool's sub-requests finish in their only step, so under BLIS parity the
    prefill instance took every arrival at once (transfers at 1000, 1100, ...: five 1000 µs
    prefills overlapping on one GPU). A step holding the instance serialises them."""
    assert _pd_transfer_starts(tmp_path, "vllm") == [1000, 2000, 3000, 4000, 5000]
    assert _pd_transfer_starts(tmp_path, "blis") == [1000, 1100, 1200, 1300, 1400]
