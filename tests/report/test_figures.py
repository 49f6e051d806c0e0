"""The report's figures, inspected as matplotlib objects before they are saved (issue 23,
finding 3): every axis numbered and labelled with plain numbers, legends outside the data,
SLO thresholds drawn, bands across seeds, a log Pareto axis with the failing deployments
marked and labels that do not overlap, a heat map whose colours tell an overloaded cell
from a passing one, the prefill instance's activity in the PD figure, and the summary
tables. Inputs are small and hand-made; the expected values are worked out below."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from blis_simpy.report import figures, style
from blis_simpy.report.inputs import load_input
from blis_simpy.report.summary import summary_tables

RATES = (4, 8, 12, 16, 20, 24)


def _lat(inst: int, rate: int) -> float:
    """p99 TTFT (ms) of the hand-made sweep: 100 up to 8 req/s per instance, then
    1000 x (rate per instance / 8): one instance 100, 100, 1500, 2000, 2500, 3000 (knee at
    12: > 2 x 100); two instances 100 up to 16, then 1250, 1500 (knee at 20)."""
    per = rate / inst
    return 100.0 if per <= 8 else 1000.0 * per / 8


def write_sweep(path: Path) -> Path:
    """Rates x 1 or 2 instances x seeds 1 and 2: seed 1 is 10 ms below :func:`_lat`, seed 2
    10 ms above (mean = _lat, band = _lat -/+ 10); p99 E2E 5,000 + 10 x that (within one
    decade: the old log axis labelled it "2×10⁴", wide enough to reach the next panel). SLO attainment 100 %, except one
    instance at 24 req/s (overloaded: 3 req/s completed of 24) at 99.5 %. The SLO's TTFT
    threshold is 500 ms."""
    rows = []
    for inst in (1, 2):
        for rate in RATES:
            for seed, d in ((1, -10.0), (2, 10.0)):
                lat = _lat(inst, rate) + d
                rows.append({
                    "config_hash": f"h{inst}-{rate}-{seed}", "config_key": f"k{inst}-{rate}",
                    "seed": seed, "command": "run", "workload.rate": float(rate),
                    "cluster.num_instances": inst, "status": "ok", "error": "", "wall_s": 0.1,
                    "m.ttft_p99_ms": lat, "m.e2e_p99_ms": 5000 + 10 * lat,
                    "m.responses_per_sec": min(rate, 8.0 * inst) / (1 if rate < 24 else 2.7),
                    "slo.ttft_ms": 500.0,
                    "slo.attainment_pct.all": 99.5 if (inst, rate) == (1, 24) else 100.0,
                    "config": "{}"})
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path / "part-1-a.parquet")
    return path


#: a `plan --out` document: the passing deployments' p99 TTFT is 90-140 ms, the failing
#: ones' reaches 38,000 and 473,000 ms; SLO p99 TTFT <= 150 ms
DEPLOYMENTS = [
    ("1 inst x H100 TP1", 1, 473_000.0, False, "ttft_p99_ms 473000 > 150"),
    ("2 inst x H100 TP1", 2, 38_000.0, False, "ttft_p99_ms 38000 > 150"),
    ("1P:1D x H100 TP1", 2, 140.0, False, "itl_p99_ms 31.2 > 25"),
    ("2P:1D x H100 TP1", 3, 130.0, True, ""),
    ("1 inst x H100 TP4", 4, 120.0, True, ""),
    ("1P:1D x H100 TP2", 4, 118.0, True, ""),
    ("3 inst x H100 TP1", 3, 128.0, True, ""),
    ("1P:2D x H100 TP2", 6, 95.0, True, ""),
    ("2 inst x H100 TP4", 8, 90.0, True, ""),
]


def _pick(label: str, gpus: int, ttft: float) -> dict:
    return {"deployment": {"label": label, "gpus": gpus}, "gpus": gpus, "cost": float(gpus),
            "meets": True, "goodput_rps": 29.5,
            "metrics": {"ttft_p99_ms": ttft, "itl_p99_ms": 20.0, "e2e_p99_ms": 5000.0}}


def write_plan(path: Path) -> Path:
    doc = {"format": "blis-simpy-plan", "version": 1,
           "plan": {"model": "qwen/qwen3-14b", "cost_unit": "gpus", "seeds": [42],
                    "workload": {"rate": 30.0},
                    "slo": {"ttft_p99_ms": 150.0, "itl_p99_ms": 25.0, "min_completed_fraction": 0.99}},
           "cheapest": {"method": "branch_and_bound", "runs": 9, "cross_product_runs": 40,
                        "winner": _pick("2P:1D x H100 TP1", 3, 130.0),
                        "runner_ups": [_pick("3 inst x H100 TP1", 3, 128.0),
                                       _pick("1 inst x H100 TP4", 4, 120.0)]},
           "max_rate": {"deployment": {"label": "2P:1D x H100 TP1"}, "sustained_rate": 34.25,
                        "failing_rate": 35.0},
           "deployments": [{"label": lab, "gpus": g, "cost_per_hour_usd": None, "ttft_p99_ms": t,
                            "goodput_rps": 1.0, "meets_slo": ok} for lab, g, t, ok, _ in DEPLOYMENTS],
           "points": [{"id": i, "phase": "search", "deployment": {"label": lab, "gpus": g},
                       "rate": 30.0, "seed": 42, "status": "ok", "error": "", "meets": ok,
                       "why_not": why, "gpus": g} for i, (lab, g, _, ok, why) in enumerate(DEPLOYMENTS)]}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("figs")
    res = CliRunner().invoke(app, [str(a) for a in (
        "run", "--model", "qwen/qwen3-14b", "--hardware", "H100", "--tp", "1", "--latency-model",
        "roofline", "--format", "json", "--num-requests", "60", "--rate", "20", "--slo-ttft", "60",
        "--slo-e2e", "4000", "--num-instances", "3", "--prefill-instances", "1",
        "--decode-instances", "2", "--pd-decider", "always", "--results-path", d / "results.json",
        "--timeline", d / "timeline.csv", "--timeline-interval-ms", "20")])
    assert res.exit_code == 0, res.output
    paths = [d / "results.json", d / "timeline.csv", write_sweep(d / "sweep"), write_plan(d / "plan.json")]
    inputs = [load_input(str(p)) for p in paths]
    return {"dir": d, "inputs": inputs, "specs": {s.name: s for s in figures.build_figures(inputs)}}


def _ticklabels(ax, which: str) -> list[str]:
    """The visible, non-empty major tick labels of one axis within its view."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(axis.get_view_interval())
    out = []
    for t in axis.get_ticklabels():
        pos = t.get_position()[0 if which == "x" else 1]
        if t.get_visible() and t.get_text() and lo <= pos <= hi:
            out.append(t.get_text())
    return out


