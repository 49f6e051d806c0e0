"""Reading an inference-perf results folder: the rebuilt workload (exact sends and token IDs),
the measured aggregates, the settings, and one located error per malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.measured.converted import load_run
from blis_simpy.measured.inference_perf import load_inference_perf, with_seed
from blis_simpy.measured.inference_perf.rebuild import client_deadline_us
from blis_simpy.measured.run import AggregateRun
from blis_simpy.rng import derive_seed, numpy_rng
from tests.workload.iperf_support import CONFIG, write_run

V = 128_000


def _draws(seed: int = 42):
    """The documented draw order, by hand: the group's system prompt, its two questions, the
    shuffle, then each stage's gaps."""
    rng = numpy_rng(derive_seed(seed, "inference-perf"))
    system = rng.integers(0, V, size=16, dtype=np.int32)
    q = [rng.integers(0, V, size=16, dtype=np.int32) for _ in range(2)]
    order = rng.permutation(2)
    g0 = rng.exponential(0.5, 4)
    g1 = rng.exponential(1.0, 2)
    prompts = [np.concatenate((system, q[i])) for i in order]
    return prompts, np.cumsum(g0 * (2.0 / g0.sum())), np.cumsum(g1 * (2.0 / g1.sum()))


def test_rebuild_sends_token_ids_stages_and_deadlines_exactly(tmp_path):
    run = load_inference_perf(write_run(tmp_path))
    prompts, off0, off1 = _draws()
    assert [s.count for s in run.stages] == [4, 2] and len(run.records) == 6
    # stage 0's timer starts at 0; its sends are the scaled cumulative gaps, the last exactly at 2 s
    sends0 = [round(t * 1e6) for t in off0]
    assert [r.send_time_us for r in run.records[:4]] == sends0 and sends0[-1] == 2_000_000
    # stage 1 starts after stage 0's last send + its longest measured latency (6 ms) + the pause
    # (interval 1 s + the 1 s queue fill of worker processes)
    start1 = 2_000_000 + 6_000 + 2_000_000
    assert (run.stages[1].start_us, run.stages[1].end_us) == (start1, start1 + 2_000_000)
    assert [r.send_time_us for r in run.records[4:]] == [start1 + round(t * 1e6) for t in off1]
    assert all(r.arrival_time_us == r.send_time_us for r in run.records)
    # request j of every stage sends prompt j mod 2 of the shuffled order
    for r, j in zip(run.records, [0, 1, 2, 3, 0, 1], strict=True):
        assert np.array_equal(r.input_token_ids, prompts[j % 2])
        assert (r.input_tokens, r.output_tokens, r.client_id) == (32, 3, f"stage-{int(r.request_id >= 4)}")
    # the two prompts share the group's 16-token system prompt and nothing after it
    a, b = run.records[0].input_token_ids, run.records[1].input_token_ids
    assert np.array_equal(a[:16], b[:16]) and not np.array_equal(a[16:], b[16:])
    # client timeout null -> aiohttp's 300 s, rounded up to the next whole second
    assert run.timeout_us == 300_000_000 and run.pause_us == 2_000_000
    assert [r.deadline_us for r in run.records[:2]] == [302_000_000, 302_000_000]
    assert run.decoded_output_len == 3.0 and run.measured_at == "client" and run.seed == 42


def test_client_deadline_rounds_long_timeouts_up_to_a_second():
    assert client_deadline_us(1_477_120, 300_000_000) == 302_000_000
    assert client_deadline_us(2_000_000, 300_000_000) == 302_000_000   # a whole second stays
    assert client_deadline_us(1_477_120, 5_000_000) == 6_477_120       # <= 5 s: not rounded
    assert client_deadline_us(1_477_120, 1_500) == 1_478_620


