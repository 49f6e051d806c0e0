"""SLO attainment, goodput, deployment cost and the distribution mode's arrival processes
(docs/metrics.md, "SLOs and goodput", "Deployment and cost"; docs/workloads.md, "Arrival
processes"): the library pieces on hand-made inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from blis_simpy.catalog.hardware import builtin_gpus, gpu_catalog, read_hardware_json
from blis_simpy.errors import ConfigError
from blis_simpy.metrics.cost import deployment_cost
from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.metrics.slo import SLOSpec, SLOTally, SLOTargets, slo_report, tally_metrics
from blis_simpy.workload import distribution_spec, generate_requests


class _Row:
    def __init__(self, slo_class: str):
        self.slo_class = slo_class


def _record() -> InstanceMetrics:
    """Four completed requests (µs): two ``interactive``, one ``batch``, one without a class;
    a fifth (``batch``) has a TTFT but no E2E: it did not complete."""
    m = InstanceMetrics("cluster")
    rows = {"a": ("interactive", 2_000, 1_000.0, 3_000), "b": ("interactive", 3_000, 1_500.0, 5_000),
            "c": ("batch", 4_000, 1_000.0, 8_000), "d": ("", 5_000, 0.0, 13_000)}
    for rid, (cls, ttft, itl, e2e) in rows.items():
        m.registry[rid] = _Row(cls)
        m.ttft[rid], m.itl[rid], m.e2e[rid] = ttft, itl, e2e
    m.registry["e"] = _Row("batch")
    m.ttft["e"] = 1_000
    m.sim_ended_time = 2_000_000
    return m


def test_targets_are_inclusive_and_unset_targets_are_met():
    t = SLOTargets(ttft_ms=2.0, itl_ms=None, e2e_ms=3.0)
    assert t.meets(2_000, 9e9, 3_000) == (True, True, True)
    assert t.meets(2_001, 0.0, 3_001) == (False, True, False)
    assert t.meets(None, 0.0, 1) == (False, True, True)          # no TTFT: a TTFT target fails


def test_attainment_over_offered_requests_hand_checked():
    spec = SLOSpec(SLOTargets(ttft_ms=3.5, itl_ms=1.2, e2e_ms=10.0))
    m = _record()
    # a: meets all; b: ITL 1.5 > 1.2; c: TTFT 4 > 3.5; d: TTFT 5 and E2E 13 fail
    offered = {"interactive": 2, "batch": 2, "": 1}               # e offered, not completed
    rep = slo_report(spec, tally_metrics(m, spec), offered, m.sim_ended_time / 1e6)
    doc = rep.to_dict()
    assert doc["offered_requests"] == 5 and doc["completed_requests"] == 4
    assert doc["met_requests"] == {"ttft": 2, "itl": 3, "e2e": 3, "all": 1}
    assert doc["attainment_pct"] == {"ttft": 40.0, "itl": 60.0, "e2e": 60.0, "all": 20.0}
    assert doc["goodput_rps"] == 0.5                              # 1 request / 2 s
    assert list(doc["per_class"]) == ["batch", "default", "interactive"]
    batch = doc["per_class"]["batch"]
    assert (batch["offered_requests"], batch["completed_requests"]) == (2, 1)
    assert batch["attainment_pct"] == {"ttft": 0.0, "itl": 50.0, "e2e": 50.0, "all": 0.0}
    assert doc["per_class"]["interactive"]["met_requests"]["all"] == 1
    assert doc["per_class"]["interactive"]["goodput_rps"] == 0.5


def test_class_targets_override_the_defaults_key_by_key():
    spec = SLOSpec(SLOTargets(ttft_ms=3.5, e2e_ms=10.0),
                   {"batch": SLOTargets(ttft_ms=10.0), "default": SLOTargets(e2e_ms=20.0)})
    assert spec.targets_for("batch") == SLOTargets(10.0, None, 10.0)
    assert spec.targets_for("") == SLOTargets(3.5, None, 20.0)     # no class = "default"
    m = _record()
    rep = slo_report(spec, tally_metrics(m, spec), {"interactive": 2, "batch": 2, "": 1}, 2.0)
    # a, b meet the defaults; c meets batch's TTFT 10; d: TTFT 5 > 3.5 fails
    assert rep.overall.met == (3, 4, 4, 3)
    assert rep.per_class["batch"].to_dict()["ttft_ms"] == 10.0
    assert rep.overall.attainment_pct()["itl"] is None           # no request has an ITL target
    assert rep.overall.attainment_pct()["all"] == 60.0


def test_streamed_tally_equals_the_exact_one():
    spec = SLOSpec(SLOTargets(ttft_ms=3.5, itl_ms=1.2, e2e_ms=10.0), {"batch": SLOTargets(ttft_ms=9.0)})
    m = _record()
    exact = tally_metrics(m, spec)
    halves = [SLOTally(), SLOTally()]
    for k, rid in enumerate(sorted(m.e2e)):        # as two instances' collectors would count
        halves[k % 2].add(spec, m.registry[rid].slo_class, m.ttft[rid], m.itl[rid], m.e2e[rid])
    halves[0].merge(halves[1])
    assert halves[0].counts == exact.counts


def test_no_offered_request_gives_zero_not_a_division_error():
    spec = SLOSpec(SLOTargets(ttft_ms=1.0))
    rep = slo_report(spec, SLOTally(), {}, 0.0).to_dict()
    assert rep["attainment_pct"] == {"ttft": 0.0, "itl": None, "e2e": None, "all": 0.0}
    assert rep["goodput_rps"] == 0.0 and rep["per_class"] == {}


# ------------------------------------------------------------------------------ cost
def test_cost_tp_dp_and_pools():
    # 2 engines x TP 2 x DP 2 at $3/GPU-hour, 1,000 output tokens/s
    c = deployment_cost([(4, None), (4, None)], 1000.0, gpu_hour_usd=3.0)
    assert (c.total_gpus, c.gpu_hour_usd, c.cost_per_hour_usd) == (8, 3.0, 24.0)
    assert c.cost_per_million_output_tokens_usd == pytest.approx(24.0 / 3.6)   # $24 per 3.6M tokens
    # PD: 2 prefill instances at TP 1 on a $2 GPU, 1 decode instance at TP 4 on a $4 GPU
    pd = deployment_cost([(1, 2.0), (1, 2.0), (4, 4.0)], 500.0)
    assert (pd.total_gpus, pd.cost_per_hour_usd, pd.gpu_hour_usd) == (6, 20.0, 20.0 / 6)
    # one unpriced GPU: cost unknown, GPUs still counted; no output: no per-token cost
    assert deployment_cost([(2, 2.0), (2, None)], 10.0).to_dict() == {
        "total_gpus": 4, "gpu_hour_usd": None, "cost_per_hour_usd": None,
        "cost_per_million_output_tokens_usd": None}
    assert deployment_cost([(1, None)], 0.0, gpu_hour_usd=1.0).cost_per_million_output_tokens_usd is None


def test_catalog_price_is_optional_and_never_invented(tmp_path):
    assert all(e.spec.price_per_hour_usd is None for e in builtin_gpus().entries.values())
    p = tmp_path / "hw.json"
    p.write_text('{"H100": {"TFlopsPeak": 989.5, "BwPeakTBs": 3.35, "mfuPrefill": 0.45, '
                 '"mfuDecode": 0.3, "MemoryGiB": 80, "price_per_hour_usd": 2.25}}')
    assert gpu_catalog(str(p)).get("H100").price_per_hour_usd == 2.25
    p.write_text('{"H100": {"TFlopsPeak": 989.5, "price_per_hour_usd": -1}}')
    with pytest.raises(ConfigError, match="price_per_hour_usd must be a finite number > 0"):
        read_hardware_json(str(p))


# ------------------------------------------------------------------------------ arrivals
def _gaps(process: str, cv: float | None = None, n: int = 20_000, rate: float = 50.0) -> np.ndarray:
    spec = distribution_spec(rate, n, 7, arrival=process, arrival_cv=cv)
    t = np.array([r.arrival_us for r in generate_requests(spec, seed=7, max_requests=n)])
    return np.diff(np.concatenate(([0], t)))


def test_constant_arrivals_are_exact_and_the_default():
    gaps = _gaps("constant")
    assert set(gaps.tolist()) == {20_000}                       # 1/50 s
    default = distribution_spec(50.0, 10, 7)
    assert default.clients[0].arrival.process == "constant"


@pytest.mark.parametrize(("process", "cv"), [("poisson", None), ("gamma", 2.0), ("gamma", 0.5)])
def test_random_arrivals_mean_and_cv(process, cv):
    gaps = _gaps(process, cv)
    assert gaps.mean() == pytest.approx(20_000, rel=0.03)
    want_cv = 1.0 if cv is None else cv
    assert gaps.std() / gaps.mean() == pytest.approx(want_cv, rel=0.05)
    again = _gaps(process, cv)
    assert np.array_equal(gaps, again)                          # same seed, same arrivals
    assert not np.array_equal(gaps, _gaps("constant"))


def test_arrival_values_are_checked():
    with pytest.raises(ConfigError) as e:
        distribution_spec(1.0, 10, 1, arrival="weibull")
    assert e.value.field == "--arrival"
    with pytest.raises(ConfigError) as e:
        distribution_spec(1.0, 10, 1, arrival="gamma", arrival_cv=math.nan)
    assert e.value.field == "--arrival-cv"
