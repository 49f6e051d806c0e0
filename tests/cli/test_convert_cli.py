"""``blis-simpy convert`` end to end, and replay's one-line warning at its default horizon."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from blis_simpy.workload.convert import preset_workload, spec_to_yaml
from blis_simpy.workload.tracev2_read import read_trace
from blis_simpy.workload.tracev2_write import write_trace
from tests.conftest import REALDATA_FACTS
from tests.workload.test_observed_vllm_log import write_run

from .support import LOCATED, write_trace_files

SAMPLE = Path(__file__).resolve().parents[1] / "workload" / "data" / "vllm_bench_result.json"
RTX4090 = "vllm-rtx4090-llama-3.1-8b"
#: what ``convert vllm-log`` says of the RTX 4090 run: (arrivals over, last token at), seconds
CONVERTED_SPAN = {"full": ("29.121", "183.567"), "excerpt": ("4.155", "48.976")}


def _ok(res):
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr)
    return res


def test_preset_prints_or_writes_the_spec(cli, tmp_path, small_scenario):
    res = _ok(cli("convert", "preset", "--name", "chatbot", "--rate", "2", "--num-requests", "3"))
    assert res.stdout == spec_to_yaml(preset_workload("chatbot", 2.0, 3)) and res.stderr == ""
    out = tmp_path / "chatbot.yaml"
    res = _ok(cli("convert", "preset", "--name", "chatbot", "--num-requests", "3", "--output", out))
    assert res.stdout == f"wrote {out}\n"
    run = _ok(cli("run", "--scenario", small_scenario, "--workload-spec", out, "--format", "json"))
    assert json.loads(run.stdout)["cluster"]["completed_requests"] == 3


def test_bad_preset_flag_is_one_line(cli):
    res = cli("convert", "preset", "--name", "chatbot", "--rate", "0")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == "error: --rate: must be a finite number > 0 (req/s), got 0.0\n"


def test_vllm_log_real_run_files_validate_and_replay(cli, realdata, tmp_path):
    prefix = tmp_path / "runs" / "vllm-rtx4090"
    prefix.parent.mkdir()
    res = _ok(cli("convert", "vllm-log", "--run", realdata.path(RTX4090), "--output", prefix))
    names = [f"{prefix}{s}" for s in (".header.yaml", ".csv", ".scenario.yaml", ".timeseries.csv")]
    n = REALDATA_FACTS[realdata.kind].requests
    arrivals, last = CONVERTED_SPAN[realdata.kind]
    assert res.stdout == (f"converted {RTX4090}: {n} rows, arrivals over {arrivals} s, last token at "
                          f"{last} s; wrote {', '.join(names)}\n")
    assert all(Path(n).is_file() for n in names)
    scen = Path(names[2])
    val = _ok(cli("validate", scen))
    assert val.stdout.startswith(f"ok: {scen}: {RTX4090}: model meta-llama/llama-3.1-8b, physics latency")
    assert val.stdout.rstrip().endswith(f"({n} trace rows)")
    rep = _ok(cli("replay", "--scenario", scen, "--format", "json"))
    assert json.loads(rep.stdout)["cluster"]["completed_requests"] == n
    assert "warning" not in rep.stderr            # the scenario replays to completion


def test_real_shared_prefix_hits_the_simulated_cache(cli, realdata, tmp_path):
    """Line 237 of the real workload (1871 tokens) begins with all 1265 tokens of line 207.
    Replayed alone, 5 s apart, with 4 output tokens each: the second finds the first's 79
    full prompt blocks cached; the two occupy 80 + 118 blocks (1269 and 1875 tokens, 16 a
    block), so the hit rate is 79/198. In the excerpt, line 47 (1255 tokens) begins with all
    455 of line 40: 28 full blocks cached of 29 + 79 (459 and 1259 tokens), 28/108. Without
    the IDs the random prompts share nothing."""
    prefix = tmp_path / "r"
    _ok(cli("convert", "vllm-log", "--run", realdata.path(RTX4090), "--output", prefix))
    tr = read_trace(f"{prefix}.header.yaml", f"{prefix}.csv")
    by = {r.request_id: r for r in tr.records}
    first, later = REALDATA_FACTS[realdata.kind].pair[:2]
    pair = [dataclasses.replace(by[first], arrival_time_us=0, send_time_us=0, output_tokens=4),
            dataclasses.replace(by[later], arrival_time_us=5_000_000, send_time_us=5_000_000, output_tokens=4)]
    write_trace(tmp_path / "pair", tr.header, pair)
    write_trace(tmp_path / "plain", tr.header, [dataclasses.replace(r, input_token_ids=None) for r in pair])
    rates = []
    for name in ("pair", "plain"):
        res = _ok(cli("replay", "--scenario", f"{prefix}.scenario.yaml", "--trace-header",
                      tmp_path / f"{name}.yaml", "--trace-data", tmp_path / f"{name}.csv", "--format", "json"))
        rates.append(json.loads(res.stdout)["kv_cache"]["cache_hit_rate"])
    assert rates == [79 / 198 if realdata.full else 28 / 108, 0]


def test_vllm_bench_sample(cli, tmp_path):
    prefix = tmp_path / "bench"
    res = _ok(cli("convert", "vllm-bench", "--result", SAMPLE, "--output", prefix))
    assert res.stdout == (f"converted vllm_bench_result: 4 rows (1 failed), arrivals over 1.500 s, last "
                          f"token at 1.812 s; wrote {prefix}.header.yaml, {prefix}.csv\n")
    assert res.stderr == "warning: 1 of 4 requests failed (status error)\n"
    lines = Path(f"{prefix}.csv").read_text().splitlines()
    assert lines[0].endswith(",num_chunks,status,error_message,finish_reason")     # no token IDs
    assert lines[1] == "0,,,,,0,,0,true,512,4,0,0,0,0,0,,0,0,0,0,125000,234375,4,ok,,"
    assert lines[3].startswith("2,,,,,0,,0,true,500,0,0,0,0,0,0,,0,0,750000,750000,0,0,0,error,")
    assert "mode: real" in Path(f"{prefix}.header.yaml").read_text()


def test_malformed_log_is_one_located_line_and_writes_nothing(cli, tmp_path):
    run = write_run(tmp_path)
    with open(run / "requests.jsonl", "a") as f:
        f.write('{"request_id": "bench-3", "input_toks": 3}\n')
    out = tmp_path / "out"
    out.mkdir()
    res = cli("convert", "vllm-log", "--run", run, "--output", out / "x")
    assert res.exit_code == 2 and res.stdout == ""
    m = LOCATED.match(res.stderr.rstrip("\n"))
    assert m and res.stderr.count("\n") == 1
    assert (m["file"], m["line"], m["field"]) == (str(run / "requests.jsonl"), "4", "queued_ts")
    assert list(out.iterdir()) == []


def test_unwritable_output_leaves_no_file(cli, tmp_path):
    run = write_run(tmp_path)
    out = tmp_path / "out"
    (out / "x.csv").mkdir(parents=True)          # PREFIX.csv cannot be written
    res = cli("convert", "vllm-log", "--run", run, "--output", out / "x")
    assert res.exit_code == 2
    assert res.stderr == f"error: {out / 'x.csv'}: is a directory, expected a file path\n"
    assert sorted(p.name for p in out.iterdir()) == ["x.csv"]


# ----------------------------------------------------------------------------- replay hygiene

def _rows() -> list[str]:
    def row(rid, t, n_in, n_out):
        return f"{rid},c,,,,0,,0,false,{n_in},{n_out},0,0,0,0,0,,0,0,{t},{t},0,0,0,ok,,"
    return [row(0, 0, 100, 50), row(1, 100_000, 100, 50), row(2, 200_000, 100, 2)]


def test_replay_warns_once_when_its_default_horizon_cuts_requests(cli, tmp_path, small_scenario):
    """Default horizon 2 x 200 ms = 400 ms. Request 1 arrives at 100 ms and needs 50 decode
    steps of at least beta0 = 6.472 ms: it cannot finish before 423 ms."""
    h, d = write_trace_files(tmp_path, _rows())
    res = _ok(cli("replay", "--scenario", small_scenario, "--trace-header", h, "--trace-data", d,
                  "--format", "json"))
    assert res.stderr == ("warning: 1 of 3 requests unfinished at the horizon 0.4 s (replay's default, "
                          "2x the last arrival); pass --horizon or horizon_us to replay to completion\n")
    c = json.loads(res.stdout)["cluster"]
    assert (c["completed_requests"], c["still_running"]) == (2, 1)
    assert "warning" not in res.stdout
    full = _ok(cli("replay", "--scenario", small_scenario, "--trace-header", h, "--trace-data", d,
                   "--horizon", "100000000", "--format", "json"))
    assert full.stderr == "" and json.loads(full.stdout)["cluster"]["completed_requests"] == 3


def test_replay_that_finishes_or_has_an_explicit_horizon_does_not_warn(cli, tmp_path, small_scenario):
    h, d = write_trace_files(tmp_path, _rows()[2:])           # 2 tokens: done well before 400 ms
    assert _ok(cli("replay", "--scenario", small_scenario, "--trace-header", h, "--trace-data", d,
                   "--format", "json")).stderr == ""
    h, d = write_trace_files(tmp_path, _rows(), name="cut")
    res = _ok(cli("replay", "--scenario", small_scenario, "--trace-header", h, "--trace-data", d,
                  "--horizon", "300000", "--format", "json"))
    assert res.stderr == ""                       # the user chose the horizon