def test_measured_aggregates_settings_and_notes(tmp_path):
    run = load_inference_perf(write_run(tmp_path))
    s0, s1 = run.real_stages
    assert (s0.successes, s0.failures, s1.successes) == (4, 0, 2)
    assert s0.latency_ms["e2e"] == {"mean": 4.0, "p50": 4.0, "p90": 5.0, "p99": 6.0}
    assert s1.latency_ms["itl"]["mean"] == 2.0 and s0.max_latency_ms == 6.0
    assert run.real_total.latency_ms["tpot"]["mean"] == 1.5
    st = run.settings
    assert (st.model, st.tp, st.max_num_seqs, st.max_num_batched_tokens, st.max_model_len, st.hardware) == \
        ("meta-llama/llama-3.1-8b-instruct", 1, 128, 2048, 4096, "")
    assert any("aiohttp's default 300 s" in n for n in run.notes)
    assert isinstance(load_run(tmp_path / "run-a"), AggregateRun)


def test_the_results_folder_itself_is_accepted_and_named_after_its_run(tmp_path):
    folder = write_run(tmp_path)
    a, b = load_inference_perf(folder), load_inference_perf(folder / "results")
    assert b.name == a.name == "run-a" and b.settings == a.settings
    assert [r.send_time_us for r in a.records] == [r.send_time_us for r in b.records]


def test_prompt_lengths_follow_the_measured_mean(tmp_path):
    folder = write_run(tmp_path)
    for f in (folder / "results").glob("*.json"):
        doc = json.loads(f.read_text())
        doc["successes"]["prompt_len"]["mean"] = 35.2      # the server's count: 10% over 16 + 16
        f.write_text(json.dumps(doc, indent=2))
    run = load_inference_perf(folder)
    a, b = run.records[0].input_token_ids, run.records[1].input_token_ids
    assert len(a) == len(b) == 35                           # round(32 x 1.1)
    assert np.array_equal(a[:18], b[:18]) and a[18] != b[18]   # round(16 x 1.1) shared
    assert any("scaled to the measured mean prompt length 35.20" in n for n in run.notes)


def test_same_seed_same_workload_other_seed_other_sends(tmp_path):
    folder = write_run(tmp_path)
    a, b = load_inference_perf(folder), load_inference_perf(folder)
    assert [r.send_time_us for r in a.records] == [r.send_time_us for r in b.records]
    assert all(np.array_equal(x.input_token_ids, y.input_token_ids) for x, y in zip(a.records, b.records,
                                                                                      strict=True))
    c = with_seed(a, 7)
    assert with_seed(a, 42) is a and c.seed == 7 and c.settings.seed == 7
    assert [r.send_time_us for r in c.records] != [r.send_time_us for r in a.records]
    assert [r.send_time_us for r in c.records] == [r.send_time_us for r in load_inference_perf(folder, 7).records]


def _config(folder: Path, old: str, new: str) -> Path:
    p = folder / "results" / "config.yaml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))
    return p


def test_random_data_draws_lengths_like_inference_perf(tmp_path):
    folder = write_run(tmp_path)
    _config(folder, "  type: shared_prefix\n", "  type: random\n"      # (the shared_prefix section is ignored)
            "  input_distribution: {min: 10, max: 50, mean: 30, std_dev: 10, total_count: 5}\n"
            "  output_distribution: {min: 2, max: 8, mean: 4, std_dev: 2, total_count: 5}\n")
    for f in (folder / "results").glob("*.json"):      # no prompt length measured: no scaling
        doc = json.loads(f.read_text())
        doc["successes"]["prompt_len"] = None
        f.write_text(json.dumps(doc, indent=2))
    run = load_inference_perf(folder)
    rng = numpy_rng(derive_seed(42, "inference-perf"))
    ins = np.clip(np.round(np.clip(rng.normal(30, 10, 5), 10, 50)).astype(int), 10, 50)
    outs = np.clip(np.round(np.clip(rng.normal(4, 2, 5), 2, 8)).astype(int), 2, 8)
    # request j of each stage has the j-th lengths; fresh random tokens (no IDs: replay draws them)
    assert [r.input_tokens for r in run.records] == [*ins[:4], *ins[:2]]
    assert [r.output_tokens for r in run.records] == [*outs[:4], *outs[:2]]
    assert all(r.input_token_ids is None for r in run.records)
    assert run.decoded_output_len == pytest.approx(sum([*outs[:4], *outs[:2]]) / 6)


