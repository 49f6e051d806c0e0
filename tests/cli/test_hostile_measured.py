"""Measured-run commands on input with nothing in it or beyond the caps (issue 23, finding 6):
``fit``/``calibrate`` of a trace with no rows, ``convert servegen`` of token counts over
2^24, and the converters' warnings in the CLI's log format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "workload" / "data" / "vllm_bench_result.json"


def _empty_run(cli, tmp_path: Path) -> Path:
    """A converted vllm-bench run (PREFIX) whose CSV has the header row only."""
    prefix = tmp_path / "b"
    assert cli("convert", "vllm-bench", "--result", BENCH, "--output", prefix).exit_code == 0
    csv = tmp_path / "b.csv"
    csv.write_text(csv.read_text().splitlines()[0] + "\n")
    return prefix


@pytest.mark.parametrize("args", [("fit", "-o", "SET"), ("calibrate",), ("calibrate", "--plot", "PLOTS")])
def test_a_run_with_no_rows_is_one_line(cli, tmp_path, args):
    """fit: internal error (numpy's "need at least one array"); calibrate: empty tables with
    exit 0, and with --plot matplotlib's UserWarning and source line on stderr."""
    prefix = _empty_run(cli, tmp_path)
    args = [str(tmp_path / a) if a.isupper() else a for a in args]
    res = cli(args[0], prefix, *args[1:], "--model", "meta-llama/llama-3.1-8b-instruct",
              "--hardware", "H100")
    assert (res.exit_code, res.stdout) == (2, ""), res.stderr
    assert res.stderr == f"error: {prefix}: the run has no request rows: nothing to {args[0]} against\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.csv", "b.header.yaml"]


def _servegen(d: Path, input_pdf: str) -> Path:
    d.mkdir()
    (d / "chunk-a-trace.csv").write_text("0,2.0,1.5,Gamma\n")
    (d / "chunk-a-dataset.json").write_text(json.dumps(
        {"0": {"input_tokens": input_pdf, "output_tokens": "{10: 1.0}"}, "later": {}}))
    return d


def test_convert_servegen_applies_the_token_cap(cli, tmp_path):
    """A PDF key over 2^24 was written (exit 0) into a spec that ``run`` then refused."""
    d = _servegen(tmp_path / "sg", "{100: 0.25, 16777217: 0.75}")
    res = cli("convert", "servegen", "--path", d, "--output", tmp_path / "w.yaml")
    assert (res.exit_code, res.stdout) == (2, "")
    assert res.stderr.splitlines()[-1] == (
        f"error: {d}/chunk-a-dataset.json: 0.input_tokens: token count 16777217 is more than 16777216 "
        "tokens (2^24), the cap of every token count")
    assert not (tmp_path / "w.yaml").exists()


def test_convert_servegen_at_the_cap_runs(cli, tmp_path):
    d = _servegen(tmp_path / "sg", "{100: 0.25, 16777216: 0.75}")
    res = cli("convert", "servegen", "--path", d, "--output", tmp_path / "w.yaml")
    assert res.exit_code == 0, res.stderr
    # the warning about the window that is no start time, in the CLI's log format
    assert res.stderr == (f"WARNING blis_simpy.workload.expand: {d}/chunk-a-dataset.json: skipping "
                          "window 'later' (not a start time in seconds)\n")
    res = cli("run", "--model", "meta-llama/llama-3.1-8b-instruct", "--workload-spec", tmp_path / "w.yaml",
              "--num-requests", "2", "--format", "json")
    assert res.exit_code == 0, res.stderr        # run accepts what convert wrote
    assert json.loads(res.stdout)["cluster"]["injected_requests"] == 2
