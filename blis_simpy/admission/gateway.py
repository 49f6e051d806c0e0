"""The gateway-policy family: the decisions of the gateway queue (docs/control-plane.md,
"Gateway queue").

The gateway queue (:mod:`blis_simpy.cluster.gateway`) holds admitted requests before routing;
what it holds and what leaves next is decided here, by a plain synchronous object:

* :meth:`GatewayPolicy.flow` and :meth:`GatewayPolicy.band` — the fair-share flow (tenant or
  SLO class) and the priority band (BLIS's and llm-d's SLO priority map) of a request;
* :meth:`GatewayPolicy.rank` — the order inside a flow (smaller leaves first): ``fifo``,
  ``priority`` or ``slo-deadline``;
* :meth:`GatewayPolicy.has_room` — flow control: may a request leave for the router now?
* :meth:`GatewayPolicy.pick` — which flow's head leaves next (weighted fair share);
* :meth:`GatewayPolicy.victim` — when the queue is full, which request is shed.

A user subclasses it from a scenario file (``cluster.gateway.policy``), as routers::

    class Newest(StandardGateway, name="newest-first"):
        def rank(self, req, seq, now_us):
            return (-seq,)

Times are integer µs.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from blis_simpy.plugins import Pluggable
from blis_simpy.snapshot import RouterState

#: SLO class -> priority band: llm-d's (gateway-api-inference-extension) and BLIS's default map
#: (inference-sim ``sim.DefaultSLOPriorityMap``); empty or unknown classes are ``standard``.
#: Negative bands are sheddable (GIE's ``IsSheddable``).
SLO_BANDS = {"critical": 4, "standard": 3, "batch": -1, "sheddable": -2, "background": -3}
DEFAULT_BAND = 3
#: the flow of a request without a tenant (or class), as BLIS names it
DEFAULT_FLOW = "default"
#: the deadline of a request whose class has no TTFT target: after every request with one
NO_DEADLINE_US = 2**62


@dataclass(frozen=True, slots=True)
class Queued:
    """One request waiting in the gateway: ``seq`` is its place in the gateway's arrival
    order (1, 2, ...), ``enqueue_us`` when it entered, ``rank`` its order key (smaller leaves
    first)."""

    req: object
    seq: int
    enqueue_us: int
    flow: str
    band: int
    rank: tuple


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The gateway's scenario keys a policy decides with (``cluster.gateway``; the units of
    docs/scenarios.md) and the TTFT budget of each SLO class, µs (``None``: no target)."""

    order: str = "fifo"
    shed: str = "arriving"
    detector: str = "never"
    max_concurrency: int = 100
    queue_depth_threshold: float = 5.0
    kv_util_threshold: float = 0.8
    fair_key: str = "tenant"
    fair_share: bool = False
    weights: tuple[tuple[str, float], ...] = ()
    default_weight: float = 1.0
    ttft_budget_us: tuple[tuple[str, int], ...] = ()
    default_ttft_budget_us: int | None = None


class GatewayPolicy(Pluggable, family="gateway policy"):
    """Root of the family; :class:`StandardGateway` (``standard``) is the built-in one."""

    #: True when :meth:`has_room` reads instance state that changes between completions (a
    #: KV or queue signal): the queue then re-checks every ``dispatch_tick_us`` while it holds
    #: requests, as BLIS's gateway dispatch tick does
    polls: bool = False

    def __init__(self, settings: GatewaySettings | None = None, params=None, **_ignored):
        self.settings = settings if settings is not None else GatewaySettings()
        self.params = params if params is not None else type(self).Params()

    def flow(self, req) -> str:
        raise NotImplementedError

    def band(self, req) -> int:
        raise NotImplementedError

    def rank(self, req, seq: int, now_us: int) -> tuple:
        raise NotImplementedError

    def has_room(self, state: RouterState, pending: int) -> bool:
        raise NotImplementedError

    def pick(self, heads: list[Queued]) -> Queued:
        raise NotImplementedError

    def victim(self, queued: list[Queued], arriving: Queued) -> Queued | None:
        raise NotImplementedError

    def sheds_queued(self) -> bool:
        """May :meth:`victim` name a queued request? False: the arriving one is shed without
        asking (the queue then need not list its requests)."""
        return True

    def enqueued(self, entry: Queued, flow_was_empty: bool) -> None:
        """``entry`` entered the queue (``flow_was_empty``: its flow held nothing before)."""

    def dispatched(self, entry: Queued) -> None:
        """``entry`` left the queue for the router."""


