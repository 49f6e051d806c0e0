"""CLI distribution mode and presets (docs/workloads.md)."""

from __future__ import annotations

import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.workload.distribution import (
    PRESETS,
    LengthParams,
    distribution_spec,
    preset_spec,
)
from blis_simpy.workload.generator import generate_requests
from blis_simpy.workload.tracev2_read import read_trace_records


def test_synthesised_spec_shape():
    s = distribution_spec(rate=25, num_requests=10, seed=3, prompt=(300, 50, 2, 900),
                          output=(40, 10, 2, 90), prefix_tokens=256)
    assert (s.version, s.seed, s.category, s.aggregate_rate, s.num_requests) == ("2", 3, "language", 25.0, 10)
    (c,) = s.clients
    assert (c.id, c.rate_fraction, c.arrival.process, c.prefix_group, c.prefix_length) == (
        "distribution", 1.0, "constant", "shared", 256)
    assert c.input_distribution.type == "gaussian"
    assert c.input_distribution.params == {"mean": 300, "std_dev": 50, "min": 2, "max": 900}
    assert c.output_distribution.params == {"mean": 40, "std_dev": 10, "min": 2, "max": 90}
    assert distribution_spec().clients[0].prefix_group == ""


def test_generation_constant_arrivals_and_prefix():
    reqs = generate_requests(distribution_spec(rate=25, num_requests=20, prefix_tokens=64))
    assert [r.arrival_us for r in reqs] == [40_000 * (i + 1) for i in range(20)]
    assert all(r.prefix_length == 64 and r.input_len >= 64 + 2 for r in reqs)
    assert all(2 <= r.output_len <= 7000 for r in reqs)


@pytest.mark.parametrize("kw, flag, fragment", [
    ({"prompt": (512, 0, 2, 7000)}, "--prompt-tokens-stdev", "[2, 7000], got 0"),     # quirk
    ({"prompt": (512, 8000, 2, 9000)}, None, None),                                   # ok: in range
    ({"output": (512, 9000, 2, 7000)}, "--output-tokens-stdev", "got 9000"),
    ({"prompt": (1, 256, 2, 7000)}, "--prompt-tokens", "got 1"),
    ({"output": (512, 256, 0, 7000)}, "--output-tokens-min", ">= 1, got 0"),
    ({"output": (512, 256, 2, 0)}, "--output-tokens-max", ">= 1, got 0"),
    ({"prompt": (512, -1, 2, 7000)}, "--prompt-tokens-stdev", ">= 0, got -1"),
    ({"prompt": (512, 256, 900, 800)}, "--prompt-tokens-min", "<= --prompt-tokens-max (800)"),
    ({"rate": 0.0}, "--rate", "> 0"),
    ({"rate": float("inf")}, "--rate", "> 0"),
    ({"num_requests": -1}, "--num-requests", ">= 0"),
    ({"prefix_tokens": -2}, "--prefix-tokens", ">= 0"),
])
def test_validation_names_the_flag(kw, flag, fragment):
    if flag is None:
        distribution_spec(**kw)
        return
    with pytest.raises(ConfigError) as ei:
        distribution_spec(**kw)
    assert ei.value.field == flag
    assert fragment in ei.value.problem


def test_presets_table_matches_spec():
    assert PRESETS["chatbot"].prompt == LengthParams(256, 100, 2, 800)
    assert PRESETS["chatbot"].output == LengthParams(256, 100, 1, 1024)
    assert PRESETS["contentgen"].output == LengthParams(1024, 200, 10, 2048)
    assert PRESETS["summarization"].prompt == LengthParams(4096, 500, 100, 8192)
    assert PRESETS["multidoc"] == (0, LengthParams(10240, 1200, 500, 20480),
                                   LengthParams(1536, 300, 50, 4096))
    assert set(PRESETS) == {"chatbot", "contentgen", "summarization", "multidoc"}


def test_preset_spec_and_unknown_name():
    s = preset_spec("summarization", rate=2, num_requests=5, seed=1)
    assert s.clients[0].id == "distribution" and s.clients[0].prefix_group == ""
    assert preset_spec("chatbot", client_id="preset-chatbot").clients[0].id == "preset-chatbot"
    with pytest.raises(ConfigError) as ei:
        preset_spec("poetry")
    assert ei.value.field == "--workload" and "chatbot" in ei.value.problem


def test_preset_chatbot_matches_blis_arrivals(conformance_dir):
    """BLIS's exported E34 trace (chatbot, --rate 8, 400 requests): our arrivals are the
    same constant process; lengths follow the preset bounds."""
    rows = read_trace_records(conformance_dir / "E34_preset_chatbot" / "trace.csv")
    reqs = generate_requests(preset_spec("chatbot", rate=8, num_requests=400, seed=42))
    assert [r.arrival_us for r in reqs] == [row.arrival_time_us for row in rows]
    assert all(2 <= r.input_len <= 800 and 1 <= r.output_len <= 1024 for r in reqs)
    assert {r.client_id for r in reqs} == {row.client_id for row in rows} == {"distribution"}


def test_a_scenarios_default_arrivals_are_evenly_spaced_as_the_docs_say():
    """docs/workloads.md and docs/scenarios.md: with no `arrival` key (or --arrival) request k
    arrives at (k + 1) * int(1e6 / rate) us — the first one gap after 0, no randomness."""
    from blis_simpy.config.scenario import Scenario
    w = Scenario(workload={"kind": "distribution", "rate": 3, "num_requests": 4}).workload
    reqs = generate_requests(distribution_spec(rate=w.rate, num_requests=w.num_requests, seed=7,
                                               arrival=w.arrival, arrival_cv=w.arrival_cv))
    assert [r.arrival_us for r in reqs] == [333_333, 666_666, 999_999, 1_333_332]
    other_seed = generate_requests(distribution_spec(rate=3, num_requests=4, seed=8, arrival=w.arrival))
    assert [r.arrival_us for r in other_seed] == [r.arrival_us for r in reqs]
