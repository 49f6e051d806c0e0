"""Cohorts, inference-perf expansion and ServeGen loading (docs/workloads.md)."""

from __future__ import annotations

import json
import logging

import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.workload import WorkloadSpecV2, generate_requests, generate_workload
from blis_simpy.workload.expand import (
    HOUR_US,
    cohort_windows,
    diurnal_factor,
    diurnal_windows,
    drain_windows,
    expand_cohort,
    expand_inference_perf,
    load_servegen,
    parse_py_dict,
)
from blis_simpy.workload.spec import CohortSpec, DiurnalSpec, DrainSpec

CONST = lambda v: {"type": "constant", "params": {"value": v}}  # noqa: E731


def cohort(**kw) -> dict:
    c = {"id": "pop", "population": 3, "tenant_id": "t", "slo_class": "batch", "model": "m",
         "rate_fraction": 0.6, "arrival": {"process": "poisson"}, "input_distribution": CONST(20),
         "output_distribution": CONST(4), "prefix_group": "g", "streaming": True}
    c.update(kw)
    return c


def spec(**kw) -> WorkloadSpecV2:
    return WorkloadSpecV2.model_validate({"version": "2", "seed": 3, "aggregate_rate": 10.0, **kw})


# ---------------------------------------------------------------------------- cohorts
def test_diurnal_factor_and_windows():
    assert diurnal_factor(5, 5, 4.0) == 1.0
    assert diurnal_factor(17, 5, 4.0) == pytest.approx(0.25)
    assert diurnal_factor(11, 5, 4.0) == pytest.approx(0.625)
    w = diurnal_windows(DiurnalSpec(peak_hour=0, peak_to_trough_ratio=4.0))
    assert len(w) == 24 and all(s == h * HOUR_US for h, (s, _) in enumerate(w))
    assert w[0] == (0, HOUR_US)                                   # peak: the whole hour
    assert w[12] == (12 * HOUR_US, 12 * HOUR_US + 900_000_000)   # trough: 1/R of it
    assert w[6] == (6 * HOUR_US, 6 * HOUR_US + 2_250_000_000)    # m = 0.625
    assert w[23][1] <= 24 * HOUR_US                               # first 24 h only (D8)
    flat = diurnal_windows(DiurnalSpec(peak_hour=7, peak_to_trough_ratio=1.0))
    assert all(e - s == HOUR_US for s, e in flat)                # R = 1: always on


def test_spike_and_drain_windows():
    assert cohort_windows(CohortSpec.model_validate(cohort(spike={"start_time_us": 500, "duration_us": 70}))) \
        == [(500, 570)]
    assert drain_windows(DrainSpec(start_time_us=1000, ramp_duration_us=100)) == [
        (0, 1000)] + [(1000 + 10 * i, 1000 + 10 * i + 10 - i) for i in range(10)]
    # ramp/10 and the active parts truncate; no [0, start) window for start 0
    assert drain_windows(DrainSpec(start_time_us=0, ramp_duration_us=105))[:3] == [
        (0, 10), (10, 19), (20, 28)]
    both = CohortSpec.model_validate(cohort(spike={"start_time_us": 5, "duration_us": 1},
                                            drain={"start_time_us": 0, "ramp_duration_us": 10},
                                            diurnal={"peak_hour": 3, "peak_to_trough_ratio": 2}))
    w = cohort_windows(both)
    assert len(w) == 24 + 1 + 10 and w[24] == (5, 6)             # diurnal, spike, drain
    assert cohort_windows(CohortSpec.model_validate(cohort())) is None


def test_cohort_expansion_fields():
    cl = expand_cohort(CohortSpec.model_validate(cohort(spike={"start_time_us": 0, "duration_us": 9})))
    assert [c.id for c in cl] == ["pop-0", "pop-1", "pop-2"]
    for c in cl:
        assert c.rate_fraction == pytest.approx(0.2)
        assert (c.tenant_id, c.slo_class, c.model, c.prefix_group, c.streaming) == ("t", "batch", "m", "g", True)
        assert c.prefix_length == 0 and c.timeout is None and c.reasoning is None and c.multimodal is None
        assert [(w.start_us, w.end_us) for w in c.lifecycle.windows] == [(0, 9)]


