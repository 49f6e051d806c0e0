"""Workload-spec v2 generator for standard clients (docs/workloads.md)."""

from __future__ import annotations

import numpy as np
import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.workload import generator as gen_mod
from blis_simpy.workload.generator import compute_deadline, generate_requests
from blis_simpy.workload.spec import WorkloadSpecV2, load_workload_spec


def client(cid, frac=1.0, process="poisson", cv=None, n_in=("constant", {"value": 10}),
           n_out=("constant", {"value": 5}), **kw):
    c = {"id": cid, "rate_fraction": frac, "arrival": {"process": process},
         "input_distribution": {"type": n_in[0], "params": n_in[1]},
         "output_distribution": {"type": n_out[0], "params": n_out[1]}}
    if cv is not None:
        c["arrival"]["cv"] = cv
    c.update(kw)
    return c


def spec(*clients, rate=100.0, num=200, seed=7, **kw) -> WorkloadSpecV2:
    return WorkloadSpecV2.model_validate({"version": "2", "seed": seed, "aggregate_rate": rate,
                                          "num_requests": num, "clients": list(clients), **kw})


GAUSS = ("gaussian", {"mean": 100, "std_dev": 40, "min": 5, "max": 300})


def _sig(reqs):
    return [(r.id, r.arrival_us, r.client_id, r.tokens.tobytes()) for r in reqs]


def test_deterministic_sorted_and_named():
    s = spec(client("a", 0.7, "gamma", 2.0, GAUSS, GAUSS), client("b", 0.3, "weibull", 0.5))
    one, two = generate_requests(s), generate_requests(s)
    assert _sig(one) == _sig(two)
    assert len(one) == 200
    assert [r.id for r in one] == [f"request_{i}" for i in range(200)]
    arr = [r.arrival_us for r in one]
    assert arr == sorted(arr) and arr[0] >= 1
    assert {r.client_id for r in one} == {"a", "b"}
    assert _sig(generate_requests(s, seed=8)) != _sig(one)


def test_seed_horizon_and_cap_overrides():
    s = spec(client("a"), num=50, horizon=300_000)
    reqs = generate_requests(s)                        # spec horizon 0.3 s at 100 req/s
    assert 10 < len(reqs) < 50 and all(r.arrival_us < 300_000 for r in reqs)
    assert len(generate_requests(s, horizon=10**9)) == 50
    assert len(generate_requests(s, horizon=10**9, max_requests=7)) == 7
    with pytest.raises(ConfigError, match="num_requests or --horizon"):
        generate_requests(spec(client("a"), num=0))
    assert len(generate_requests(spec(client("a"), num=0), horizon=1_000_000)) > 50


def test_constant_arrivals_and_stable_ties_keep_client_order():
    s = spec(client("a", 1, "constant"), client("b", 1, "constant"), rate=4, num=6)
    reqs = generate_requests(s)
    assert [(r.arrival_us, r.client_id) for r in reqs] == [
        (500000, "a"), (500000, "b"), (1000000, "a"), (1000000, "b"), (1500000, "a"), (1500000, "b")]


def test_rate_fractions_normalised():
    s = spec(client("a", 3.0), client("b", 1.0), rate=1000, num=0, horizon=4_000_000)
    reqs = generate_requests(s)
    na = sum(r.client_id == "a" for r in reqs)
    nb = len(reqs) - na
    assert na / nb == pytest.approx(3.0, rel=0.1)
    assert len(reqs) == pytest.approx(4000, rel=0.06)


def test_prefix_groups():
    s = spec(client("a", prefix_group="sys", prefix_length=0),
             client("b", prefix_group="sys", prefix_length=32),
             client("c", prefix_group="other"), client("d"), num=300)
    reqs = generate_requests(s)
    by = {cid: [r for r in reqs if r.client_id == cid] for cid in "abcd"}
    sys_pre = by["a"][0].input_tokens[:32]
    for r in by["a"] + by["b"]:
        assert r.input_len == 32 + 10 and r.prefix_length == 32 and r.prefix_group == "sys"
        assert np.array_equal(r.input_tokens[:32], sys_pre)
    for r in by["c"]:
        assert r.input_len == 50 + 10 and r.prefix_length == 50      # default length 50
        assert np.array_equal(r.input_tokens[:50], by["c"][0].input_tokens[:50])
    assert all(r.input_len == 10 and r.prefix_length == 0 for r in by["d"])
    # suffixes differ between requests of the group
    assert not np.array_equal(by["a"][0].input_tokens[32:], by["a"][1].input_tokens[32:])


