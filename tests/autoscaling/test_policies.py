"""The built-in autoscaling policies, hand-checked (docs/control-plane.md, "Autoscaling")."""

from __future__ import annotations

import pytest

from blis_simpy.autoscaling import AutoscalePolicy, AutoscaleState, PoolState
from blis_simpy.errors import ConfigError
from blis_simpy.snapshot import InstanceSnapshot


def pool(*snaps, loading: int = 0, max_running: int = 10, lo: int = 1, hi: int = 10) -> PoolState:
    return PoolState("", tuple(snaps), len(snaps), loading, 0, lo, hi, max_running)


def snap(i: int, *, q: int = 0, b: int = 0, kv: float = 0.0) -> InstanceSnapshot:
    return InstanceSnapshot(f"instance_{i}", i, q, b, kv, 100, 0.0, 0, "")


def policy(name: str, **params) -> AutoscalePolicy:
    cls = AutoscalePolicy.lookup(name)
    return cls(cls.parse_params(params))


def at(p: PoolState, t_us: int) -> AutoscaleState:
    return AutoscaleState((p,), t_us)


def test_target_utilization_is_the_hpa_rule():
    pol = policy("target-utilization", metric="kv", target=0.6, scale_down_stabilization_s=0)
    # 2 instances at 90 %: ceil(2 x 0.9 / 0.6) = ceil(3.0) = 3
    assert pol.desired(at(pool(snap(0, kv=0.9), snap(1, kv=0.9)), 1)) == {"": 3}
    # 65 % is within 10 % of 60 % (ratio 1.083): no change
    assert pol.desired(at(pool(snap(0, kv=0.65), snap(1, kv=0.65)), 2)) == {"": 2}
    # a loading instance counts as idle: 2 serving at 0.9 + 1 loading -> mean 0.6: no change
    assert pol.desired(at(pool(snap(0, kv=0.9), snap(1, kv=0.9), loading=1), 3)) == {"": 3}
    # 3 instances at 10 %: ceil(0.3 / 0.6) = 1
    assert pol.desired(at(pool(snap(0, kv=0.1), snap(1, kv=0.1), snap(2, kv=0.1)), 4)) == {"": 1}


def test_batch_occupancy_metric():
    pol = policy("target-utilization", metric="batch", target=0.5, scale_down_stabilization_s=0)
    # batches 8 and 10 of 10: occupancy 1.8 over target 0.5 -> ceil(3.6) = 4
    assert pol.desired(at(pool(snap(0, b=8), snap(1, b=10)), 1)) == {"": 4}


def test_scale_down_waits_for_the_stabilization_window():
    pol = policy("queue-depth", target_per_instance=2, scale_down_stabilization_s=10)
    busy = pool(snap(0, q=9), snap(1, q=9))          # ceil(18 / 2) = 9
    idle = pool(*(snap(i) for i in range(9)))        # 0 queued: 0
    assert pol.desired(at(busy, 0)) == {"": 9}
    # within 10 s of the recommendation 9, the highest recommendation bounds the scale-down
    assert pol.desired(at(idle, 5_000_000)) == {"": 9}
    assert pol.desired(at(idle, 9_999_999)) == {"": 9}
    # 10 s after it (the window is (now - 10 s, now], as the HPA's "after the cutoff") only
    # the zeros remain
    assert pol.desired(at(idle, 10_000_000)) == {"": 0}


def test_queue_depth_per_instance_target():
    pol = policy("queue-depth", target_per_instance=2, scale_down_stabilization_s=0)
    # 9 waiting over 3 instances, 2 each: ceil(4.5) = 5
    assert pol.desired(at(pool(snap(0, q=5), snap(1, q=4), snap(2)), 1)) == {"": 5}


def test_scheduled_counts_by_time_of_day():
    pol = policy("scheduled", start_s=6 * 3600, schedule=[
        {"at_s": 8 * 3600, "instances": 4}, {"at_s": 20 * 3600, "instances": 2}])
    hour = 3_600_000_000
    assert pol.count_at(0) == 2                 # 06:00: yesterday's 20:00 entry
    assert pol.count_at(2 * hour - 1) == 2      # 07:59:59.999999
    assert pol.count_at(2 * hour) == 4          # 08:00
    assert pol.count_at(14 * hour) == 2         # 20:00
    assert pol.count_at(26 * hour) == 4         # 08:00 the next day
    assert pol.desired(at(pool(snap(0)), 3 * hour)) == {"": 4}


def test_bad_schedule_is_a_located_error():
    with pytest.raises(ConfigError) as exc:
        AutoscalePolicy.lookup("scheduled").parse_params(
            {"schedule": [{"at_s": 10, "instances": 1}, {"at_s": 5, "instances": 2}]},
            field="cluster.autoscaler.params")
    assert exc.value.field == "cluster.autoscaler.params.schedule"
    assert "increasing" in str(exc.value)


def test_queue_depth_counts_the_gateway_queue_for_the_pool_requests_enter_first():
    """One instance with an empty wait queue, 8 requests held in a gateway queue, target 4 per
    instance: ceil(8 / 4) = 2 for the one pool and for ``prefill``; the decode pool does not
    see them (they reach it only after their prefill)."""
    pol = policy("queue-depth", target_per_instance=4.0, scale_down_stabilization_s=0)
    assert pol.desired(AutoscaleState((pool(snap(0)),), 1, gateway_queued=8)) == {"": 2}
    pre = PoolState("prefill", (snap(0),), 1, 0, 0, 1, 10, 10)
    dec = PoolState("decode", (snap(1),), 1, 0, 0, 1, 10, 10)
    assert policy("queue-depth", target_per_instance=4.0, scale_down_stabilization_s=0).desired(
        AutoscaleState((pre, dec), 1, gateway_queued=8)) == {"prefill": 2, "decode": 0}


def test_a_schedule_naming_a_pool_the_deployment_lacks_is_refused():
    pol = policy("scheduled", schedule=[{"at_s": 0, "instances": 2},
                                        {"at_s": 60, "instances": {"decode": 3}}])
    assert pol.check_pools(["prefill", "decode"]) is None
    problem = pol.check_pools([""])
    assert "schedule[1]" in problem and "['decode']" in problem