def test_cohort_generation_follows_client_order_windows_and_rates():
    s = spec(num_requests=0, clients=[{"id": "solo", "rate_fraction": 0.4, "arrival": {"process": "poisson"},
                                       "input_distribution": CONST(7), "output_distribution": CONST(2)}],
             cohorts=[cohort(spike={"start_time_us": 0, "duration_us": 3_000_000})])
    reqs = generate_requests(s, horizon=6_000_000)
    pop = [r for r in reqs if r.client_id.startswith("pop-")]
    solo = [r for r in reqs if r.client_id == "solo"]
    assert {r.client_id for r in pop} == {"pop-0", "pop-1", "pop-2"}
    assert all(r.arrival_us < 3_000_000 for r in pop)           # spike window only
    assert max(r.arrival_us for r in solo) > 3_000_000
    assert len(pop) == pytest.approx(6 * 3, rel=0.5) and len(solo) == pytest.approx(4 * 6, rel=0.5)
    assert all(r.prefix_length == 50 and r.input_len == 70 for r in pop)   # default prefix 50
    assert all(r.slo_class == "batch" and r.streaming for r in pop)


def test_diurnal_cohort_generates_only_in_active_parts_of_the_first_day():
    c = cohort(population=1, rate_fraction=1.0, diurnal={"peak_hour": 0, "peak_to_trough_ratio": 1000.0},
               arrival={"process": "constant"})
    reqs = generate_requests(spec(aggregate_rate=0.01, num_requests=0, cohorts=[c]), horizon=30 * HOUR_US)
    hours = [r.arrival_us // HOUR_US for r in reqs]
    assert reqs and max(hours) < 24                                # nothing after 24 h
    for r in reqs:
        h = r.arrival_us // HOUR_US
        assert r.arrival_us - h * HOUR_US < int(HOUR_US * diurnal_factor(h, 0, 1000.0))
    # one arrival every 100 s: the peak hour keeps 100 s … 3500 s; hour 10 (active 244.5 s)
    # three, hour 11 (64.9 s) and the trough hour 12 (3.6 s) only the one at their start
    assert [hours.count(h) for h in (0, 10, 11, 12)] == [35, 3, 1, 1]


# ---------------------------------------------------------------------------- inference-perf
def ip(stages, *, n=2, m=3, multi=False, **kw):
    return spec(inference_perf={"stages": stages, "shared_prefix": {
        "num_unique_system_prompts": n, "num_users_per_system_prompt": m, "system_prompt_len": 30,
        "question_len": 12, "output_len": 5, "enable_multi_turn_chat": multi}}, **kw)


def test_inference_perf_single_stage():
    e = expand_inference_perf(ip([{"rate": 6.0, "duration": 10}], aggregate_rate=0.0))
    assert e.aggregate_rate == 6.0 and e.inference_perf is None
    assert [c.id for c in e.clients] == [f"prompt-{p}-user-{u}" for p in range(2) for u in range(3)]
    for c in e.clients:
        p = c.id.split("-")[1]
        assert (c.tenant_id, c.prefix_group, c.prefix_length) == (f"prompt-{p}",) * 2 + (30,)
        assert c.slo_class == "batch" and c.arrival.process == "poisson" and c.lifecycle is None
        assert c.rate_fraction == pytest.approx(1 / 6) and c.reasoning is None
        assert c.input_distribution.params == {"value": 12.0}
        assert c.output_distribution.params == {"value": 5.0}


def test_inference_perf_stages_windows_and_rate_override(caplog):
    with caplog.at_level(logging.WARNING):
        e = expand_inference_perf(ip([{"rate": 4.0, "duration": 2.5}, {"rate": 8.0, "duration": 1}]))
    assert "overridden" in caplog.text and e.aggregate_rate == 12.0
    assert len(e.clients) == 12
    assert e.clients[0].id == "stage-0-prompt-0-user-0" and e.clients[-1].id == "stage-1-prompt-1-user-2"
    win = {c.id.split("-prompt")[0]: [(w.start_us, w.end_us) for w in c.lifecycle.windows] for c in e.clients}
    assert win == {"stage-0": [(0, 2_500_000)], "stage-1": [(2_500_000, 3_500_000)]}
    assert {round(c.rate_fraction, 9) for c in e.clients} == {round(4 / 6, 9), round(8 / 6, 9)}
    reqs = generate_requests(ip([{"rate": 40.0, "duration": 1}, {"rate": 80.0, "duration": 1}],
                                num_requests=0), horizon=5_000_000)
    s0 = [r for r in reqs if r.client_id.startswith("stage-0")]
    s1 = [r for r in reqs if r.client_id.startswith("stage-1")]
    assert all(r.arrival_us < 1_000_000 for r in s0) and all(1_000_000 <= r.arrival_us < 2_000_000 for r in s1)
    assert len(s0) == pytest.approx(40, rel=0.4) and len(s1) == pytest.approx(80, rel=0.4)
    assert all(r.input_len == 42 and r.output_len == 5 for r in reqs)


def test_inference_perf_multi_turn_chat():
    e = expand_inference_perf(ip([{"rate": 3.0, "duration": 7}], multi=True))
    assert e.category == "reasoning"
    mt = e.clients[0].reasoning.multi_turn
    # max_rounds = ceil(3 · 7 / 6) = 4; think = int(6 / 3 · 1e6)
    assert (mt.max_rounds, mt.think_time_us, mt.context_growth, mt.single_session) == (4, 2_000_000, "", True)
    assert e.clients[0].reasoning.reason_ratio_distribution.params == {"value": 0.0}
    wl = generate_workload(ip([{"rate": 3.0, "duration": 7}], multi=True, num_requests=100))
    assert len(wl.blueprints) == len(wl.requests) == 6            # one closed-loop session each
    assert {b.client_id for b in wl.blueprints} == {c.id for c in e.clients}
    assert all(b.max_rounds == 4 and b.think_time_us == 2_000_000 for b in wl.blueprints)


# ---------------------------------------------------------------------------- ServeGen
def _servegen(tmp_path):
    d = tmp_path / "sg"
    d.mkdir()
    pdf_in = "{100: 0.25, 200: 0.75}"
    pdf_out = "{10: np.float64(1.0)}"
    (d / "chunk-7-trace.csv").write_text(
        "start_s,rate,cv,pattern\n0,2.0,2.5,Gamma(a)\n600,5.0,0.5,Weibull\nbad,row\n1200,9.0,3.0,Gamma\n")
    (d / "chunk-7-dataset.json").write_text(json.dumps({
        "1200": {"input_tokens": "{999: 1.0}", "output_tokens": "{1: 1.0}"},
        "600": {"input_tokens": pdf_in, "output_tokens": pdf_out},
        "0": {"input_tokens": pdf_in}}))
    (d / "chunk-2-trace.csv").write_text("0,0.0,1,x\n")                 # rate 0: skipped
    (d / "chunk-3-trace.csv").write_text("0,4.0,1,Poisson\n")           # no dataset: skipped
    (d / "chunk-1-trace.csv").write_text("0,1.5,1,Exponential\n")
    (d / "chunk-1-dataset.json").write_text(json.dumps({"0": {"input_tokens": "{64: 1}",
                                                               "output_tokens": "{8: 1}"}}))
    return d


def test_parse_py_dict():
    assert parse_py_dict("{128: 0.5, 256.0: np.float64(0.25), 3: 1e-1}") == {
        "128": 0.5, "256.0": 0.25, "3": 0.1}


def test_servegen_chunks_span_and_skips(tmp_path, caplog):
    d = _servegen(tmp_path)
    with caplog.at_level(logging.WARNING):
        e = load_servegen(spec(servegen_data={"path": str(d), "span_start": 0, "span_end": 1000}))
    assert "bad ServeGen row" in caplog.text and "chunk 3" in caplog.text
    assert [c.id for c in e.clients] == ["servegen-chunk-1", "servegen-chunk-7"]   # sorted names
    c1, c7 = e.clients
    assert (c7.tenant_id, c7.rate_fraction) == ("chunk-7", 5.0)     # best rate inside [0, 1000)
    assert (c7.arrival.process, c7.arrival.cv) == ("weibull", 0.5)
    assert c7.input_distribution.type == "empirical"
    assert c7.input_distribution.params == {"100": 0.25, "200": 0.75}   # first window with both PDFs
    assert (c1.arrival.process, c1.rate_fraction) == ("poisson", 1.5)
    open_end = load_servegen(spec(servegen_data={"path": str(d), "span_start": 0, "span_end": 0}))
    c7 = open_end.clients[1]
    assert (c7.rate_fraction, c7.arrival.process, c7.arrival.cv) == (9.0, "gamma", 3.0)
    reqs = generate_requests(spec(servegen_data={"path": "sg", "span_end": 1000}, num_requests=400),
                             base_dir=str(tmp_path))
    r7 = [r for r in reqs if r.client_id == "servegen-chunk-7"]
    assert {r.input_len for r in r7} == {100, 200} and {r.output_len for r in r7} == {10}
    assert len(r7) / len(reqs) == pytest.approx(5 / 6.5, abs=0.08)


def test_servegen_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such directory") as ei:
        generate_requests(spec(servegen_data={"path": str(tmp_path / "nope")}, num_requests=5))
    assert ei.value.field == "servegen_data.path"
    with pytest.raises(ConfigError, match="no chunk"):
        generate_requests(spec(servegen_data={"path": str(tmp_path)}, num_requests=5))