def _renderer(fig):
    """Lay ``fig`` out and return its renderer (an Agg canvas attached when it has none)."""
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


def _data_axes(fig):
    return [ax for ax in fig.get_axes() if ax.get_label() != "<colorbar>"]


def test_every_axis_has_plain_numbered_ticks_and_a_label(made):
    assert set(made["specs"]) == {"latency_cdf", "timeline_timeline", "pd_transfers_timeline",
                                  "latency_vs_rate_sweep", "slo_heatmap_sweep", "pareto_plan"}
    for name, spec in made["specs"].items():
        spec.fig.draw_without_rendering()
        for ax in _data_axes(spec.fig):
            for which in "xy":
                labels = _ticklabels(ax, which)
                assert len(labels) >= 2, (name, which, labels)
                # plain numbers: "400", "2,000", never "4×10²" (mathtext)
                assert not any("$" in s or "10^" in s for s in labels), (name, which, labels)
            assert ax.get_xlabel() and ax.get_ylabel(), name


def test_log_ticks_are_numbered_and_not_crowded():
    assert style.log_ticks(15, 95) == [20.0, 50.0]                  # 1-9 would be 8 ticks
    assert style.log_ticks(21, 99) == [30.0, 50.0, 70.0, 90.0]      # 1-2-5: only 50; thinned
    assert style.log_ticks(30, 20_000, 5) == [100.0, 1000.0, 10_000.0]
    assert style.log_ticks(50, 3_000, 6) == [50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]
    assert style.log_ticks(50, 3_000, 5) == [100.0, 300.0, 1000.0, 3000.0]
    assert style.log_ticks(12, 16) == [12.0, 16.0]
    assert [style.plain(v) for v in (400, 2000, 0.5, 473_000)] == ["400", "2,000", "0.5", "473,000"]


def _no_overlap(fig) -> None:
    """Every legend of ``fig`` lies outside every data axes."""
    r = _renderer(fig)
    assert all(ax.get_legend() is None for ax in fig.get_axes())
    for leg in fig.legends:
        box = leg.get_window_extent(r)
        for ax in _data_axes(fig):
            assert not box.overlaps(ax.get_window_extent(r))


def test_legends_are_outside_the_data(made):
    with_legend = [n for n, s in made["specs"].items() if s.fig.legends]
    assert set(with_legend) == set(made["specs"])
    for spec in made["specs"].values():
        _no_overlap(spec.fig)


def test_panels_do_not_overlap(made):
    """Constrained layout: no panel's labels reach into the next panel."""
    fig = made["specs"]["latency_vs_rate_sweep"].fig
    r = _renderer(fig)
    boxes = [ax.get_tightbbox(r) for ax in _data_axes(fig)]
    assert len(boxes) == 2                  # TTFT and E2E (the sweep has no ITL column)
    for a, b in zip(boxes, boxes[1:], strict=False):
        assert a.x1 <= b.x0


