"""Admission policies (docs/control-plane.md): exact token-bucket arithmetic, tier-shed thresholds."""

from __future__ import annotations

import pytest

from blis_simpy.admission import AdmissionPolicy, AlwaysAdmit, RejectAll, TierShed, TokenBucket
from blis_simpy.errors import ConfigError
from blis_simpy.run.simulation import Simulation
from tests.cluster.helpers import request, scenario, snap, state


def bucket(capacity, rate) -> TokenBucket:
    return TokenBucket(TokenBucket.parse_params({"capacity": capacity, "refill_rate": rate}))


def admit(policy, n_in, clock=0, *snaps, slo=""):
    return policy.admit(request(0, n_in=n_in, slo=slo), state(*snaps, clock=clock))


def test_token_bucket_starts_full_and_charges_prompt_length():
    tb = bucket(100, 1000)
    assert admit(tb, 60) == (True, "")
    assert tb.tokens == 40.0
    assert admit(tb, 50) == (False, "insufficient tokens")
    assert tb.tokens == 40.0                      # a rejection costs nothing
    assert admit(tb, 40) == (True, "")
    assert tb.tokens == 0.0


def test_token_bucket_refill_arithmetic_is_exact():
    tb = bucket(100, 1000)                        # 1000 tokens/s = 1 token per ms
    admit(tb, 100)
    assert admit(tb, 10, 9_999) == (False, "insufficient tokens")
    assert tb.tokens == 9_999 * 1000 / 1e6 and tb.last_us == 9_999
    assert admit(tb, 10, 10_000) == (True, "")    # 9.999 + 0.001 = 10 (up to float rounding)
    assert tb.tokens == pytest.approx(0.0, abs=1e-12)
    tb2 = bucket(50, 3)
    admit(tb2, 50)
    admit(tb2, 1, 7)                              # 7 µs at 3 tokens/s
    assert tb2.tokens == float(7) * 3.0 / 1e6
    assert tb2.last_us == 7


def test_token_bucket_caps_at_capacity_and_ignores_time_going_nowhere():
    tb = bucket(100, 1000)
    admit(tb, 30, 1_000)                          # refill capped: still 100 before the charge
    assert tb.tokens == 70.0
    assert admit(tb, 80, 10**12) == (True, "")
    assert tb.tokens == 20.0
    tb.tokens = 5.0
    admit(tb, 1000, 10**12)                       # same clock: no refill
    assert tb.tokens == 5.0


@pytest.mark.parametrize("params", [{"capacity": 0}, {"refill_rate": -1}, {"capacity": float("inf")},
                                    {"refill_rate": float("nan")}, {"burst": 3}])
def test_token_bucket_params_are_validated(params):
    with pytest.raises(ConfigError):
        TokenBucket.parse_params(params)


def test_reject_all_and_always_admit():
    assert RejectAll().admit(request(0), state(snap(0))) == (False, "reject-all")
    assert AlwaysAdmit().admit(request(0), state()) == (True, "")
    assert AdmissionPolicy.lookup("") is AlwaysAdmit


def tier(threshold, min_priority) -> TierShed:
    return TierShed(TierShed.parse_params({"threshold": threshold, "min_priority": min_priority}))


def test_tier_shed_admits_everyone_at_or_below_the_threshold():
    ts = tier(5, 4)
    loaded = (snap(0, q=2, b=2, inflight=1), snap(1, q=1))       # max effective load 5
    for cls in ("critical", "standard", "sheddable", "", "weird"):
        assert admit(ts, 10, 0, *loaded, slo=cls)[0]
    assert admit(ts, 10, 0, slo="sheddable")[0]                   # no snapshot: load 0


def test_tier_shed_sheds_below_min_priority_above_the_threshold():
    ts = tier(5, 3)
    loaded = (snap(0, q=3, b=2, inflight=1), snap(1))              # max effective load 6
    assert admit(ts, 10, 0, *loaded, slo="critical") == (True, "")
    assert admit(ts, 10, 0, *loaded, slo="standard") == (True, "")
    assert admit(ts, 10, 0, *loaded, slo="") == (True, "")          # empty = standard (3)
    assert admit(ts, 10, 0, *loaded, slo="sheddable") == (
        False, "tier-shed: class=sheddable priority=2 < min=3 load=6")
    assert admit(ts, 10, 0, *loaded, slo="batch") == (True, "")     # always admitted
    assert admit(ts, 10, 0, *loaded, slo="background") == (True, "")
    strict = tier(0, 4)
    assert admit(strict, 10, 0, snap(0, inflight=1), slo="standard") == (
        False, "tier-shed: class=standard priority=3 < min=4 load=1")
    assert admit(strict, 10, 0, snap(0, inflight=1), slo="mystery")[1].startswith(
        "tier-shed: class=mystery priority=3")


def test_tier_shed_defaults_and_validation():
    p = TierShed.parse_params({})
    assert (p.threshold, p.min_priority) == (0, 3)
    for bad in ({"threshold": -1}, {"min_priority": 5}, {"min_priority": -1}):
        with pytest.raises(ConfigError):
            TierShed.parse_params(bad)


def test_tier_shed_counts_sheds_per_class_in_the_cluster():
    # one instance, long outputs: the queue builds up and sheddable/standard get shed
    sc = scenario(n=1, admission="tier-shed", admission_params={"threshold": 1, "min_priority": 4},
                  max_running=1)
    classes = ["critical", "", "sheddable", "batch", "standard", "critical"]
    reqs = [request(i, arrival=i * 10, n_in=32, n_out=50, slo=c) for i, c in enumerate(classes)]
    res = Simulation(sc, reqs).run()
    c = res.counters
    # loads seen at admission: 0, 1, 2, 3, 3, ... -> request_1 ("") admitted at load 1
    assert c.shed_by_tier == {"sheddable": 1, "standard": 1}
    assert c.rejected_by_admission == 2
    assert c.routed == 4