def test_synthetic_prompts_are_prefixes_of_one_text(tmp_path):
    folder = write_run(tmp_path)
    _config(folder, "  type: shared_prefix\n", "  type: synthetic\n  input_distribution: {min: 5, max: 40, mean: 20, "
            "std_dev: 8, total_count: 4}\n  output_distribution: {min: 3, max: 3, mean: 3, std_dev: 0, total_count: 4}\n")
    run = load_inference_perf(folder)
    ids = [r.input_token_ids for r in run.records]
    longest = max(ids, key=len)
    assert all(np.array_equal(x, longest[: len(x)]) for x in ids)
    assert len({len(x) for x in ids}) > 1


def test_poisson_stages_send_int_rate_x_duration_requests(tmp_path):
    folder = write_run(tmp_path)
    _config(folder, "  type: constant\n", "  type: poisson\n")
    _config(folder, "  - rate: 1.0\n    duration: 2", "  - rate: 0.0001\n    duration: 30000")
    run = load_inference_perf(folder)
    assert [s.count for s in run.stages] == [4, 3]
    sends = [r.send_time_us for r in run.records[:4]]
    assert sends == sorted(sends) and sends[0] > 0
    # a slow stage: mostly empty seconds, each non-empty second's sends within it
    late = [r.send_time_us - run.stages[1].start_us for r in run.records[4:]]
    assert late == sorted(late) and late[0] > 0 and run.stages[1].end_us >= run.records[-1].send_time_us
    _config(folder, "  - rate: 2.0\n", "  - rate: 2000000.0\n")
    with pytest.raises(ConfigError, match=r"load.stages\[0\].rate: not a number >= 1e-06 and <= 1e\+06"):
        load_inference_perf(folder)


@pytest.mark.parametrize("old, new, where, problem", [
    ("  type: shared_prefix", "  type: shareGPT", "config.yaml:5: data.type",
     "'shareGPT' is not supported by the rebuild (supported: shared_prefix, random, synthetic)"),
    ("  type: constant", "  type: concurrent", "config.yaml:13: load.type", "'concurrent' is not supported"),
    ("    num_groups: 1", "    num_groups: 1000000", "config.yaml:7: data.shared_prefix.num_groups",
     "not an integer >= 1 and <= 100000"),
    ("    num_groups: 1\n    num_prompts_per_group: 2", "    num_groups: 1000\n    num_prompts_per_group: 1000",
     "config.yaml:6: data.shared_prefix",
     "1000 x 1000 prompts, at most 100000"),
    ("  - rate: 2.0\n    duration: 2", "  - rate: 1000000.0\n    duration: 100", "config.yaml:16: load.stages[0]",
     "the stages send more than 1000000 requests"),
    ("    output_len: 3", "    output_len: 3\n    enable_multi_turn_chat: true",
     "config.yaml:12: data.shared_prefix.enable_multi_turn_chat", "multi-turn chat is not supported"),
    ("    duration: 2\n  - rate: 1.0", "    duration: -2\n  - rate: 1.0", "config.yaml:17: load.stages[0].duration",
     "not a number > 0"),
    ("  request_timeout: null", "  request_timeout: soon", "config.yaml:21: load.request_timeout", "not a number"),
    ("  ignore_eos: true", "  ignore_eos: maybe", "config.yaml:25: server.ignore_eos", "not true or false"),
])
def test_bad_configuration_is_one_located_error(tmp_path, old, new, where, problem):
    folder = write_run(tmp_path)
    path = _config(folder, old, new)
    with pytest.raises(ConfigError) as e:
        load_inference_perf(folder)
    line = e.value.one_line()
    assert line.startswith(f"{path.parent}/{where}: "), line
    assert problem in line, line


