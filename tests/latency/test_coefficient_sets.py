"""Coefficient-set files: round trip, the backends they feed, and located errors."""

from __future__ import annotations

import pytest

from blis_simpy.config.scenario import LatencyConfig, Scenario
from blis_simpy.deploy.resolve import resolve
from blis_simpy.errors import ConfigError
from blis_simpy.latency.base import BatchView
from blis_simpy.latency.coefficient_sets import (
    AlphaBetaSet,
    load_physics_set,
    read_set,
    write_set,
)


def _scenario(**lat) -> Scenario:
    return Scenario(model="meta-llama/llama-3.1-8b", hardware="RTX-4090", tp=1,
                    latency=LatencyConfig(**lat))


def test_physics_set_round_trip_and_use(tmp_path):
    default = load_physics_set("", "default")[0]
    cs = default.model_copy(update=dict(name="t", gpu="RTX-4090", prefill_compute=2.0, decode_compute=2.0,
                                        step_cpu_us=500.0, fit={"command": "blis-simpy fit", "mape_pct": 1.5}))
    path = tmp_path / "set.yaml"
    write_set(path, cs, comment="fitted by a test")
    text = path.read_text()
    assert text.startswith("# fitted by a test\nbackend: physics\n")
    assert read_set(str(path)) == cs
    # the set reaches the backend: a pure decode step with a larger per-step cost
    base = resolve(_scenario(model="physics", coefficients="default"), quiet=True).new_latency_model()
    mine = resolve(_scenario(model="physics", coefficients=str(path)), quiet=True).new_latency_model()
    v = BatchView(decode_count=1, decode_tokens=1, decode_pi_sum=100, size=1)
    # decode at batch 1 is weight-bound, so only the fixed per-step cost differs
    assert mine.step_time_us(v) - base.step_time_us(v) in (373, 374, 375)  # 500 - 126.02


def test_alpha_beta_set_feeds_blackbox(tmp_path):
    path = tmp_path / "bb.yaml"
    write_set(path, AlphaBetaSet(backend="blackbox", alpha_coeffs=[0, 0, 0], beta_coeffs=[1000, 2, 30]))
    lat = resolve(_scenario(model="blackbox", coefficients=str(path)), quiet=True).new_latency_model()
    # beta0 + beta1 * prefill tokens + beta2 * decode tokens: 1000 + 2*100 = 1200 µs
    from blis_simpy.request import Request
    r = Request("a", 0, list(range(100)), [1, 2])
    r.num_new_tokens = 100
    assert lat.step_time_us(BatchView.of([r])) == 1200


def test_set_of_another_backend_is_refused(tmp_path):
    path = tmp_path / "bb.yaml"
    write_set(path, AlphaBetaSet(backend="blackbox", alpha_coeffs=[0, 0, 0], beta_coeffs=[1, 1, 1]))
    with pytest.raises(ConfigError, match="a blackbox coefficient set, but the latency backend is physics"):
        resolve(_scenario(model="physics", coefficients=str(path)), quiet=True)


@pytest.mark.parametrize("text, where", [
    ("backend: physics\nprefill_compute: -1\n", ":2: prefill_compute"),
    ("backend: physics\nbogus: 1\n", "bogus"),
    ("backend: blackbox\nalpha_coeffs: [0, 0, 0]\nbeta_coeffs: [1, .nan, 1]\n", "beta_coeffs"),
    ("- a list\n", "mapping"),
])
def test_bad_sets_name_file_line_field(tmp_path, text, where):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        read_set(str(path))
    assert str(path) in exc.value.one_line() and where in exc.value.one_line()


def test_missing_set_file():
    with pytest.raises(ConfigError, match="no such file"):
        read_set("/nonexistent/set.yaml")
