"""Every rich table of the CLI fits the terminal: rendered at 60, 80 and 120 columns, no line
is wider than the terminal and every number of every table appears whole — unless its column
is named in the "left out to fit" note (blis_simpy/cli/tables.py, docs/cli.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.table import Table
from rich.text import Text

from tests.calibrate.test_calibrate import tiny  # noqa: F401  (fixture)
from tests.fit.test_fit import measured  # noqa: F401  (fixture)
from tests.planner.test_plan import write_plan

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (60, 80, 120)
#: a number as it stands in a cell: not glued to a letter, digit or point before it
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
NUMERIC_CELL = re.compile(r"^[\s$≤~+\-(\[]*\d")


@pytest.fixture
def tables(monkeypatch):
    """Every table built while the test runs: ``[(table, [row cells...])]`` (recorded as
    ``add_row`` is called, so it does not depend on how tables are printed)."""
    seen: dict[int, tuple[Table, list]] = {}
    add_row = Table.add_row

    def record(self, *cells, **kw):
        seen.setdefault(id(self), (self, []))[1].append(cells)
        return add_row(self, *cells, **kw)
    monkeypatch.setattr(Table, "add_row", record)
    return seen


def _plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def check_fits(out: str, width: int, seen: dict) -> int:
    """Assert the rule of the module docstring on the output; returns the cells checked."""
    lines = out.splitlines()
    assert max(Text(ln).cell_len for ln in lines) <= width
    flat = " ".join(out.split())
    left_out = {n for m in re.finditer(r"left out to fit \d+ columns: (.*?);", flat) for n in m[1].split(", ")}
    have = set(NUMBER.findall(out))
    checked = 0
    for table, rows in seen.values():
        heads = [" ".join(_plain(c.header).replace("-\n", "").split()) for c in table.columns]
        for row in rows:
            for head, cell in zip(heads, row, strict=False):
                text = _plain(cell).strip()
                if head in left_out or not text:
                    continue
                if NUMERIC_CELL.match(text) and ", " not in text:    # the whole cell on one line
                    # (a list of numbers may wrap between them; each is checked below)
                    assert any(text in ln for ln in lines), (width, head, text)
                missing = set(NUMBER.findall(text)) - have
                assert not missing, (width, head, text, missing)
                checked += 1
    assert checked > 0
    return checked


def _run_at(cli, monkeypatch, tables, width: int, *args) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    tables.clear()
    r = cli(*args)
    assert r.exit_code == 0, r.output
    check_fits(r.stdout, width, tables)
    return r.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_run_tables(cli, monkeypatch, tables, width):
    _run_at(cli, monkeypatch, tables, width, "run", "--scenario", ROOT / "scenarios/quickstart.yaml",
            "--num-requests", "60", "--slo-ttft", "200", "--slo-itl", "30")


@pytest.mark.parametrize("width", WIDTHS)
def test_variants_tables(cli, monkeypatch, tables, width):
    out = _run_at(cli, monkeypatch, tables, width, "run", "--scenario", ROOT / "scenarios/pd_comparison.yaml",
                  "--num-requests", "40", "--slo-ttft", "500", "--slo-itl", "30")
    assert "SLO" in out and "Verdict: " in out


def _dataset(folder: Path) -> Path:
    """A sweep dataset with the figures of issue 23 (rate x instances x 3 seeds)."""
    rows = []
    for rate in (4, 24):
        for n in (1, 2):
            for seed, (ttft, itl) in zip((42, 43, 44), ((48.2, 22.9), (52.6, 23.1), (43.9, 22.95)), strict=True):
                rows.append({"config_hash": f"{rate}-{n}-{seed}", "config_key": f"{rate}-{n}", "seed": seed,
                             "command": "run", "workload.rate": rate, "cluster.num_instances": n,
                             "m.ttft_p99_ms": ttft * rate / 4 / n, "m.itl_p99_ms": itl + rate,
                             "m.e2e_p99_ms": 5229.0 * rate / n + seed, "m.responses_per_sec": 0.9 * rate + seed / 1000,
                             "slo.attainment_pct.all": 100.0 - rate / n + seed / 100, "slo.goodput_rps": 0.9 * rate,
                             "deployment.total_gpus": n, "status": "ok", "error": None, "wall_s": 1.0, "config": "{}"})
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), folder / "part-0.parquet")
    return folder


@pytest.mark.parametrize("width", WIDTHS)
def test_sweep_summary_table(cli, monkeypatch, tables, width, tmp_path):
    out = _run_at(cli, monkeypatch, tables, width, "sweep", "--summary", _dataset(tmp_path / "ds"))
    for rate in ("4", "24"):      # the axes never go (issue 23: `rate` and `seeds` vanished at 80)
        assert re.search(rf"(^|\s){rate}\s", out)


@pytest.mark.parametrize("width", WIDTHS)
def test_plan_tables(cli, monkeypatch, tables, width, tmp_path):
    out = _run_at(cli, monkeypatch, tables, width, "plan", write_plan(tmp_path, 10), "--serial")
    assert "2 inst x A100-80 TP2" in out


@pytest.mark.parametrize("width", WIDTHS)
def test_catalog_and_capacity_tables(cli, monkeypatch, tables, width):
    _run_at(cli, monkeypatch, tables, width, "catalog")
    _run_at(cli, monkeypatch, tables, width, "catalog", "capacity", "--model", "meta-llama/llama-3.1-8b",
            "--hardware", "H100")


@pytest.mark.parametrize("width", WIDTHS)
def test_calibrate_tables(cli, monkeypatch, tables, width, tiny):  # noqa: F811
    prefix, sc = tiny
    _run_at(cli, monkeypatch, tables, width, "calibrate", prefix, "--scenario", sc)


@pytest.mark.parametrize("width", WIDTHS)
def test_fit_tables(cli, monkeypatch, tables, width, measured, tmp_path):  # noqa: F811
    prefix, wrong = measured
    _run_at(cli, monkeypatch, tables, width, "fit", prefix, "--scenario", wrong, "-o", tmp_path / "s.yaml",
            "--max-evaluations", "3")


@pytest.mark.parametrize("width", WIDTHS)
def test_observe_table(monkeypatch, tables, width, capsys):
    from types import SimpleNamespace as NS

    from blis_simpy.cli.observe_cmd import print_summary
    monkeypatch.setenv("COLUMNS", str(width))
    lat = {"count": 1234, "mean": 1234.56, "p50": 987.65, "p90": 23456.78, "p99": 123456.78}
    summary = {"requests": 1300, "warmup_requests": 66, "ok": 1234, "errors": 0, "timeouts": 0,
               "ttft_ms": lat, "itl_ms": dict(lat, count=98765), "e2e_ms": lat, "requests_per_s": 4.5,
               "output_tokens_per_s": 1234.5, "duration_s": 289.123, "tokens_from_chunks": 0}
    cfg = NS(streaming=True, model="meta-llama/Llama-3.1-8B-Instruct", api_format="completions",
             max_concurrency=256)
    print_summary(None, cfg, "http://127.0.0.1:8000", summary, [])
    header, out = capsys.readouterr().out.split("\n", 1)     # the header line is soft-wrapped
    assert header.startswith("observe: 1300 requests to http://127.0.0.1:8000")
    assert check_fits(out, width, tables) == 18


def test_piped_output_is_120_columns_without_columns(cli, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    r = cli("catalog", "models")
    assert r.exit_code == 0
    assert max(Text(ln).cell_len for ln in r.stdout.splitlines()) == 120


# ---------------------------------------------------------------------------- the mechanism
def _render(renderable, width: int) -> str:
    from rich.console import Console
    con = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    con.print(renderable)
    return con.export_text()


def test_columns_are_left_out_in_the_stated_order_then_the_table_goes_vertical():
    from blis_simpy.cli.tables import Fitted
    t = Table(title="t")
    for h in ("name", "alpha", "beta", "gamma"):
        t.add_column(h)
    t.add_row("x", "1,234,567.25", "22.98 ± 0.193", "7")
    wide = _render(Fitted(t, drop=("gamma", "beta"), note="--format json has them"), 80)
    assert "left out" not in wide and "22.98 ± 0.193" in wide
    # 4 + 12 + 13 + 5 = 34 columns of text, + 3 per column and 1: 51 > 45; without gamma 43
    mid = _render(Fitted(t, drop=("gamma", "beta"), note="--format json has them"), 45)
    assert " ".join(mid.split()).endswith("└──────┴──────────────┴───────────────┘ left out to fit 45 "
                                          "columns: gamma; --format json has them")
    assert "22.98 ± 0.193" in mid and "1,234,567.25" in mid
    narrow = _render(Fitted(t, drop=("gamma",)), 30)         # beta may not go: vertical
    assert [ln.split("│")[1:3] for ln in narrow.splitlines() if "gamma" in ln or "beta" in ln] == [
        [" beta:  ", " 22.98 ± 0.193 "], [" gamma: ", " 7             "]]


def test_verdict_names_the_cheapest_variant_meeting_the_slos_or_the_closest():
    from types import SimpleNamespace as NS

    from blis_simpy.cli.variants import verdict

    def variant(name, att, good, usd, gpus):
        overall = NS(attainment_pct=lambda: {"all": att}, goodput_rps=good)
        report = NS(slo=NS(overall=overall), deployment=NS(cost_per_hour_usd=usd), autoscaling=None)
        return NS(name=name), NS(report=report, result=NS(gpus=gpus))

    vs = [variant("a", 100.0, 9.0, 12.0, 4), variant("b", 100.0, 8.0, 6.0, 2), variant("c", 80.0, 9.5, 3.0, 1)]
    assert verdict(*map(list, zip(*vs, strict=True))) == (
        "Verdict: b meets the SLOs at the lowest cost, $6.00/h, goodput 8.00 req/s; also meeting them: "
        "a ($12.00/h). Meeting the SLOs: every offered request met every target.")
    vs = [variant("a", 100.0, 9.0, None, 4), variant("b", 100.0, 9.5, None, 4)]   # a tie: goodput
    assert verdict(*map(list, zip(*vs, strict=True))) == (
        "Verdict: b meets the SLOs at the lowest cost, 4 GPUs, goodput 9.50 req/s; also meeting them: a "
        "(4 GPUs). Meeting the SLOs: every offered request met every target; cost: GPUs (no GPU price: "
        "--gpu-hour-cost).")
    vs = [variant("rr", 83.3, 5.0, None, 4), variant("pd", 16.6, 1.0, None, 4)]
    assert verdict(*map(list, zip(*vs, strict=True))) == (
        "Verdict: no variant meets the SLOs; closest: rr, 83.3 % attainment, goodput 5.00 req/s, 4 GPUs. "
        "Meeting the SLOs: every offered request met every target; cost: GPUs (no GPU price: "
        "--gpu-hour-cost).")


def test_verdict_with_an_autoscaled_variant_costs_gpu_hours():
    from types import SimpleNamespace as NS

    from blis_simpy.cli.variants import verdict

    def variant(name, att, gpus, hours=None):
        overall = NS(attainment_pct=lambda: {"all": att}, goodput_rps=5.0)
        # a fixed variant: its GPUs over a run of 1,800 s; an autoscaled one: its own GPU-hours
        report = NS(slo=NS(overall=overall), deployment=NS(cost_per_hour_usd=None),
                    autoscaling=None if hours is None else NS(gpu_hours=hours),
                    cluster=NS(sim_ended_time=1_800_000_000))
        return NS(name=name), NS(report=report, result=NS(gpus=gpus))

    vs = [variant("auto", 99.0, 3, hours=0.8), variant("one", 60.0, 1), variant("two", 99.0, 2),
          variant("three", 99.5, 3)]
    assert verdict(*map(list, zip(*vs, strict=True))) == (
        "Verdict: no variant meets the SLOs; closest: three, 99.5 % attainment, goodput 5.00 req/s, "
        "1.500 GPU-h. Meeting the SLOs: every offered request met every target; cost: GPU-hours over "
        "the run (a variant is autoscaled).\n"
        "auto: 0.800 GPU-h at 99.0 % attainment; the smallest fixed variant with at least that: two, "
        "1.000 GPU-h (1.25x).")
    vs = [variant("auto", 99.9, 3, hours=0.8), variant("two", 99.0, 2)]
    assert verdict(*map(list, zip(*vs, strict=True))).endswith(
        "auto: 0.800 GPU-h at 99.9 % attainment; no fixed variant reaches that attainment.")


def test_one_request_is_singular(cli, monkeypatch, tmp_path):
    out = cli("run", "--scenario", ROOT / "scenarios/pd_comparison.yaml", "--num-requests", "1").stdout
    assert "run: pd-comparison: 1 request, the same for each of 4 variants" in out
