"""The analytical backends against the original BLIS's output (conformance B13, B15, B16, B17).

Each case is replayed through the library (no CLI): the Deployment is built directly from the
case's arguments and resolved values — model_config.json from the case folder, GPU figures of
the GPU catalog, ``total_kv_blocks`` and ``max_model_len = resolved.auto_max_model_len`` — and every
request's TTFT/E2E must equal BLIS's to the µs, the cluster metrics block within 1e-9.

B15 (Mixtral MoE) is special: BLIS checkout 89bece82 prices the per-step weight read with a
batch of 0 tokens, so the expert weights cost nothing (divergences.md #8). With
``moe_weight_batch_zero=True`` we must reproduce BLIS exactly; with our default (upstream's fix)
the numbers must differ, and the first steps must equal step times worked out by hand below.
"""

from __future__ import annotations

import json
import math

import pytest

from blis_simpy.catalog.hfconfig import derive_max_model_len, parse_hf_config
from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.resolve import Deployment
from blis_simpy.latency import LatencyModel, RooflineModel
from blis_simpy.metrics.summary import aggregate, metrics_output, replay_results
from blis_simpy.run.simulation import Simulation
from blis_simpy.workload import read_trace, trace_requests
from tests.conftest import conformance_case
from tests.latency.support import A100, H100

GPUS = {"H100": H100, "A100-SXM": A100}


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


class Case:
    def __init__(self, name: str):
        self.dir = conformance_case(name)
        self.spec = json.loads((self.dir / "case.json").read_text())
        self.expected = json.loads((self.dir / "expected.json").read_text())
        a = self.args = self.spec["args"]
        self.resolved = self.spec["resolved"]
        self.model = parse_hf_config(self.dir / "model_config.json", name=_arg(a, "--model"))
        self.backend = LatencyModel.lookup(_arg(a, "--latency-model"))
        self.gpu = GPUS[_arg(a, "--hardware")]
        self.tp = int(_arg(a, "--tp"))
        self.seed = int(_arg(a, "--seed"))

    def run(self, factory=None, **opts):
        res = self.resolved
        if factory is None:
            def factory():
                return self.backend.from_config(self.model, self.gpu, self.tp, res["alpha_coeffs"],
                                                res["beta_coeffs"], **opts)
        dep = Deployment(total_kv_blocks=res["total_kv_blocks"], block_size=16,
                         max_model_len=res["auto_max_model_len"], latency_factory=factory)
        trace = read_trace(self.dir / _arg(self.args, "--trace-header"),
                           self.dir / _arg(self.args, "--trace-data"))
        reqs = trace_requests(trace.records, self.seed)
        sc = Scenario(model=_arg(self.args, "--model"), seed=self.seed,
                      engine={"async_scheduling": False})       # BLIS schedules synchronously
        result = Simulation(sc, reqs, horizon_us=int(_arg(self.args, "--horizon")), deployment=dep).run()
        return aggregate(result.instances)

    def per_request(self, agg) -> tuple[dict, dict]:
        mine = {r["request_id"]: (r["ttft_us"], r["e2e_us"]) for r in replay_results(agg)}
        ref = {r["request_id"]: (r["ttft_us"], r["e2e_us"]) for r in self.expected["results"]}
        return mine, ref

    def assert_matches(self, agg) -> None:
        mine, ref = self.per_request(agg)
        assert set(mine) == set(ref)
        bad = [(k, mine[k], ref[k]) for k in sorted(ref) if mine[k] != ref[k]]
        assert not bad, f"{len(bad)} requests differ (ours, BLIS): {bad[:3]}"
        ours = metrics_output(agg, include_requests=False)
        theirs = self.expected["stdout_metrics"][-1]
        assert theirs["instance_id"] == "cluster"
        for k, v in theirs.items():
            if k == "simulation_duration_s":
                continue
            if isinstance(v, str):
                assert ours[k] == v
            else:
                assert math.isclose(ours[k], v, rel_tol=1e-9, abs_tol=0.0), (k, ours[k], v)


@pytest.mark.parametrize("name", [
    "B13_roofline_qwen3_14b_h100_tp1",
    "B16_crossmodel_qwen3_14b_h100_tp1",
    "B17_trained_roofline_qwen3_14b_h100_tp1",
])
def test_backend_reproduces_blis(name):
    case = Case(name)
    assert derive_max_model_len(case.model) == case.resolved["auto_max_model_len"]
    case.assert_matches(case.run())


