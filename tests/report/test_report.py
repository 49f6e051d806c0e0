"""blis-simpy report: the page and its figures from real run outputs, a sweep dataset and a
plan result; figures with data; the knee marked; same bytes twice; bad inputs; the page
rendered in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from blis_simpy.report import figures
from blis_simpy.report.inputs import load_input

RUN = ["run", "--model", "qwen/qwen3-14b", "--hardware", "H100", "--tp", "1",
       "--latency-model", "roofline", "--format", "json", "--num-requests", "60", "--rate", "20"]
PD = ["--num-instances", "3", "--prefill-instances", "1", "--decode-instances", "2",
      "--pd-decider", "always"]
PLAN = [{"label": "1 x TP1", "gpus": 1, "cost_per_hour_usd": 2.5, "ttft_p99_ms": 900,
         "goodput_rps": 5, "meets_slo": True},
        {"label": "2 x TP1", "gpus": 2, "cost_per_hour_usd": 5.0, "ttft_p99_ms": 300,
         "goodput_rps": 10, "meets_slo": True},
        {"label": "1 x TP2", "gpus": 2, "cost_per_hour_usd": 5.0, "ttft_p99_ms": 500,
         "goodput_rps": 8, "meets_slo": True},
        {"label": "1 x TP1 (slow)", "gpus": 1, "cost_per_hour_usd": 2.5, "ttft_p99_ms": 3000,
         "goodput_rps": 1, "meets_slo": False}]


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _sweep(path: Path) -> None:
    """A sweep dataset as `sweep` writes it: 2 instance counts x 6 rates x 2 seeds. With one
    instance p99 TTFT is 100 ms up to rate 6 and 640 ms at 8 (the knee: > 2 x 100); with two
    it stays at 100 ms (no knee)."""
    rows = []
    for inst in (1, 2):
        for rate in (2, 4, 6, 8, 10, 12):
            for seed in (1, 2):
                lat = 100.0 if rate / inst <= 6 else 10.0 * (rate / inst) ** 2
                rows.append({"config_hash": f"h{inst}-{rate}-{seed}", "config_key": f"k{inst}-{rate}",
                             "seed": seed, "command": "run", "workload.rate": float(rate),
                             "cluster.num_instances": inst, "status": "ok", "error": "",
                             "wall_s": 0.1, "m.ttft_p99_ms": lat + seed - 1.5,
                             "m.e2e_p99_ms": 10 * lat, "slo.attainment_pct.all": 100 - lat / 10,
                             "config": "{}"})
    rows.append(dict(rows[0], config_hash="bad", status="error", error="boom",
                     **{"m.ttft_p99_ms": None}))
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path / "part-1-a.parquet")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    res = _cli(*RUN, *PD, "--results-path", d / "results.json", "--timeline", d / "timeline.csv",
               "--requests-out", d / "rows.jsonl")
    assert res.exit_code == 0, res.output
    _sweep(d / "sweep")
    (d / "plan.json").write_text(json.dumps(PLAN))
    return {"results": d / "results.json", "timeline": d / "timeline.csv", "rows": d / "rows.jsonl",
            "sweep": d / "sweep", "plan": d / "plan.json"}


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    res = _cli("report", *inputs.values(), "--out", out)
    assert res.exit_code == 0, res.output
    return out


EXPECTED = {"latency_cdf", "timeline_timeline", "pd_transfers_timeline", "latency_vs_rate_sweep",
            "slo_heatmap_sweep", "pareto_plan"}


def test_files_exist_and_page_lists_inputs_and_figures(report, inputs):
    pngs = {p.stem for p in (report / "figures").glob("*.png")}
    assert pngs == EXPECTED
    for p in (report / "figures").glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5_000
    page = (report / "index.html").read_text()
    for name in EXPECTED:
        assert f'<img src="figures/{name}.png"' in page
    for path in inputs.values():
        assert f"<code>{path}</code>" in page
    assert "results: 60 completed requests" in page and "sweep dataset: 24 ok point(s)" in page
    assert "plan result: 4 deployment(s)" in page and "timeline: " in page
    assert "cluster.num_instances=1: knee at rate 8" in page
    assert "cluster.num_instances=2: no knee within the sweep" in page
    assert not list(report.rglob("*.tmp"))


def test_every_figure_has_data(inputs):
    loaded = [load_input(str(p)) for p in inputs.values()]
    specs = figures.build_figures(loaded)
    assert {s.name for s in specs} == EXPECTED
    for s in specs:
        assert figures.has_data(s.fig), s.name
        for ax in s.fig.get_axes():
            if ax.get_label() == "<colorbar>":
                continue
            n = sum(len(ln.get_xdata()) for ln in ax.get_lines())
            n += sum(len(c.get_offsets()) for c in ax.collections) + len(ax.images)
            assert n > 0, s.name
    cdf = next(s for s in specs if s.name == "latency_cdf").fig
    # two results inputs (the results file and the --requests-out rows): the same 60 requests
    ttft = cdf.get_axes()[0].get_lines()
    assert len(ttft) == 2 and len(ttft[0].get_xdata()) == 60
    assert list(ttft[0].get_xdata()) == list(ttft[1].get_xdata())
    assert ttft[0].get_ydata()[-1] == 1.0


def test_knee_is_marked_on_the_sweep_figure(inputs):
    sweep = load_input(str(inputs["sweep"]))
    assert sweep.table.num_rows == 24                  # the error row is left out
    fig, notes = figures.latency_rate_figure(sweep)
    ttft_ax = fig.get_axes()[0]
    marks = [ln for ln in ttft_ax.get_lines() if ln.get_marker() == "X"]
    assert [(list(m.get_xdata()), list(m.get_ydata())) for m in marks] == [([8.0], [640.0])]
    assert notes[0].startswith("p99 TTFT (ms), cluster.num_instances=1: knee at rate 8 ")


def test_a_sweep_dataset_is_read_as_the_sweep_reads_it(tmp_path):
    """Part 1 has integer rates (int64 column), part 2 a float rate and the seed-1 row of rate
    8 again (same config hash: a point run twice). The report read the directory with the
    first file's schema: 'Float value 5.5 was truncated', exit 2; and it counted the repeated
    point twice (mean 639.8 instead of 640). Now one row per point, as `sweep --summary`."""
    def row(rate, seed):
        lat = 100.0 if rate <= 6 else 10.0 * rate ** 2
        return {"config_hash": f"h{rate:g}-{seed}", "config_key": f"k{rate:g}", "seed": seed,
                "command": "run", "workload.rate": rate, "status": "ok", "error": "",
                "wall_s": 0.1, "m.ttft_p99_ms": lat + seed - 1.5, "config": "{}"}
    d = tmp_path / "sweep"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist([row(r, s) for r in (2, 4, 8) for s in (1, 2)]), d / "part-1-a.parquet")
    pq.write_table(pa.Table.from_pylist([row(5.5, 1), row(5.5, 2), row(8.0, 1)]), d / "part-2-b.parquet")
    sweep = load_input(str(d))
    assert sweep.table.num_rows == 8
    assert sorted(sweep.table.column("workload.rate").to_pylist()) == [2, 2, 4, 4, 5.5, 5.5, 8, 8]
    _, notes = figures.latency_rate_figure(sweep)
    assert notes == ["p99 TTFT (ms), sweep: knee at rate 8 (640.0 ms, more than 2x the lowest-rate value)"]
    res = _cli("report", d, "--out", tmp_path / "rep")
    assert res.exit_code == 0, res.output
    assert "sweep: knee at rate 8 (640.0 ms" in (tmp_path / "rep" / "index.html").read_text()


def test_absent_data_gives_no_figure(tmp_path):
    assert not figures.has_data(Figure())
    (tmp_path / "plan.json").write_text(json.dumps([{"gpus": 1, "goodput_rps": None}]))
    assert figures.pareto_figure(load_input(str(tmp_path / "plan.json"))) is None


def test_only_results_gives_only_cdfs(inputs, tmp_path):
    res = _cli("report", inputs["results"], "--out", f"{tmp_path / 'r'}/")   # a trailing slash
    assert res.exit_code == 0, res.output
    assert [p.name for p in (tmp_path / "r" / "figures").iterdir()] == ["latency_cdf.png"]
    assert "1 figure from 1 input" in res.stdout
    assert res.stdout.splitlines()[0].startswith(f"{tmp_path / 'r' / 'figures' / 'latency_cdf.png'}  ")


def test_same_bytes_twice(inputs, report, tmp_path):
    res = _cli("report", *inputs.values(), "--out", tmp_path / "again")
    assert res.exit_code == 0, res.output
    for p in report.rglob("*.*"):
        assert (tmp_path / "again" / p.relative_to(report)).read_bytes() == p.read_bytes(), p


@pytest.mark.parametrize(("make", "needle"), [
    (lambda d: d / "missing.json", "no such file or directory"),
    (lambda d: _write(d / "notes.txt", "hello"), "unknown suffix '.txt'"),
    (lambda d: _write(d / "x.json", '{"a": 1}'), "not a results file"),
    (lambda d: _write(d / "x.json", "{nope"), "not JSON"),
    (lambda d: _write(d / "x.csv", "a,b\n1,2\n"), "not a timeline: missing column(s) t_us"),
    (lambda d: _write(d / "x.parquet", "not parquet"), "not a readable Parquet file"),
    (lambda d: _mkdir(d / "empty"), "not a sweep dataset"),
    # deep nesting was a RecursionError (exit 1, internal error); a bad row is located by line
    (lambda d: _write(d / "deep.json", "[" * 100_000 + "]" * 100_000), "INPUT: not JSON: nested too deeply"),
    (lambda d: _write(d / "deep.jsonl", '{"requestID": 1}\n' + "[" * 100_000 + "]" * 100_000 + "\n"),
     ":2: INPUT: not a --requests-out .jsonl file: nested too deeply"),
    (lambda d: _write(d / "bad.jsonl", '{"requestID": 1}\n\n{nope\n'), ":3: INPUT: not a --requests-out .jsonl file"),
])
def test_bad_inputs_exit_2_one_line(tmp_path, make, needle):
    path = make(tmp_path)
    res = _cli("report", path, "--out", tmp_path / "out")
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    assert needle in res.stderr and str(path) in res.stderr
    assert not (tmp_path / "out").exists()


def test_bad_options_exit_2(inputs, tmp_path):
    res = _cli("report", inputs["plan"], "--out", _write(tmp_path / "file", "x"))
    assert res.exit_code == 2 and "--out" in res.stderr and "not a directory" in res.stderr
    res = _cli("report", inputs["plan"], "--out", tmp_path / "o", "--knee-factor", "1")
    assert res.exit_code == 2 and "--knee-factor" in res.stderr


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _screenshot(page: Path, png: Path) -> np.ndarray:
    from matplotlib.image import imread
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--allow-file-access-from-files", f"--screenshot={png}", "--window-size=1000,2400",
                    page.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    return imread(png)[:, :, :3]


def test_page_renders_in_headless_chromium(report, tmp_path):
    """`make test` installs Chromium (make install-browser), so this test always runs."""
    shot = _screenshot(report / "index.html", tmp_path / "page.png")
    assert shot.shape[:2] == (2400, 1000)
    assert shot.std() > 0.05                                 # not blank
    # the figures are drawn (coloured pixels: the page's own text is black and grey, its
    # links blue); without the PNGs next to the page, they are not
    colour = lambda img: int(((img.max(axis=2) - img.min(axis=2)) > 0.3).sum())  # noqa: E731
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(report / "index.html", bare / "index.html")
    without = _screenshot(bare / "index.html", tmp_path / "bare.png")
    assert colour(shot) > 10_000 and colour(shot) > 3 * colour(without)


def test_report_package_never_imports_the_cli():
    import ast
    for path in Path(figures.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("blis_simpy.cli") for n in names), path


_PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images].map(i => [i.getAttribute('src'), i.naturalWidth,
    i.naturalHeight, i.width, i.height, Math.round(i.getBoundingClientRect().top)].join(' '));
  const tables = [...document.querySelectorAll('table.summary')].map(t =>
    [t.closest('div').previousElementSibling.id, t.rows.length, Math.round(t.getBoundingClientRect().top)].join(' '));
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = imgs.join('\\n') + '\\n--\\n' + tables.join('\\n');
  document.body.appendChild(pre);
});
</script>"""


