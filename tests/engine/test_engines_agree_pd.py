"""The fast engine equals the reference engine on prefill/decode pools, where a decode pool's
MaxModelLen can be shorter than a prompt (its decode sub-requests skip the enqueue guards).

Found by differential fuzzing of whole runs: a queued decode sub-request whose pre-allocated
prompt KV is released to unblock the queue restarts as a prefill; its chunks stop at
position M − 1 (docs/engine.md, "MaxModelLen"), short of its prompt. The reference engine
completes it there, length-capped (docs/engine.md, "Progress and completion": every request
at ``pi ≥ M − 1``); the fast engine only looked at prefills that reached their prompt's end,
so the request stayed in the batch with 0-token chunks and the instance stepped forever.
"""

from __future__ import annotations

import pytest

from tests.disagg.test_pd_paths import pd_scenario, req, run
from tests.engine.test_fast_vs_reference import FIELDS, _snapshot


def _capped_mid_prompt(impl):
    # 1P1D, block size 16, decode pool: 8 blocks, MaxModelLen 40; step = 5000 + 10/prefill
    # token + 100/decode token µs. "a" and "b" (64-token prompts: 4 blocks each, 10 outputs)
    # are prefilled together and both land on the decode instance at 7332 holding all 8
    # blocks. "a" needs a 5th block for its decode slot: "b"'s KV is released (1 preemption)
    # and "b" restarts with one token. Step 1 (7332, 5110 µs): "a" decodes to pi 65 >= 39 and
    # completes length-capped; "b" is at pi 1. Step 2 (12442): "b" gets 38 tokens (the chunk
    # stops at M - 1 = 39), 5380 µs: at pi 39 it completes length-capped, at 17822.
    sc = pd_scenario(impl=impl, decode_pool={"total_kv_blocks": 8, "max_model_len": 40})
    sim, res = run(sc, [req("a", 0, 64, 10), req("b", 0, 64, 10, base=1000)], horizon=1_000_000)
    return sim, res


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_decode_subrequest_capped_mid_prompt_completes(impl):
    sim, res = _capped_mid_prompt(impl)
    dec = res.instances[1]
    assert (dec.completed_requests, dec.length_capped_requests, dec.preemption_count) == (2, 2, 1)
    assert (dec.still_running, dec.still_queued) == (0, 0)
    assert sim.instances[1].step_count == 2 and dec.sim_ended_time == 17822
    b = dec.registry["b_decode"]
    assert (b.pi, b.prefill_to, b.length_capped, b.finished_step) == (39, 64, True, 2)
    assert dict(dec.all_itls) == {5110: 1}
    assert res.cluster.completed_requests == 2


def test_decode_subrequest_capped_mid_prompt_engines_agree():
    snaps = [_snapshot(_capped_mid_prompt(impl)[1].instances[1]) for impl in ("reference", "fast")]
    for f in (*FIELDS, "unfinished", "first_itl"):
        assert snaps[1][f] == snaps[0][f], f
