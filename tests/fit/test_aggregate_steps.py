"""Step observations from an inference-perf results folder: the hand-made one of
tests/workload/iperf_support.py, every figure worked out by hand."""

from __future__ import annotations

import json

import pytest

from blis_simpy.fit.aggregate_steps import MAX_FAILED_SHARE, stage_steps
from blis_simpy.measured.inference_perf import load_inference_perf
from tests.workload.iperf_support import STAGE1, lifecycle, write_run


def test_each_stage_gives_its_mean_decode_step(tmp_path):
    run = load_inference_perf(write_run(tmp_path))
    assert run.decoded_output_len == 3                  # ignore_eos: 3 tokens, 2 decode steps each
    obs = stage_steps(run, 128, deployment="dep")
    # stage 0: (E2E 4 ms - TTFT 2 ms) / 2 steps = 1000 µs; stage 1: (6 - 2) / 2 = 2000 µs
    assert [o.step_us for o in obs] == pytest.approx([1000.0, 2000.0])
    # Little's law: 4 successes over 2 s + one E2E x 2 ms decoding = 0.004 requests: at least 1
    assert [o.batch for o in obs] == [1.0, 1.0]
    # context: the measured mean prompt (32 tokens) + half the decoded output
    assert [o.context for o in obs] == [32 + 1.5, 32 + 1.5]
    assert [o.deployment for o in obs] == ["dep", "dep"]
    assert [o.label for o in obs] == ["run-a stage 0", "run-a stage 1"]


def test_batch_by_littles_law_is_capped_at_max_num_seqs(tmp_path):
    run = load_inference_perf(write_run(tmp_path))
    st = run.real_stages[0]
    # 4000 successes in the same 2 s window: 4000 / 2.004 s x 2 ms = 3.99 requests decoding
    run.real_stages[0] = type(st)(4000, 0, st.latency_ms, st.prompt_len_mean, st.output_len_mean,
                                  st.max_latency_ms)
    assert stage_steps(run, 128)[0].batch == pytest.approx(4000 / 2.004 * 0.002)
    assert stage_steps(run, 2)[0].batch == 2.0


def test_a_stage_whose_clients_timed_out_gives_none(tmp_path):
    folder = write_run(tmp_path)
    # stage 1: 2 successes and 1 failure (33 % > 1 %): left out
    (folder / "results" / "stage_1_lifecycle_metrics.json").write_text(
        json.dumps(lifecycle(2, 1, **STAGE1, fail_max=300.0)))
    assert MAX_FAILED_SHARE == 0.01
    obs = stage_steps(load_inference_perf(folder), 128)
    assert [o.label for o in obs] == ["run-a stage 0"]


def test_a_stage_whose_requests_waited_longer_than_they_decoded_gives_none(tmp_path):
    folder = write_run(tmp_path)
    # stage 1: TTFT 5 ms against E2E 6 ms: 5 ms waiting, 1 ms decoding -> overloaded, left out
    stage1 = dict(STAGE1, ttft=(0.005, 0.005, 0.005, 0.005, 0.005))
    (folder / "results" / "stage_1_lifecycle_metrics.json").write_text(json.dumps(lifecycle(2, 0, **stage1)))
    obs = stage_steps(load_inference_perf(folder), 128)
    assert [o.label for o in obs] == ["run-a stage 0"]
    # at exactly half (TTFT 3 ms = E2E 6 - 3) it is kept
    stage1 = dict(STAGE1, ttft=(0.003, 0.003, 0.003, 0.003, 0.003))
    (folder / "results" / "stage_1_lifecycle_metrics.json").write_text(json.dumps(lifecycle(2, 0, **stage1)))
    assert len(stage_steps(load_inference_perf(folder), 128)) == 2