def test_latency_vs_rate_draws_the_slo_and_the_seed_band(made):
    ax = made["specs"]["latency_vs_rate_sweep"].fig.get_axes()[0]       # p99 TTFT
    assert ax.get_yscale() == "log"
    slo = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert [list(ln.get_ydata()) for ln in slo] == [[500.0, 500.0]]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2                                # one per instance count
    verts = bands[0].get_paths()[0].vertices              # one instance: _lat -/+ 10
    want = {(float(r), _lat(1, r) + d) for r in RATES for d in (-10.0, 10.0)}
    assert {(float(x), float(y)) for x, y in verts} == want
    e2e = made["specs"]["latency_vs_rate_sweep"].fig.get_axes()[1]
    assert not [ln for ln in e2e.get_lines() if ln.get_linestyle() == "--"]   # no e2e SLO


def test_cdf_draws_the_runs_slo_thresholds(made):
    axes = made["specs"]["latency_cdf"].fig.get_axes()
    got = {ax.get_title(): [ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_linestyle() == "--"]
           for ax in axes}
    assert got == {"TTFT": [60.0], "ITL (mean per request)": [], "E2E": [4000.0]}


def test_pareto_is_log_marks_failures_and_labels_do_not_overlap(made):
    fig = made["specs"]["pareto_plan"].fig
    ax = fig.get_axes()[0]
    assert ax.get_yscale() == "log"
    lo, hi = ax.get_ylim()
    assert lo < 90 and hi > 473_000
    colls = {c.get_label(): c for c in ax.collections}
    failing = colls["misses the SLOs"]
    assert sorted(float(y) for _, y in failing.get_offsets()) == [140.0, 38_000.0, 473_000.0]
    assert failing.get_facecolor()[0][:3].tolist() != colls["meets the SLOs"].get_facecolor()[0][:3].tolist()
    assert [tuple(map(float, p)) for p in colls["winner: 2P:1D x H100 TP1"].get_offsets()] == [(3.0, 130.0)]
    slo = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert [list(ln.get_ydata()) for ln in slo] == [[150.0, 150.0]]
    # the front of the passing ones: 3 GPUs at 128 ms, 4 at 118, 6 at 95, 8 at 90
    texts = [t for t in ax.texts]
    assert sorted(t.get_text() for t in texts) == sorted(
        ["3 inst x H100 TP1", "1P:1D x H100 TP2", "1P:2D x H100 TP2", "2 inst x H100 TP4"])
    r = _renderer(fig)
    boxes = [t.get_window_extent(r) for t in texts]
    frame = ax.get_window_extent(r)
    for i, a in enumerate(boxes):
        assert frame.x0 <= a.x0 and a.x1 <= frame.x1 and frame.y0 <= a.y0 and a.y1 <= frame.y1
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)


def test_heatmap_colours_tell_overload_from_passing(made):
    fig = made["specs"]["slo_heatmap_sweep"].fig
    ax = _data_axes(fig)[0]
    im = ax.images[0]
    rgba = lambda v: im.cmap(im.norm(v))                      # noqa: E731
    over, ok = rgba(99.5), rgba(100.0)                        # 1 inst at 24 req/s; 2 at 4
    assert sum(abs(a - b) for a, b in zip(over[:3], ok[:3], strict=True)) > 0.3
    assert im.norm(99.0) == pytest.approx(0.5)                # centred on the 99 % target
    assert rgba(90.0)[0] > rgba(90.0)[1]                      # below the target: red
    # saturated: at or past the knee (12 req/s with one instance, 20 with two); x = rate
    # index, y = instance index
    hatched = sorted((p.get_x() + 0.5, p.get_y() + 0.5) for p in ax.patches
                     if p.get_gid() == "saturated")
    assert hatched == sorted([(j, 0) for j in (2, 3, 4, 5)] + [(4, 1), (5, 1)])
    notes = made["specs"]["slo_heatmap_sweep"].notes
    assert notes[0].startswith("saturated: workload.rate=12.0, cluster.num_instances=1")


def test_pd_figure_shows_the_prefill_instances_activity(made):
    """The finding: the prefill pool's running count is 0 at every sample, because a
    prefill-only request leaves `running` when its only step begins (BLIS's bookkeeping at
    step begin). Its engine steps show the work."""
    fig = made["specs"]["pd_transfers_timeline"].fig
    running_ax, steps_ax = fig.get_axes()[1], fig.get_axes()[2]
    lines = {ln.get_label(): ln for ln in running_ax.get_lines()}
    assert max(lines["prefill pool (1)"].get_ydata()) == 0
    assert max(lines["decode pool (2)"].get_ydata()) > 0
    steps = {ln.get_label(): ln for ln in steps_ax.get_lines()}
    assert max(steps["prefill pool (1)"].get_ydata()) > 0
    assert steps_ax.get_ylabel().startswith("engine steps / s")