def test_page_layout_in_headless_chromium(tmp_path):
    """The page as Chromium lays it out: the summary tables come first (a plan's answer, why
    its deployments failed, the sweep summary), and every figure is drawn at its own size.
    The page has no script: the test adds one to a copy, and reads the DOM it leaves."""
    from tests.report.test_figures import write_plan, write_sweep
    plan, sweep = write_plan(tmp_path / "plan.json"), write_sweep(tmp_path / "sweep")
    out = tmp_path / "rep"
    res = _cli("report", plan, sweep, "--out", out)
    assert res.exit_code == 0, res.output
    page = (out / "index.html").read_text()
    assert "<script" not in page
    (out / "probe.html").write_text(page.replace("</body>", _PROBE + "</body>"))
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                          "--allow-file-access-from-files", "--virtual-time-budget=10000",
                          "--window-size=1000,2400", "--dump-dom", (out / "probe.html").resolve().as_uri()],
                         check=True, capture_output=True, timeout=120, text=True).stdout
    probe = dom.split('<pre id="probe">')[1].split("</pre>")[0]
    imgs, tables = (part.strip().splitlines() for part in probe.split("--"))
    sizes = {}
    for line in imgs:
        src, nw, nh, w, h, top = line.split()
        sizes[src] = (int(nw), int(nh), int(w), int(h), int(top))
    # 9 x 5 inches at 100 dpi, shown at their own size (the page is 1000 px wide)
    assert {s: v[:4] for s, v in sizes.items()} == {
        "figures/latency_vs_rate_sweep.png": (900, 500, 900, 500),
        "figures/slo_heatmap_sweep.png": (900, 500, 900, 500),
        "figures/pareto_plan.png": (900, 500, 900, 500)}
    rows = [t.split() for t in tables]
    assert [(r[0], int(r[1])) for r in rows] == [("plan-plan", 4), ("failed-plan", 4),
                                                 ("sweep-sweep", 13)]
    first_figure = min(v[4] for v in sizes.values())
    assert all(int(r[2]) < first_figure for r in rows)
