"""Every offered request is in exactly one end state when a run ends (request conservation
as reported): completed + queued + running + in the control plane (admission/routing
latency) + in the latency model's queueing delay + not yet arrived + dropped + timed out +
rejected = offered. Requests inside a latency used to appear in no counter."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from blis_simpy.cli.app import app
from blis_simpy.cluster.invariants import RequestEndStates, check_end_states
from blis_simpy.config.scenario import Scenario
from blis_simpy.errors import InvariantError
from blis_simpy.run.simulation import Simulation
from tests.cli.support import trace_row, write_trace_files
from tests.cluster.helpers import BETA, request

# Request i arrives at i x 100 ms, spends 400 ms in admission, 0 in routing, then 500 ms in
# the queueing delay (alpha0); the horizon is 1 s. At 1 s: requests 7, 8, 9 (admitted at
# 1.1 s and later) are in the control plane; 2..6 (routed at 0.6..1.0 s, enqueued at
# 1.1..1.5 s) in the queueing delay; 0 (enqueued at 0.9 s, 4 steps of ~5 ms) completed; 1
# (enqueued at exactly 1 s, its first step starts then) running.
SCENARIO = """\
model: m
horizon_us: 1000000
latency:
  model: blackbox
  alpha_coeffs: [500000.0, 0.0, 0.0]
  beta_coeffs: [5000.0, 10.0, 100.0]
engine:
  total_kv_blocks: 2000
cluster:
  admission_latency_us: 400000
workload:
  kind: trace
  header: trace.yaml
  data: trace.csv
"""
EXPECTED = {"offered": 10, "completed": 1, "still_queued": 0, "still_running": 1,
            "still_in_control_plane": 3, "still_in_queueing_delay": 5, "not_arrived": 0,
            "dropped_unservable": 0, "timed_out": 0, "rejected_admission": 0,
            "rejected_routing": 0}


@pytest.fixture
def run_cli(tmp_path):
    write_trace_files(tmp_path, [trace_row(i, 100_000 * i, 32, 4) for i in range(10)])
    sc = tmp_path / "scenario.yaml"
    sc.write_text(SCENARIO)
    runner = CliRunner()
    log = logging.getLogger("blis_simpy")
    saved = (log.level, log.propagate, log.handlers[:])
    yield lambda *args: runner.invoke(app, ["run", "--scenario", str(sc), *map(str, args)])
    log.setLevel(saved[0])          # the CLI's --log set-up points at the runner's stderr
    log.propagate = saved[1]
    log.handlers[:] = saved[2]


def test_requests_inside_a_latency_are_counted_in_the_json(run_cli):
    res = run_cli("--format", "json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["request_accounting"] == EXPECTED
    assert "in flight at the end" not in res.stderr    # in flight = queued + running + delayed


def test_requests_inside_a_latency_are_counted_in_the_table(run_cli):
    res = run_cli("--format", "table")
    assert res.exit_code == 0, res.stderr
    rows = {}
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    assert (rows["Still queued"], rows["Still running"], rows["Still in control plane"],
            rows["Still in queueing delay"]) == ("0", "1", "3", "5")
    assert "Not arrived (after the horizon)" not in rows


def test_blis_format_is_unchanged(run_cli):
    res = run_cli("--format", "blis")
    assert res.exit_code == 0, res.stderr
    assert "control plane" not in res.stdout and "request_accounting" not in res.stdout


def test_a_broken_balance_is_an_invariant_error():
    end = RequestEndStates(10, 4, 0, 1, 0, 0, 0, 0, 0, 0, 0)
    with pytest.raises(InvariantError, match=r"offered 10 != completed 4 \+ still queued 0 \+ "
                                             r"still running 1 \+ still in control plane 0"):
        check_end_states(end)


def _scenario(alpha0_us: int, admission_us: int, routing_us: int, pd: bool) -> Scenario:
    data = {
        "model": "m",
        "latency": {"model": "blackbox", "alpha_coeffs": [float(alpha0_us), 0.0, 0.0],
                    "beta_coeffs": BETA},
        "engine": {"total_kv_blocks": 2000, "max_num_running_reqs": 2},
        "cluster": {"num_instances": 3 if pd else 2, "admission_latency_us": admission_us,
                    "routing_latency_us": routing_us},
    }
    if pd:
        data["disaggregation"] = {"prefill_instances": 1, "decode_instances": 2,
                                  "decider": {"policy": "always"}}
    return Scenario.model_validate(data)


@settings(max_examples=60)
@given(n=st.integers(0, 12), gap_us=st.integers(0, 200_000), horizon_us=st.integers(1, 2_000_000),
       alpha0_us=st.integers(0, 1_000_000), admission_us=st.integers(0, 500_000),
       routing_us=st.integers(0, 500_000), pd=st.booleans(), late=st.integers(0, 3))
def test_every_offered_request_is_in_one_end_state(n, gap_us, horizon_us, alpha0_us, admission_us,
                                                     routing_us, pd, late):
    """Random horizons and latencies (PD pools or not; some requests arriving after the
    horizon): the run's own check holds, and the states add up to the offered requests."""
    reqs = [request(i, arrival=i * gap_us, n_in=48, n_out=3) for i in range(n)]
    reqs += [request(n + j, arrival=horizon_us + 1 + j, n_in=48, n_out=3) for j in range(late)]
    sim = Simulation(_scenario(alpha0_us, admission_us, routing_us, pd), reqs, horizon_us=horizon_us)
    end = sim.run().end_states
    assert end.offered == n + late
    assert end.not_arrived == sum(r.arrival_us > horizon_us for r in reqs) >= late
    assert all(v >= 0 for v in end.to_dict().values())
    assert end.accounted() == end.offered