def test_steps_per_second_between_samples():
    assert figures._steps_per_s([0, 50_000, 100_000], [0, 1, 3]) == ([0.0, 0.05], [20.0, 40.0])
    t = list(range(0, 201_000, 1_000))           # 201 samples: windows of 2 samples
    ts, rates = figures._steps_per_s(t, [k // 2 for k in range(201)])
    assert len(ts) == 100 and set(rates) == {500.0} and ts[:2] == [0.0, 0.002]


def test_a_timeline_without_the_steps_column_still_reads(made, tmp_path):
    src = made["dir"] / "timeline.csv"
    lines = src.read_text().splitlines()
    (tmp_path / "old.csv").write_text("\n".join(ln.rsplit(",", 1)[0] for ln in lines) + "\n")
    old = load_input(str(tmp_path / "old.csv"))
    assert "steps" not in old.table.column_names
    fig = figures.transfer_figure(old)
    assert len(fig.get_axes()) == 2 and figures.has_data(fig)


def test_summary_tables(made):
    tables = {t.anchor: t for t in summary_tables(made["inputs"])}
    assert list(tables) == ["plan-plan", "failed-plan", "sweep-sweep"]
    answer = tables["plan-plan"]
    assert answer.rows == [
        ["winner", "2P:1D x H100 TP1", "3", "3 GPUs", "130", "20", "5,000", "29.5"],
        ["runner-up 1", "3 inst x H100 TP1", "3", "3 GPUs", "128", "20", "5,000", "29.5"],
        ["runner-up 2", "1 inst x H100 TP4", "4", "4 GPUs", "120", "20", "5,000", "29.5"]]
    assert "SLO: ttft_p99_ms <= 150, itl_p99_ms <= 25, completed >= 99% of offered" in answer.note
    assert "sustains 34.25 req/s within the SLOs (fails at 35)" in answer.note
    assert tables["failed-plan"].rows == [
        ["1 inst x H100 TP1", "1", "30", "42", "search", "ttft_p99_ms 473000 > 150"],
        ["2 inst x H100 TP1", "2", "30", "42", "search", "ttft_p99_ms 38000 > 150"],
        ["1P:1D x H100 TP1", "2", "30", "42", "search", "itl_p99_ms 31.2 > 25"]]
    sweep = tables["sweep-sweep"]
    assert sweep.header == ["rate", "num_instances", "seeds", "TTFT p99 ms",
                            "E2E p99 ms", "req/s", "SLO met %"]
    # two seeds 10 ms either side of the mean: half the 95 % CI is t(0.975, 1) x 10 = 127.06
    assert sweep.rows[0] == ["4.0", "1", "2", "100 ± 127", "6,000 ± 1,271", "4", "100"]
    assert sweep.rows[-1][:5] == ["24.0", "2", "2", "1,500 ± 127", "20,000 ± 1,271"]


def test_a_plain_deployment_list_is_tabled_passing_and_cheapest_first(tmp_path):
    deps = [{"label": "slow", "gpus": 1, "cost_per_hour_usd": 2.5, "ttft_p99_ms": 3000, "meets_slo": False},
            {"label": "b", "gpus": 2, "cost_per_hour_usd": 5.0, "ttft_p99_ms": 300, "meets_slo": True},
            {"label": "a", "gpus": 1, "cost_per_hour_usd": 2.5, "ttft_p99_ms": 900, "meets_slo": True}]
    (tmp_path / "p.json").write_text(json.dumps(deps))
    (table,) = summary_tables([load_input(str(tmp_path / "p.json"))])
    assert [r[0] for r in table.rows] == ["a", "b", "slow"]
    assert table.rows[0] == ["a", "1", "2.5", "900", "-", "yes"]


def test_a_hand_edited_plan_document_still_gives_tables(tmp_path):
    """Wrong types where the plan document has mappings and lists: no crash, '-' cells."""
    doc = {"plan": [], "cheapest": {"winner": "x", "runner_ups": {"a": 1}, "runs": 3},
           "max_rate": {"deployment": "y"},
           "points": [1, {"deployment": "z", "meets": False, "why_not": 3, "rate": [1]}],
           "deployments": [{"label": "a", "gpus": 1, "ttft_p99_ms": 100, "meets_slo": True}]}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    inp = load_input(str(tmp_path / "p.json"))
    answer, failed = summary_tables([inp])
    assert answer.rows == [["winner", "", "-", "-", "-", "-", "-", "-"]]
    assert failed.rows == [["", "-", "-", "", "", "3"]]
    assert figures.pareto_figure(inp) is not None