class StandardGateway(GatewayPolicy, name="standard"):
    """The scenario's ``order``, ``detector``, ``fair_share`` and ``shed`` (docs/control-plane.md,
    "Gateway queue").

    Fair share is weighted fair queueing over flows by virtual finish time (the start-time
    fair queueing of stride scheduling): each flow ``f`` keeps a virtual time ``v_f``; the
    flow with the smallest ``v_f + 1/w_f`` sends its head and ``v_f`` grows by ``1/w_f``; a
    flow that becomes backlogged starts at ``max(v_f, V)``, ``V`` the virtual time of the last
    request sent, so an idle tenant banks no credit. Ties: the smaller head rank, then the
    flow name. Exact rationals (:class:`fractions.Fraction`): no rounding decides a tie.
    """

    def __init__(self, settings: GatewaySettings | None = None, params=None, **kw):
        super().__init__(settings, params, **kw)
        s = self.settings
        self.polls = s.detector == "utilization"
        self._weights = {k: Fraction(v) for k, v in s.weights}
        self._default_w = Fraction(s.default_weight)
        self._budget = dict(s.ttft_budget_us)
        self._vt: dict[str, Fraction] = {}
        self._vnow = Fraction(0)

    # ------------------------------------------------------------------ classification
    def flow(self, req) -> str:
        key = req.tenant_id if self.settings.fair_key == "tenant" else req.slo_class
        return key or DEFAULT_FLOW

    def band(self, req) -> int:
        return SLO_BANDS.get(req.slo_class, DEFAULT_BAND)

    def deadline_us(self, req) -> int:
        """Arrival + the TTFT target of the request's class (llm-d's SLO-deadline ordering:
        received time + TTFT SLO); no target: :data:`NO_DEADLINE_US`."""
        budget = self._budget.get(req.slo_class or DEFAULT_FLOW, self.settings.default_ttft_budget_us)
        return NO_DEADLINE_US if budget is None else req.arrival_us + budget

    def rank(self, req, seq: int, now_us: int) -> tuple:
        order = self.settings.order
        if order == "priority":
            return (-self.band(req), seq)
        if order == "slo-deadline":
            return (self.deadline_us(req), seq)
        return (seq,)

    # ------------------------------------------------------------------ flow control
    def has_room(self, state: RouterState, pending: int) -> bool:
        """BLIS's and GIE's saturation detectors; ``pending`` requests have left the queue and
        not yet reached the router (inside the routing latency), counted as in flight.

        * ``never``: always;
        * ``concurrency``: ``(Σ in-flight + pending) / (instances × max_concurrency) < 1``;
        * ``utilization``: the mean over instances of ``max(queue depth / queue_depth_threshold,
          KV utilisation / kv_util_threshold) < 1``."""
        s = self.settings
        snaps = state.snapshots
        if s.detector == "never":
            return True
        if not snaps:
            return False
        if s.detector == "concurrency":
            return sum(x.in_flight_requests for x in snaps) + pending < len(snaps) * s.max_concurrency
        total = sum(max(x.queue_depth / s.queue_depth_threshold, x.kv_utilization / s.kv_util_threshold)
                    for x in snaps)
        return total < len(snaps)

    # ------------------------------------------------------------------ fair share
    def weight(self, flow: str) -> Fraction:
        return self._weights.get(flow, self._default_w)

    def enqueued(self, entry: Queued, flow_was_empty: bool) -> None:
        if self.settings.fair_share and flow_was_empty:
            f = entry.flow
            self._vt[f] = max(self._vt.get(f, self._vnow), self._vnow)

    def pick(self, heads: list[Queued]) -> Queued:
        """The next request to leave, among the head of every flow that may send. ``priority``
        order: only the highest band present competes. Without fair share the smallest rank
        wins (llm-d's global-strict fairness); with it, the smallest virtual finish time."""
        if self.settings.order == "priority":
            top = max(h.band for h in heads)
            heads = [h for h in heads if h.band == top]
        if not self.settings.fair_share:
            return min(heads, key=lambda h: (h.rank, h.flow))
        vt = self._vt
        return min(heads, key=lambda h: (vt.get(h.flow, self._vnow) + 1 / self.weight(h.flow),
                                         h.rank, h.flow))

    def dispatched(self, entry: Queued) -> None:
        if self.settings.fair_share:
            f = entry.flow
            start = self._vt.get(f, self._vnow)
            self._vnow = max(self._vnow, start)
            self._vt[f] = start + 1 / self.weight(f)

    # ------------------------------------------------------------------ shedding
    def sheds_queued(self) -> bool:
        return self.settings.shed == "lowest"

    def victim(self, queued: list[Queued], arriving: Queued) -> Queued | None:
        """The queue is full: ``None`` sheds the arriving request (``shed: arriving``, llm-d's
        and BLIS's default). ``shed: lowest`` (BLIS's ``--queue-shedding``): the queued request
        in a sheddable band (< 0) with the lowest band, then the largest rank (the latest
        deadline or arrival: the one that would leave last), is shed instead when the arriving
        request outranks it (a higher band, or the same band and a smaller rank)."""
        if self.settings.shed != "lowest":
            return None
        worst = None
        for e in queued:
            if e.band < 0 and (worst is None or (e.band, _neg(e.rank)) < (worst.band, _neg(worst.rank))):
                worst = e
        if worst is None:
            return None
        if arriving.band > worst.band or (arriving.band == worst.band and arriving.rank < worst.rank):
            return worst
        return None


def _neg(rank: tuple) -> tuple:
    """A rank that sorts the other way (ranks are tuples of integers)."""
    return tuple(-x for x in rank)
