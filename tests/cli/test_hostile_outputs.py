"""Outputs a command must not write, or not write where it was told to through a link (issue
23, finding 6): an empty output path, a symlinked ``report --out``, a report of inputs with
nothing to show, a results row whose ``num_decode_tokens`` is not a number."""

from __future__ import annotations

import json

import pytest

from tests.cli.support import SMALL_SCENARIO


def _one_line(res, code: int = 2) -> str:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    assert res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
    return res.stderr.rstrip("\n")


@pytest.fixture
def results(cli, tmp_path):
    """A run's --results-path file (24 requests)."""
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO)
    path = tmp_path / "r.json"
    assert cli("run", "--scenario", sc, "--results-path", path, "--format", "json").exit_code == 0
    return path


@pytest.mark.parametrize("flag", ["--results-path", "--trace-output", "--trace-output-decisions",
                                  "--requests-out", "--timeline"])
def test_an_empty_output_path_is_refused(cli, tmp_path, flag):
    sc = tmp_path / "s.yaml"
    sc.write_text(SMALL_SCENARIO)
    line = _one_line(cli("run", "--scenario", sc, flag, "", "--format", "json"))
    assert line == f"error: {flag}: an empty path: give the file to write"


def test_report_row_with_a_text_token_count(cli, results, tmp_path):
    """``"num_decode_tokens": "Infinity"`` was an internal error (TypeError, exit 1)."""
    doc = json.loads(results.read_text())
    doc["requests"][3]["num_decode_tokens"] = "Infinity"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    line = _one_line(cli("report", bad, "--out", tmp_path / "out"))
    assert line == f"error: {bad}: INPUT: request row 3: num_decode_tokens: not a number, got 'Infinity'"
    assert not (tmp_path / "out").exists()


def test_report_with_nothing_to_show_writes_nothing(cli, results, tmp_path):
    """A results file without completed requests made an empty page, exit 0."""
    doc = json.loads(results.read_text())
    doc["requests"] = []
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(doc))
    line = _one_line(cli("report", empty, "--out", tmp_path / "out"))
    assert line == (f"error: INPUT: nothing to show: no figure can be made from {empty} "
                    "(results: 0 completed requests)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("link", ["out", "out/figures"])
def test_report_out_through_a_symlink_is_refused(cli, results, tmp_path, link):
    """``--out LINK`` wrote into the folder the link points at."""
    real = tmp_path / "elsewhere"
    real.mkdir()
    if link != "out":
        (tmp_path / "out").mkdir()
    (tmp_path / link).symlink_to(real)
    line = _one_line(cli("report", results, "--out", tmp_path / "out"))
    assert line == (f"error: {tmp_path / link}: --out: is a symbolic link (to {real}): output folders "
                    "are not written through links; give the folder itself")
    assert list(real.iterdir()) == []