def test_lengths_and_token_range():
    s = spec(client("a", n_in=GAUSS, n_out=("exponential", {"mean": 20})), num=400)
    reqs = generate_requests(s)
    assert all(5 <= r.input_len <= 300 and r.output_len >= 1 for r in reqs)
    assert all(r.max_output_len == r.output_len for r in reqs)
    toks = np.concatenate([r.tokens for r in reqs])
    assert toks.min() >= 0 and toks.max() < 128000 and toks.max() > 120000
    assert np.mean([r.input_len for r in reqs]) == pytest.approx(100, rel=0.08)


def test_earlier_clients_independent_of_later_ones():
    """Child seeds are drawn from G in client order: appending a client (same per-client
    rate) leaves the first client's requests unchanged."""
    def of_a(reqs):
        return [(r.arrival_us, r.tokens.tobytes()) for r in reqs if r.client_id == "a"]

    base = generate_requests(spec(client("a", n_in=GAUSS), rate=100, num=0), horizon=1_000_000)
    more = generate_requests(spec(client("a", n_in=GAUSS), client("z", n_in=GAUSS), rate=200, num=0),
                             horizon=1_000_000)
    assert len(of_a(base)) > 50 and of_a(more) == of_a(base)
    assert any(r.client_id == "z" for r in more)


def test_lifecycle_windows():
    s = spec(client("a", lifecycle={"windows": [{"start_us": 100_000, "end_us": 200_000},
                                                {"start_us": 500_000, "end_us": 600_000}]}),
             rate=1000, num=10_000)
    reqs = generate_requests(s)   # unbounded horizon: must stop after the last window
    assert 150 < len(reqs) < 250
    assert all(100_000 <= r.arrival_us < 200_000 or 500_000 <= r.arrival_us < 600_000 for r in reqs)
    empty = spec(client("a", lifecycle={"windows": []}), num=20)
    assert len(generate_requests(empty)) == 20


def test_timeouts_and_deadlines():
    s = spec(client("a", timeout=5000), client("b", timeout=0), client("c"),
             client("d", closed_loop=True), num=100)
    reqs = generate_requests(s)
    for r in reqs:
        want = {"a": r.arrival_us + 5000, "b": 0, "c": 0, "d": r.arrival_us + 300_000_000}
        assert r.deadline_us == want[r.client_id]
    c = s.clients[0]
    assert compute_deadline(7, c) == 5007


def test_multimodal_counts():
    mm = {"text_distribution": {"type": "constant", "params": {"value": 10}},
          "image_distribution": {"type": "constant", "params": {"value": 100}},
          "image_count_distribution": {"type": "constant", "params": {"value": 2}},
          "audio_distribution": {"type": "constant", "params": {"value": 7}}}   # no count: off
    c = client("m", multimodal=mm, prefix_group="p", prefix_length=4)
    del c["input_distribution"]
    reqs = generate_requests(spec(c, num=10, category="multimodal"))
    for r in reqs:
        assert (r.text_tokens, r.image_tokens, r.audio_tokens, r.video_tokens) == (10, 200, 0, 0)
        assert r.input_len == 4 + 210 and r.output_len == 5


def test_cap_factor_two_gives_identical_requests(monkeypatch):
    s = spec(client("a", 0.6, "gamma", 3.0, GAUSS), client("b", 0.4, "poisson"),
             client("c", 0.2, "constant"), num=150)
    ours = _sig(generate_requests(s))
    monkeypatch.setattr(gen_mod, "CLIENT_CAP_FACTOR", 2)      # BLIS's literal 2× cap
    assert _sig(generate_requests(s)) == ours


def test_spec_file_generation(conformance_dir):
    s = load_workload_spec(conformance_dir / "E31_workload_spec_servegen" / "workload_spec.yaml")
    reqs = generate_requests(s)
    assert len(reqs) == 500
    batch = [r for r in reqs if r.client_id == "high-volume-batch"]
    chat = [r for r in reqs if r.client_id == "realtime-chat"]
    assert len(batch) / len(reqs) == pytest.approx(0.7, abs=0.08)
    assert all(r.prefix_length == 50 and r.slo_class == "batch" for r in batch)
    assert all(r.streaming and r.slo_class == "critical" and 10 <= r.input_len <= 2048 for r in chat)
