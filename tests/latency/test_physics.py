"""The ``physics`` backend: every basis hand-checked on a tiny config, the composition, MoE
expected experts, DP lockstep, and properties over the whole model x GPU catalog.

The tiny GPU runs at 1 FLOP/µs, 1 B/µs of HBM and 1 B/µs of link, so every basis in µs
equals its FLOP or byte count and the figures below are checkable by hand.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace as NS

import pytest

from blis_simpy.catalog.hardware import builtin_gpus
from blis_simpy.catalog.models import builtin_models
from blis_simpy.catalog.types import GPUSpec, ModelConfig
from blis_simpy.errors import ConfigError
from blis_simpy.latency import physics_terms as P
from blis_simpy.latency.base import BatchView
from blis_simpy.latency.physics import PhysicsCoefficients, PhysicsModel, load_coefficient_set

# d 8, L 2, H 2 with a declared head_dim 8 (hidden/heads would be 4), 1 KV head, FFN 16, V 32
TINY = ModelConfig(name="tiny", num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=8,
                   intermediate_size=16, vocab_size=32, bytes_per_param=2.0, hidden_act="silu")
TINY_MOE = ModelConfig(name="tiny-moe", num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1,
                       head_dim=8, intermediate_size=16, vocab_size=32, bytes_per_param=2.0,
                       hidden_act="silu", num_local_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=4)
UNIT = GPUSpec(name="unit", tflops_peak=1e-6, tflops_fp8=0.0, bw_peak_tbs=1e-6, mfu_prefill=1.0,
               mfu_decode=1.0, memory_gib=1.0, link_bw_gbps=1e-3, p2p=True, collective_latency_us=0.0)
RATES = P.gpu_rates(UNIT, 2.0)
OVERHEADS = PhysicsCoefficients(layer_launch_us=10.0, request_cpu_us=1.0, step_cpu_us=100.0)


def req(pi, t, n_in=20, n_out=5):
    return NS(pi=pi, num_new_tokens=t, input_len=n_in, output_len=n_out)


# ------------------------------------------------------------------------------ the bases
def test_shape_counts_real_head_dim_gated_mlp_and_lm_head():
    s = P.build_shape(TINY, tp=1)
    # attention 2·d·H·hd + 2·d·Hkv·hd = 256 + 128; gated MLP 3·8·16 = 384; two layers
    assert s.nonexpert_macs_per_token == 2 * (384 + 384) == 1536
    assert s.lm_head_macs_per_row == 8 * 32
    # (macs + lm_head + norms 2·L·d + d) x 2 bytes
    assert s.nonexpert_weight_bytes == (1536 + 256 + 40) * 2 == 3664
    assert s.kv_bytes_per_token == 2 * 2 * 1 * 8 * 2 == 64     # L·2·Hkv·hd·bytes


def test_each_basis_by_hand():
    s = P.build_shape(TINY, tp=1)
    assert P.weight_reads_us(s, RATES) == 3664
    assert P.prefill_compute_us(s, RATES, 10, 1) == 2 * (10 * 1536 + 256)
    assert P.decode_compute_us(s, RATES, 3) == 2 * 3 * (1536 + 256)
    assert P.attention_pairs(4, 3) == 4 * 3 + 3 * 4 / 2          # t·c + t(t+1)/2 = 18
    assert P.attention_compute_us(s, RATES, 18) == 4 * 2 * 8 * 18 * 2
    assert P.prefill_memory_us(s, RATES, 4, 3) == 7 * 64
    assert P.decode_kv_reads_us(s, RATES, 100, 3) == 103 * 64
    assert P.sampling_us(s, RATES, 4) == 2 * 4 * 32 * 4
    # element-wise per token: per layer 2 norms (d in, d out) + 2 residual adds (2d in, d out)
    # + rotary on 2 q heads and 1 k head of 8 (in and out) = 32 + 48 + 48 = 128, two layers;
    # the gated activation 3 x 16 per layer; x 2 bytes
    assert s.elementwise_bytes_per_token == (2 * 128 + 2 * 3 * 16) * 2 == 704
    assert P.elementwise_us(s, RATES, 3) == 3 * 704
    assert P.tp_allreduce_us(s, RATES, 5) == 0                     # TP 1: no collective


def test_tp_allreduce_two_per_layer_ring_cost():
    s = P.build_shape(TINY, tp=2)
    # per GPU: Q/O halve, the single KV head is replicated (max(1, 1 // 2) = 1)
    assert s.nonexpert_macs_per_token == 2 * (2 * 8 * 16 / 2 + 2 * 8 * 1 * 8 + 3 * 8 * 16 / 2)
    # without peer access NCCL's ring runs (through host memory: half the link, 0.5 B/µs)
    r = P.gpu_rates(replace(UNIT, collective_latency_us=10.0, p2p=False), 2.0)
    # 2 layers x (attention + MLP) = 4 all-reduces of 5 tokens x 8 x 2 bytes over 2 ranks
    assert P.tp_allreduce_us(s, r, 5) == 4 * (10 + 2 * 1 / 2 * 80 / 0.5)


def test_custom_allreduce_where_vllm_runs_it():
    """vLLM's custom all-reduce: peer access, TP 2/4/6/8, NVLink or only two GPUs, ≤ 8 MiB;
    5 µs + (n − 1) x bytes / link. Otherwise NCCL's ring with the catalog's fixed cost."""
    nv = replace(UNIT, collective_latency_us=10.0, interconnect="nvlink")
    pcie = replace(UNIT, collective_latency_us=10.0, interconnect="pcie")
    tiny = replace(TINY, num_heads=8, num_kv_heads=8)             # divisible by TP up to 8
    # TP 2 over PCIe with peer access: custom (4 all-reduces of 80 bytes at 1 B/µs)
    assert P.tp_allreduce_us(P.build_shape(tiny, tp=2), P.gpu_rates(pcie, 2.0), 5) == 4 * (5 + 1 * 80)
    # TP 4 over PCIe: NCCL's ring (2·3/4 of the bytes, the catalog's 10 µs)
    assert P.tp_allreduce_us(P.build_shape(tiny, tp=4), P.gpu_rates(pcie, 2.0), 5) == 4 * (10 + 1.5 * 80)
    # TP 4 over NVLink: custom, every GPU reads its 3 peers
    assert P.tp_allreduce_us(P.build_shape(tiny, tp=4), P.gpu_rates(nv, 2.0), 5) == 4 * (5 + 3 * 80)
    r = P.gpu_rates(nv, 2.0)
    assert not P.uses_custom_allreduce(r, 3, 80)                  # TP 3: not a supported size
    assert P.uses_custom_allreduce(r, 8, 8 * 2**20)
    assert not P.uses_custom_allreduce(r, 8, 8 * 2**20 + 1)       # above 8 MiB: NCCL
    assert P.custom_allreduce_us(r, 2**20, 2) == 5 + 2**20


def test_no_p2p_halves_the_link():
    g = GPUSpec(name="x", tflops_peak=1.0, tflops_fp8=0.0, bw_peak_tbs=1.0, mfu_prefill=1, mfu_decode=1,
                memory_gib=1, link_bw_gbps=32.0, p2p=False)
    assert P.gpu_rates(g, 2.0).link_bytes_per_us == 16_000.0
    assert P.gpu_rates(replace(g, p2p=True), 2.0).link_bytes_per_us == 32_000.0


def test_fp8_weights_use_the_fp8_peak():
    g = GPUSpec(name="x", tflops_peak=1.0, tflops_fp8=2.0, bw_peak_tbs=1.0, mfu_prefill=1, mfu_decode=1,
                memory_gib=1)
    assert P.gpu_rates(g, 1.0).flops_per_us == 2e6
    assert P.gpu_rates(g, 2.0).flops_per_us == 1e6
    assert P.gpu_rates(g, 0.5).flops_per_us == 1e6      # weight-only int4: bf16 GEMMs


# ------------------------------------------------------------------------------ MoE
@pytest.mark.parametrize("E,k,T,want", [
    (128, 8, 1, 8.0), (128, 8, 8, 51.6), (128, 8, 32, 111.8), (128, 8, 64, 125.9),
    (8, 2, 2, 3.5), (8, 2, 4, 5.47), (8, 2, 16, 7.92)])
def test_expected_distinct_experts_matches_the_reference_table(E, k, T, want):
    assert round(P.expected_experts(E, k, T), 2 if want != round(want, 1) else 1) == want


def test_expected_experts_edges():
    assert P.expected_experts(128, 8, 0) == 0.0
    assert P.expected_experts(4, 4, 1) == 4.0          # top-k = E: every expert, every token
    assert P.expected_experts(0, 2, 10) == 0.0


def test_qwen3_30b_a3b_expert_bytes_per_step():
    """Reference figures: one Qwen3-30B-A3B expert is 9 MiB; T = 1 reads 8 x 48 of them."""
    m = builtin_models().get("qwen/qwen3-30b-a3b")
    s = P.build_shape(m, tp=1)
    assert s.expert_params * s.weight_bytes == 3 * 2048 * 768 * 2 == 9 * 2**20
    r = P.Rates(1.0, 1.0, 1.0, 0.0)
    assert P.moe_expert_reads_us(s, r, 1) / 2**30 == pytest.approx(3.375)


def test_moe_bases_by_hand_and_sharding():
    s = P.build_shape(TINY_MOE, tp=1)
    assert s.moe_layers == 2 and s.dense_layers == 0
    assert s.expert_params == 3 * 8 * 4
    # T = 2 tokens touch 4·(1 − (1/2)^2) = 3 experts per layer
    assert P.moe_expert_reads_us(s, RATES, 2) == 2 * 3 * 96 * 2
    assert P.moe_compute_us(s, RATES, 2) == 2 * 2 * 2 * 2 * 96
    s4 = P.build_shape(TINY_MOE, tp=2, dp=2, expert_parallel=True)     # G = 4: a quarter each
    assert P.moe_expert_reads_us(s4, RATES, 2) == 2 * 3 * 96 * 2 / 4
    s4off = P.build_shape(TINY_MOE, tp=2, dp=2, expert_parallel=False)
    assert P.moe_expert_reads_us(s4off, RATES, 2) == P.moe_expert_reads_us(s4, RATES, 2)


def test_ep_dispatch_combine_only_with_ep_or_dp():
    r = P.Rates(1.0, 1.0, 1.0, 5.0)
    assert P.ep_dispatch_combine_us(P.build_shape(TINY_MOE, tp=2), r, 6) == 0.0
    s = P.build_shape(TINY_MOE, tp=1, dp=2, expert_parallel=True)
    # 2 MoE layers x (all-gather + reduce-scatter) of 6 tokens x 8 x 2 bytes over G = 2
    assert P.ep_dispatch_combine_us(s, r, 6) == 2 * 2 * (5 + 1 / 2 * 96)
    # the MoE output then is not all-reduced over TP
    s_tp = P.build_shape(TINY_MOE, tp=2, dp=1, expert_parallel=False)
    s_ep = P.build_shape(TINY_MOE, tp=2, dp=1, expert_parallel=True)
    assert P.tp_allreduce_us(s_tp, r, 1) == 4 * (5 + 16)     # attention x 2 + MoE x 2
    assert P.tp_allreduce_us(s_ep, r, 1) == 2 * (5 + 16)     # attention only


# ------------------------------------------------------------------------------ the model
def test_step_time_composition_by_hand():
    m = PhysicsModel(TINY, UNIT, 1, coefficients=OVERHEADS)
    batch = BatchView.of([req(4, 3), req(40, 1, n_in=10), req(30, 1, n_in=10), req(30, 1, n_in=10)])
    assert batch.decode_count == 3 and batch.decode_pi_sum == 100
    # 6 tokens run as a CUDA graph of 8: 2 padded rows of 2·1536 FLOPs each
    # linear   max(9728 + 10752 + 6144, 3664) = 26624
    # attention max(4·2·8·(18 + 103)·2 = 15488, 448 + 6592) = 15488
    # sampling 1024; element-wise 8 padded tokens x 704 B = 5632;
    # layers 2 x 10 + 4 requests x 1 + 100
    assert m.step_time_us(batch) == 26624 + 15488 + 1024 + 5632 + 124
    assert m.step_time_us(batch) == int(PhysicsModel.combine(m.terms(batch)))


def test_cudagraph_padding_sizes():
    # vLLM's capture sizes: 1, 2, 4, every 8 to 256, every 16 to 512; none above
    assert [P.cudagraph_tokens(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 256, 257, 272, 500, 512, 513, 2048)] == \
        [0, 1, 2, 4, 4, 8, 8, 16, 256, 272, 272, 512, 512, 513, 2048]


def test_decode_is_weight_bound_not_compute_bound():
    m = PhysicsModel(TINY, UNIT, 1, coefficients=PhysicsCoefficients(decode_compute=0.0))
    v = BatchView(decode_count=1, decode_tokens=1, decode_pi_sum=0, size=1)
    t = m.terms(v)
    assert t["weight_reads"] == 3664 and t["decode_compute"] == 0
    assert m.step_time_us(v) == 3664 + max(4 * 2 * 8 * 2, 64) + 2 * 32 * 4 + 704   # + element-wise


def test_coefficients_scale_their_term():
    base = PhysicsModel(TINY, UNIT, 1, coefficients=PhysicsCoefficients())
    half = PhysicsModel(TINY, UNIT, 1, coefficients=PhysicsCoefficients(weight_reads=0.5))
    v = BatchView(decode_count=1, decode_tokens=1, decode_pi_sum=0, size=1)
    assert base.terms(v)["weight_reads"] == 2 * half.terms(v)["weight_reads"]


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_fast_path_equals_the_terms_on_random_batches(tp):
    import random
    rnd = random.Random(7)
    m = PhysicsModel(builtin_models().get("meta-llama/llama-3.1-8b-instruct"), builtin_gpus().get("H100"), tp)
    for _ in range(200):
        batch = [req(rnd.randrange(0, 3000), rnd.randrange(1, 2048), n_in=5000) for _ in range(rnd.randrange(0, 3))]
        batch += [req(rnd.randrange(10, 8000), 1, n_in=5) for _ in range(rnd.randrange(0, 200))]
        if not batch:
            continue
        v = BatchView.of(batch)
        assert m.step_time_us(v) == max(1, int(PhysicsModel.combine(m.terms(v))))


def test_the_pure_decode_step_function_equals_the_step_time():
    # decode_step_fn (the engine's runs of pure-decode steps) must give step_time_us's
    # number to the microsecond, over dense catalog models, GPUs, TP and coefficient sets
    import random
    rnd = random.Random(11)
    models, gpus = builtin_models(), builtin_gpus()
    dense = [n for n in models.names() if models.get(n).num_local_experts == 0][:6]
    sets = [None, PhysicsCoefficients(), PhysicsCoefficients(weight_reads=0.5, request_cpu_us=17.0),
            PhysicsCoefficients(decode_kv_reads=3.0, attention_compute=40.0, step_cpu_us=471.0),
            PhysicsCoefficients(decode_kv_reads=0.001, attention_compute=1000.0),   # attention-bound
            PhysicsCoefficients(decode_compute=500.0, weight_reads=0.01)]           # compute-bound
    checked = 0
    for name in dense:
        for gpu in ("H100", "A100-80", "RTX-4090"):
            for tp in (1, 2, 4):
                kw = {} if (c := rnd.choice(sets)) is None else {"coefficients": c}
                m = PhysicsModel(models.get(name), gpus.get(gpu), tp, **kw)
                for _ in range(40):
                    count = rnd.randrange(1, 300)
                    size = count + rnd.randrange(0, 3)
                    f = m.decode_step_fn(size, count)
                    for pi in (rnd.randrange(0, 2_000_000) for _ in range(5)):
                        v = BatchView(decode_count=count, decode_tokens=count, decode_pi_sum=pi, size=size)
                        assert f(pi) == m.step_time_us(v), (name, gpu, tp, count, size, pi)
                        checked += 1
    assert checked > 5000


def test_no_pure_decode_step_function_where_the_step_is_not_the_dense_one():
    moe = PhysicsModel(TINY_MOE, UNIT, 1, coefficients=PhysicsCoefficients())
    assert moe.decode_step_fn(4, 4) is None

    class Own(PhysicsModel):
        def step_time_us(self, batch):
            return 5

    own = Own(TINY, UNIT, 1, coefficients=PhysicsCoefficients())
    assert own.decode_step_fn(4, 4) is None


def test_lockstep_pads_moe_tokens_to_the_busiest_rank():
    m = PhysicsModel(TINY_MOE, UNIT, 1, dp=2, expert_parallel=True, coefficients=PhysicsCoefficients())
    busy = BatchView.of([req(10, 1, n_in=5), req(10, 1, n_in=5), req(10, 1, n_in=5)])
    idle = BatchView()
    # routed = 3 tokens (the busiest) x 2 ranks = 6 for both ranks; the idle one runs the dummy
    want = max(int(PhysicsModel.combine(m.terms(busy, 6.0))),
               int(PhysicsModel.combine(m.terms(BatchView.dummy(), 6.0))))
    assert m.lockstep_step_time_us([busy, idle]) == want
    assert m.lockstep_step_time_us([busy, idle]) == int(PhysicsModel.combine(m.terms(busy, 6.0)))
    assert m.lockstep_step_time_us([busy, idle]) > m.step_time_us(BatchView.of([req(10, 1, n_in=5)]))


def test_validation_errors():
    with pytest.raises(ValueError, match="divisible by TP"):
        PhysicsModel(TINY, UNIT, 4)
    with pytest.raises(ValueError, match="link_bw_gbps"):
        PhysicsModel(TINY, GPUSpec(name="nolink", tflops_peak=1, tflops_fp8=0, bw_peak_tbs=1, mfu_prefill=1,
                                   mfu_decode=1, memory_gib=1, link_bw_gbps=0.0), 2)


def test_coefficient_set_files(tmp_path):
    got, where = load_coefficient_set("no-such-gpu")
    assert where == "built-in set default" and got.weight_reads == 1.0 and got.step_cpu_us > 0
    f = tmp_path / "set.yaml"
    f.write_text("weight_reads: 0.9\nstep_cpu_us: 50\n")
    got, where = load_coefficient_set("H100", str(f))
    assert (got.weight_reads, got.step_cpu_us, got.prefill_compute, where) == (0.9, 50.0, 1.0, str(f))
    f.write_text("weight_reads: 0.9\nbogus: 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_coefficient_set("H100", str(f))
    f.write_text("weight_reads: -1\n")
    with pytest.raises(ConfigError, match="weight_reads"):
        load_coefficient_set("H100", str(f))
    with pytest.raises(ConfigError, match="no such file"):
        load_coefficient_set("H100", str(tmp_path / "missing.yaml"))


# ------------------------------------------------------------------------------ catalog-wide
def _deployments():
    for name, entry in builtin_models().entries.items():
        m = entry.config
        for gname, g in builtin_gpus().entries.items():
            tp = next(t for t in (1, 2, 4, 8, 16) if m.num_heads % t == 0 and (m.num_kv_heads or 1) % t in (0, m.num_kv_heads))
            yield name, m, gname, g.spec, tp


def test_batch1_decode_never_below_the_weight_streaming_floor():
    """Over every catalog model and GPU: one decode token costs at least the time to stream
    the non-expert weights plus the k experts of each MoE layer at peak bandwidth."""
    checked = 0
    for name, m, gname, g, tp in _deployments():
        model = PhysicsModel(m, g, tp)
        s, r = model.shape, model.rates
        floor = P.weight_streaming_floor_us(s, r)
        if s.moe_layers:
            floor += s.moe_layers * max(1, s.top_k) * s.expert_params * s.weight_bytes / s.moe_group / r.hbm_bytes_per_us
        assert model.decode_step_us(1, 1) >= int(floor), (name, gname, tp)
        checked += 1
    assert checked >= 30 * 8


def test_both_new_backends_build_for_every_catalog_model_and_gpu():
    from blis_simpy.latency.trained_physics import TrainedPhysicsModel
    v = BatchView.of([req(0, 512, n_in=512), req(100, 1, n_in=50)])
    for name, m, gname, g, tp in _deployments():
        assert PhysicsModel(m, g, tp).step_time_us(v) > 1, (name, gname)
        hkv = m.num_kv_heads or m.num_heads
        if hkv % tp == 0:
            assert TrainedPhysicsModel(m, g, tp).step_time_us(v) > 1, (name, gname)


def test_llama8b_batch1_decode_is_weight_bound_on_the_4090():
    """Issue 8: streaming 15 GB of Llama-3.1-8B weights at 1.008 TB/s takes at least 14.9 ms;
    the catalog's sustained 0.953 TB/s makes it 15.75 ms, plus the fixed overheads."""
    gpu = builtin_gpus().get("RTX-4090")
    physical = load_coefficient_set("", "default")[0]     # the GPU's shipped set is fitted
    m = PhysicsModel(builtin_models().get("meta-llama/llama-3.1-8b"), gpu, 1, coefficients=physical)
    assert m.shape.nonexpert_weight_bytes == pytest.approx(15.01e9, rel=1e-3)
    assert m.rates.hbm_bytes_per_us == 0.953e6
    assert 15_750 <= m.decode_step_us(1, 1000) <= 18_000
    peak = PhysicsModel(m.model, replace(gpu, bw_sustained_tbs=0.0), 1, coefficients=physical)
    assert peak.rates.hbm_bytes_per_us == 1.008e6
    assert 14_890 <= peak.decode_step_us(1, 1000) < m.decode_step_us(1, 1000)


def test_a_set_carries_the_api_server_costs():
    """A coefficient set's ``frontend:`` costs are the physics model's API server (docs/frontend.md);
    all 0 (the default set) is none. Unknown keys and negative costs are refused."""
    assert PhysicsModel(TINY, UNIT, 1, coefficients=PhysicsCoefficients()).frontend_params() is None
    cs = PhysicsCoefficients(frontend={"request_us": 300.0, "output_token_us": 20.0, "network_us": 50})
    fe = PhysicsModel(TINY, UNIT, 1, coefficients=cs).frontend_params()
    assert (fe.request_us, fe.output_token_us, fe.network_us, fe.step_output_us) == (300.0, 20.0, 50.0, 0.0)
    assert fe.input_cost_us(10) == 300 and fe.output_cost_us(4) == 80
    for bad in ({"colour": 1.0}, {"request_us": -1.0}):
        with pytest.raises(ValueError):
            PhysicsCoefficients(frontend=bad)
