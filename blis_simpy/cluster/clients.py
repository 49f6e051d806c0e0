"""Closed-loop clients (docs/workloads.md, "Closed-loop clients").

``N`` clients share a request pool: the requests of the workload source (a distribution, a
preset, a workload spec or a trace) in their order. Client ``k`` (0-based) sends the next
request of the pool, with its arrival time replaced by the send time (and a deadline moved
with it), and sends again when that request has ended — completed (also length-capped),
timed out, dropped, or rejected by admission or routing — plus a think time. So the j-th
request sent is the j-th of the source; the pool's end (or ``num_requests``) ends the load.

**Stages** (``concurrency_stages``): stage ``i`` runs ``concurrency_i`` clients for its
duration, one stage after the other from 0; after the last stage no client sends. Client
``k`` is active at time ``t`` when ``k`` is below the concurrency of the stage holding ``t``.
A client decides at each send: active ⇒ it sends; not active ⇒ it waits, and the first stage
boundary at which it is active again sends for it (an in-flight request is never cancelled:
a lower concurrency takes effect as requests end). ``concurrency: N`` is one endless stage.

**Think times** are integer µs drawn from the ``think-time`` stream
(:func:`blis_simpy.rng.derive_seed` of the workload seed; one generator for the run, drawn
in the order requests end): ``constant`` ``round(mean_ms × 1000)``; ``exponential`` a unit
exponential × mean, truncated; ``lognormal`` ``exp(μ + σZ)`` with ``μ = ln(mean) − σ²/2``
(so its mean is ``mean``), truncated.

**How terminal events arrive.** The manager takes the closed-loop session manager's place in
the cluster (``Cluster.sessions``): the cluster hands it every terminal event
(:meth:`on_request_done`; with PD pools the parent's, at parent completion or failure) and
every rejection (:meth:`on_request_rejected`), as it does for sessions. A send is a keyed
event (:data:`blis_simpy.des.FOLLOWUP_ARRIVAL`) at the send time that runs the request's
``ClusterArrival`` (``Cluster.client_arrival``). Times are integer µs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from blis_simpy.des import FOLLOWUP_ARRIVAL
from blis_simpy.units import MAX_INT64

__all__ = ["ClosedLoopClients", "ThinkTimeSampler"]


@dataclass(frozen=True, slots=True)
class ThinkTimeSampler:
    """Think times in integer µs: ``dist`` constant | exponential | lognormal, mean ``mean_ms``
    milliseconds, ``sigma`` the lognormal's standard deviation of the log."""

    dist: str = "constant"
    mean_ms: float = 0.0
    sigma: float = 1.0

    def draw_us(self, rng: np.random.Generator) -> int:
        mean_us = self.mean_ms * 1000.0
        if self.dist == "constant":
            return int(math.floor(mean_us + 0.5))
        if self.dist == "exponential":
            x = rng.standard_exponential() * mean_us
        elif self.dist == "lognormal":
            mu = math.log(mean_us) - self.sigma * self.sigma / 2.0
            x = math.exp(min(mu + self.sigma * rng.standard_normal(), 700.0))
        else:
            raise ValueError(f"unknown think-time distribution {self.dist!r}")
        return int(min(x, MAX_INT64 // 4))


class ClosedLoopClients:
    """The clients of a closed-loop run (module docstring).

    ``pool``: the requests to send, in order; ``stages``: ``[(concurrency, duration_us)]``
    (a duration of MAX_INT64: endless); ``think``: the think-time sampler and ``rng`` its
    generator; ``max_requests``: a cap on the requests sent (0: the pool's end)."""

    def __init__(self, pool: Iterable, stages: list[tuple[int, int]], think: ThinkTimeSampler,
                 rng: np.random.Generator, *, max_requests: int = 0):
        self._pool = iter(pool)
        self._left = max_requests if max_requests > 0 else -1
        self.think = think
        self.rng = rng
        #: (start µs, end µs, concurrency) of each stage
        self.stages: list[tuple[int, int, int]] = []
        t = 0
        for conc, dur in stages:
            end = MAX_INT64 if dur >= MAX_INT64 - t else t + dur
            self.stages.append((t, end, conc))
            t = end
        self.clients = max((c for _, _, c in self.stages), default=0)
        self._waiting = list(range(self.clients))     # a heap of clients waiting for a stage
        self._client_of: dict[str, int] = {}          # in-flight request ID -> its client
        self._stage = 0                               # the stage of the last lookup
        self.exhausted = False                        # the pool (or the cap) has run out
        #: every request sent, in send order (arrival = send time)
        self.followups: list = []
        self.env = None
        self._arrive = None

    # ------------------------------------------------------------------ wiring
    def attach(self, cluster) -> None:
        """Start on ``cluster``'s clock: each stage boundary is a keyed event at which the
        waiting clients the stage makes active send."""
        self.env = cluster.env
        self._arrive = cluster.client_arrival
        for i, (start, _, _) in enumerate(self.stages):
            if start <= cluster.env.horizon_us:
                self.env.call_at(start, FOLLOWUP_ARRIVAL, self._boundary, i)

    def concurrency_at(self, t_us: int) -> int:
        """The concurrency of the stage holding ``t_us`` (0 after the last)."""
        st = self.stages
        i = self._stage
        if i >= len(st) or t_us < st[i][0]:
            i = 0
        while i < len(st) and t_us >= st[i][1]:
            i += 1
        self._stage = i
        return st[i][2] if i < len(st) else 0

    # ------------------------------------------------------------------ sends
    def _boundary(self, i: int) -> None:
        conc = self.stages[i][2]
        waiting = self._waiting
        while waiting and waiting[0] < conc and not self.exhausted:
            self._send(heapq.heappop(waiting))

    def _send(self, k: int) -> None:
        """Client ``k`` sends the next pool request now (or stops: the pool has run out)."""
        now = self.env.now
        if self.exhausted or k >= self.concurrency_at(now):
            if not self.exhausted:
                heapq.heappush(self._waiting, k)
            return
        req = next(self._pool, None) if self._left != 0 else None
        if req is None:
            self.exhausted = True
            return
        self._left -= 1
        shift = now - req.arrival_us
        req.arrival_us = req.origin_us = now
        if req.deadline_us > 0:
            req.deadline_us += shift
        self._client_of[req.id] = k
        self.followups.append(req)
        self._arrive(req)

    def _ended(self, req, tick_us: int) -> None:
        k = self._client_of.pop(req.id, None)
        if k is None:
            return
        at = tick_us + self.think.draw_us(self.rng)
        if at <= self.env.horizon_us and not self.exhausted:
            self.env.call_at(max(at, self.env.now), FOLLOWUP_ARRIVAL, self._send, k)

    # ------------------------------------------------------------------ the cluster's calls
    def on_request_done(self, req, tick_us: int) -> list:
        """A request ended (completed, timed out or dropped) at ``tick_us``: its client thinks,
        then sends again. Sends are scheduled here, so nothing is returned for the cluster to
        submit. Events for requests no client sent (PD sub-requests) are ignored."""
        self._ended(req, tick_us)
        return []

    def on_request_rejected(self, req, tick_us: int) -> None:
        """A request was rejected by admission or routing: it frees its client as an end does."""
        self._ended(req, tick_us)

    def finalize(self, *, stopped_at_horizon: bool, end_us: int = -1):
        """End of the run: nothing to settle (no session counters)."""
        return None