def test_config_lines_in_the_support_file_are_where_the_errors_say():
    lines = CONFIG.splitlines()
    assert lines[4] == "  type: shared_prefix" and lines[12] == "  type: constant"
    assert lines[20] == "  request_timeout: {timeout}" and lines[24] == "  ignore_eos: true"


def test_missing_lifecycle_file_is_named(tmp_path):
    folder = write_run(tmp_path)
    (folder / "results" / "stage_1_lifecycle_metrics.json").unlink()
    with pytest.raises(ConfigError) as e:
        load_inference_perf(folder)
    assert e.value.one_line() == (f"{folder}/results/stage_1_lifecycle_metrics.json: missing file: stage 1 sent 2 "
                                  "requests (load.stages[1] of config.yaml) and has no lifecycle metrics")


def test_bad_number_in_a_lifecycle_file_names_its_line_and_field(tmp_path):
    folder = write_run(tmp_path)
    f = folder / "results" / "stage_0_lifecycle_metrics.json"
    doc = json.loads(f.read_text())
    doc["successes"]["latency"]["time_to_first_token"]["p90"] = "fast"
    f.write_text(json.dumps(doc, indent=2))
    line = next(i for i, t in enumerate(f.read_text().splitlines(), 1)
                if '"p90": "fast"' in t)
    with pytest.raises(ConfigError) as e:
        load_inference_perf(folder)
    assert e.value.one_line() == (f"{f}:{line}: successes.latency.time_to_first_token.p90: not a number of "
                                  "seconds in [0, 1e+09]: 'fast'")


@pytest.mark.parametrize("edit, field, problem", [
    (lambda d: d["load_summary"].update(count=5), "load_summary.count", "successes 4 + failures 0 is not the 5"),
    (lambda d: d["successes"].update(count=-1), "successes.count", "not a count"),
    (lambda d: d["successes"]["latency"].update(request_latency=None), "successes.latency.request_latency",
     "missing"),
    (lambda d: d["successes"]["latency"]["request_latency"].update(mean=1e300), "successes.latency.request_latency.mean",
     "not a number of seconds"),
])
def test_malformed_lifecycle_values(tmp_path, edit, field, problem):
    folder = write_run(tmp_path)
    f = folder / "results" / "stage_0_lifecycle_metrics.json"
    doc = json.loads(f.read_text())
    edit(doc)
    f.write_text(json.dumps(doc, indent=2))
    with pytest.raises(ConfigError) as e:
        load_inference_perf(folder)
    line = e.value.one_line()
    assert line.startswith(f"{f}:") and f": {field}: {problem}" in line, line


def test_lifecycle_file_that_is_not_json_or_too_large(tmp_path):
    folder = write_run(tmp_path)
    f = folder / "results" / "summary_lifecycle_metrics.json"
    f.write_text('{"load_summary": {\n  "count": 6,,\n}')
    with pytest.raises(ConfigError) as e:
        load_inference_perf(folder)
    assert e.value.one_line().startswith(f"{f}:2: not JSON: ")
    with open(f, "wb") as fh:
        fh.truncate((16 << 20) + 1)
    with pytest.raises(ConfigError) as e:
        load_inference_perf(folder)
    assert e.value.one_line() == f"{f}: larger than {16 << 20} bytes"


def test_bad_experiment_configuration(tmp_path):
    folder = write_run(tmp_path)
    (folder / "exp-config.yaml").write_text("model: m\ntensor_parallelism: 0\n")
    with pytest.raises(ConfigError) as e:
        load_inference_perf(folder)
    assert e.value.one_line() == f"{folder}/exp-config.yaml:2: tensor_parallelism: not an integer in [1, 2147483647]: 0"


def test_without_exp_config_or_summary(tmp_path):
    run = load_inference_perf(write_run(tmp_path, exp=False, summary=False))
    assert run.settings is None and run.real_total is None
    assert any("no summary_lifecycle_metrics.json" in n for n in run.notes)


def test_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_inference_perf(tmp_path)
    assert e.value.one_line() == f"{tmp_path}: not an inference-perf results folder (no results/config.yaml)"
