"""The autoscaling-policy family (docs/control-plane.md, "Autoscaling").

An autoscaling policy is a plain synchronous decider: every interval the autoscaler
(:mod:`blis_simpy.cluster.autoscaler`) hands it a read-only :class:`AutoscaleState` and asks
for the number of instances of each pool. Add one by subclassing (docs/extending.md)::

    class Double(AutoscalePolicy, name="double"):
        def desired(self, state):
            return {p.name: 2 * p.current for p in state.pools}

``desired`` returns ``{pool name: instances}`` or, with one pool, a plain int; the
autoscaler clamps each count to the pool's ``[min_instances, max_instances]``. Anything else
stops the run with the policy's one-line error (exit 2). An instance here is a configured
engine: with ``dp > 1`` it is ``dp`` ranks, and ``serving`` holds one snapshot per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from blis_simpy.plugins import Pluggable
from blis_simpy.snapshot import InstanceSnapshot


@dataclass(frozen=True, slots=True)
class PoolState:
    """One pool as the policy sees it at a decision.

    ``name``: ``""`` for the one pool of a deployment without prefill/decode pools.
    ``serving``: the snapshots of the serving instances' ranks (index order; queue depth,
    batch size, KV utilisation, requests in flight). ``serving_instances``, ``loading`` and
    ``draining``: instances in each state (a draining one takes no new request and stops
    counting when it holds none). ``max_num_running_reqs``: the batch cap of one rank (batch
    occupancy = ``batch_size / max_num_running_reqs``)."""

    name: str
    serving: tuple[InstanceSnapshot, ...]
    serving_instances: int
    loading: int
    draining: int
    min_instances: int
    max_instances: int
    max_num_running_reqs: int
    dp: int = 1

    @property
    def current(self) -> int:
        """Instances serving or loading (the count a decision changes)."""
        return self.serving_instances + self.loading

    def per_instance(self, values) -> list[float]:
        """``values`` (one per snapshot of ``serving``) averaged over each instance's ranks."""
        vals = list(values)
        dp = max(self.dp, 1)
        return [sum(vals[k:k + dp]) / dp for k in range(0, len(vals), dp)]


@dataclass(frozen=True, slots=True)
class AutoscaleState:
    """What an autoscaling policy sees: the pools, the clock (µs) and the requests waiting
    in the gateway queue in front of the cluster (0 without one, docs/control-plane.md)."""

    pools: tuple[PoolState, ...]
    clock_us: int
    gateway_queued: int = 0

    def pool(self, name: str = "") -> PoolState:
        """The pool called ``name`` (KeyError if there is none)."""
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


class AutoscalePolicy(Pluggable, family="autoscaling policy"):
    """Chooses the number of instances of each pool (see the module docstring).

    Constructor keyword every policy receives: ``interval_us``, the decision interval (µs).
    """

    def __init__(self, params=None, *, interval_us: int = 0, **_ignored):
        self.params = params if params is not None else type(self).Params()
        self.interval_us = interval_us

    def desired(self, state: AutoscaleState):
        """``{pool name: instances}``, or an int with one pool."""
        raise NotImplementedError

    def check_pools(self, names: list[str]) -> str | None:
        """Before the run: what is wrong with the policy's parameters for a deployment of the
        pools ``names`` (``[""]``, or ``["prefill", "decode"]``), or None."""
        return None