class Recording(RooflineModel):
    """Roofline that remembers each step's batch (prefill (PI, t) pairs, decode PIs) and time."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.steps = []

    def step_time_us(self, batch):
        t = super().step_time_us(batch)
        if len(self.steps) < 4:
            pf = [(r.pi, r.num_new_tokens) for r in batch.prefill]
            dc = [pi for is_pf, pi, _, _ in batch.entries() if not is_pf]
            self.steps.append((pf, dc, t))
        return t


def test_moe_roofline_b15_parity_flag_reproduces_blis():
    case = Case("B15_roofline_mixtral_moe_h100_tp2")
    assert case.model.num_local_experts == 8 and case.model.num_experts_per_tok == 2
    assert derive_max_model_len(case.model) == case.resolved["auto_max_model_len"]
    case.assert_matches(case.run(moe_weight_batch_zero=True))


def test_moe_roofline_b15_fixed_weight_term_differs_by_design():
    """divergences.md #8: our default reads the expected distinct experts' weights every step.

    Mixtral-8x7B, H100, TP 2: d = 4096, L = 32, H = 32, Hkv = 8, dh = 128, dkv = 1024,
    dff = dexp = 14336, E = 8, k = 2, bpp = wbpp = 2, peak 989.5e12 (BF16), bw 3.35e12.

    Step 1 — request 0 alone, prefill of 732 tokens at PI 0 (ctx = 731/2 = 365.5):
      QKV+O = 32·[2·732·(4096² + 2·4096·1024) + 2·732·4096²]      = 1 964 947 537 920
      attn  = 32·4·32·732·365.5·128                                  =   140 271 157 248
      sram  = 32·(5·32·732·365.5 + 2·732·4096)                        =     1 561 724 928
      mlp   = 32·2·732·2·4096·14336·2                                 = 11 003 706 212 352
      FLOPs = 13 110 486 632 448 → /2 /(989.5e12·0.45) = 14.7218 ms
      memory: B = 732 → nEff = 8·(1 − 0.75^732) = 8.0; weights = (4096·6144 + 4096²
      + 2·4096·14336·8)·32·2 = 62 813 896 704 B; acts 191 889 408 + kv_write 95 944 704;
      (62 813 896 704 + 287 834 112)/2 / 3.35e12 = 9.418 ms  → compute-bound: 14 721 µs
      (the same as BLIS: request 0's TTFT is 14 721 in both).
    Step 2 — request 0 decodes alone at PI 732:
      FLOPs = 2 684 354 560 + 383 778 816 + 15 032 385 536 + 4 009 984 = 18 104 528 896
      → /2 /(989.5e12·0.30) = 30.49 µs
      memory: B = 1 → nEff = 8·(1 − 0.75) = 2 (= top-k): weights = (25 165 824 + 16 777 216
      + 2·4096·14336·2)·32·2 = 17 716 740 096 B; acts 262 144 + kv_read 95 944 704
      + kv_write 131 072; (17 716 740 096 + 96 337 920)/2 / 3.35e12 = 2658.67 µs → 2658.
      BLIS (nEff = 0): (2 684 354 560 + 96 337 920)/2 / 3.35e12 = 415.03 µs → 415.
    """
    case = Case("B15_roofline_mixtral_moe_h100_tp2")
    models: dict[str, Recording] = {}

    def factory(key, **opts):
        def make():
            models[key] = Recording(case.model, case.gpu, case.tp, **opts)
            return models[key]
        return make

    fixed = case.run(factory("fixed"))
    checkout = case.run(factory("checkout", moe_weight_batch_zero=True))
    assert models["fixed"].steps[:2] == [([(0, 732)], [], 14_721), ([], [732], 2_658)]
    assert models["checkout"].steps[:2] == [([(0, 732)], [], 14_721), ([], [732], 415)]

    mine, ref = case.per_request(fixed)
    assert mine[0][0] == ref[0][0] == 14_721                   # compute-bound prefill: same TTFT
    differing = sum(1 for k in ref if mine[k] != ref[k])
    assert differing == len(ref)                               # every E2E includes decode steps
    ours = metrics_output(fixed, include_requests=False)
    blis = case.expected["stdout_metrics"][-1]
    assert ours["itl_mean_ms"] > 10 * blis["itl_mean_ms"]      # expert weights now dominate decode
    mine_c, _ = case.per_request(checkout)
    assert mine_c == ref
