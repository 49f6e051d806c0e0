"""Generation that untrusted input could make endless stops with one located error."""

from __future__ import annotations

import pytest

from blis_simpy.errors import ConfigError
from blis_simpy.workload import WorkloadSpecV2, generate_workload, generator


def test_a_session_of_endless_rounds_past_its_cap_stops(monkeypatch):
    """num_requests 1 caps the client at a few requests, but one session's rounds are not cut
    by that cap (BLIS truncates afterwards): with 10**9 rounds it would fill memory. The guard
    stops it once the client is 2 x MAX_REQUESTS past its cap (MAX_REQUESTS lowered to 5 here:
    the real one is 10,000,000)."""
    monkeypatch.setattr(generator, "MAX_REQUESTS", 5)
    spec = WorkloadSpecV2.model_validate({
        "version": "2", "aggregate_rate": 1.0, "num_requests": 1, "clients": [{
            "id": "c", "rate_fraction": 1.0, "arrival": {"process": "constant"},
            "input_distribution": {"type": "constant", "params": {"value": 4}},
            "output_distribution": {"type": "constant", "params": {"value": 1}},
            "reasoning": {"multi_turn": {"max_rounds": 10**9, "single_session": True}},
            "closed_loop": False}]})
    with pytest.raises(ConfigError) as e:
        generate_workload(spec)
    assert e.value.field == "client[0]"
    assert "generates more than 5 requests (the limit" in e.value.problem
    # 12 rounds stay under the guard (the cap, 2, + 2 x 10): generated, then cut to num_requests
    monkeypatch.setattr(generator, "MAX_REQUESTS", 10)
    spec.clients[0].reasoning.multi_turn.max_rounds = 12
    assert len(generate_workload(spec).requests) == 1
