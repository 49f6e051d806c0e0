"""SLO attainment and goodput (docs/metrics.md, "SLOs and goodput").

Targets are milliseconds. A request is judged only when it **completed** (it has an E2E):

* meets TTFT  ⇔ ``ttft_us ≤ ttft_ms · 1000``;
* meets ITL   ⇔ the request's **mean** inter-token latency (its decode time over its
  ``output − 1`` gaps, the per-request ``itl`` of the results rows; 0 for one output token)
  ``≤ itl_ms · 1000`` — the per-request TPOT SLO of DistServe and Vidur, not a per-token
  percentile;
* meets E2E   ⇔ ``e2e_us ≤ e2e_ms · 1000``;
* meets all   ⇔ it meets every target that is set (an unset target is met by every request).

Attainment is over the **offered** requests — every request that arrived at the cluster by the
end of the run — so a request that did not complete (rejected by admission or routing,
dropped, timed out, still queued or running at the horizon) is a violation of every target.
Goodput is the requests meeting all targets per second of simulated time (the time base of
``responses_per_sec``).

Targets may differ per SLO class: a class's own targets replace the default ones it sets
(:meth:`SLOSpec.targets_for`); requests without a class are class ``default``.

:class:`SLOTally` counts the met requests per class; it is filled from the cluster record at
the end of an exact run (:func:`tally_metrics`) or request by request as they leave under
``--streaming-metrics`` (the collector calls :meth:`SLOTally.add`): the counts are the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from blis_simpy.metrics.raw import DEFAULT_SLO_CLASS

__all__ = ["METRICS", "SLOReport", "SLOSpec", "SLOTally", "SLOTargets", "slo_report",
           "tally_metrics"]

#: the judged metrics, in output order (``all`` follows them)
METRICS = ("ttft", "itl", "e2e")


@dataclass(frozen=True, slots=True)
class SLOTargets:
    """TTFT, mean-ITL and E2E targets in ms; None = no target."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def any(self) -> bool:
        return self.ttft_ms is not None or self.itl_ms is not None or self.e2e_ms is not None

    def over(self, base: SLOTargets) -> SLOTargets:
        """These targets, each unset one taken from ``base``."""
        return SLOTargets(*(mine if mine is not None else theirs
                            for mine, theirs in zip(self.as_tuple(), base.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[float | None, float | None, float | None]:
        return self.ttft_ms, self.itl_ms, self.e2e_ms

    def meets(self, ttft_us, itl_us, e2e_us) -> tuple[bool, bool, bool]:
        """Whether one completed request meets each target (a missing TTFT fails a TTFT
        target; a missing ITL counts as 0, as in the results rows)."""
        t, i, e = self.as_tuple()
        return ((t is None or (ttft_us is not None and ttft_us <= t * 1000.0)),
                (i is None or (itl_us or 0.0) <= i * 1000.0),
                (e is None or e2e_us <= e * 1000.0))


@dataclass(frozen=True)
class SLOSpec:
    """Default targets and per-SLO-class overrides."""

    default: SLOTargets = field(default_factory=SLOTargets)
    classes: Mapping[str, SLOTargets] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """Any target set, by default or for a class."""
        return self.default.any() or any(t.any() for t in self.classes.values())

    def targets_for(self, slo_class: str) -> SLOTargets:
        """The targets of ``slo_class`` (empty = ``default``): its own over the defaults."""
        own = self.classes.get(slo_class or DEFAULT_SLO_CLASS)
        return own.over(self.default) if own is not None else self.default

    @classmethod
    def from_config(cls, cfg) -> SLOSpec:
        """From a scenario ``slo:`` section (``ttft_ms``, ``itl_ms``, ``e2e_ms``, ``classes``)."""
        if cfg is None:
            return cls()
        t = lambda c: SLOTargets(c.ttft_ms, c.itl_ms, c.e2e_ms)  # noqa: E731
        return cls(t(cfg), {k: t(v) for k, v in (cfg.classes or {}).items()})


class SLOTally:
    """Per SLO class: ``[completed, met TTFT, met ITL, met E2E, met all]``."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def add(self, spec: SLOSpec, slo_class: str, ttft_us, itl_us, e2e_us) -> None:
        """One completed request of ``slo_class`` (empty = ``default``); times in µs."""
        cls = slo_class or DEFAULT_SLO_CLASS
        row = self.counts.get(cls)
        if row is None:
            row = self.counts[cls] = [0, 0, 0, 0, 0]
        ok = spec.targets_for(cls).meets(ttft_us, itl_us, e2e_us)
        row[0] += 1
        row[1] += ok[0]
        row[2] += ok[1]
        row[3] += ok[2]
        row[4] += ok[0] and ok[1] and ok[2]

    def merge(self, other: SLOTally) -> None:
        for cls, theirs in other.counts.items():
            mine = self.counts.setdefault(cls, [0, 0, 0, 0, 0])
            for k, n in enumerate(theirs):
                mine[k] += n


def tally_metrics(m, spec: SLOSpec) -> SLOTally:
    """The tally of a finished record ``m`` (an ``InstanceMetrics``, the cluster's): every
    request with an E2E is a completed one; its class comes from its registry row. Under
    ``--streaming-metrics`` the streamed tally (``m.streaming.slo_tally``) is returned."""
    st = m.streaming
    if st is not None and st.slo_tally is not None:
        return st.slo_tally
    tally = SLOTally()
    reg, ttft, itl = m.registry, m.ttft, m.itl
    for rid in sorted(m.e2e):
        req = reg.get(rid)
        tally.add(spec, req.slo_class if req is not None else "", ttft.get(rid), itl.get(rid),
                  m.e2e[rid])
    return tally


# ------------------------------------------------------------------------------ report
@dataclass
class SLOScope:
    """Attainment of one scope (all requests, or one class)."""

    targets: SLOTargets
    offered: int = 0
    completed: int = 0
    met: tuple[int, int, int, int] = (0, 0, 0, 0)      # ttft, itl, e2e, all
    goodput_rps: float = 0.0
    #: which metrics have a target for some request of the scope
    judged: tuple[bool, bool, bool] = (False, False, False)

    def attainment_pct(self) -> dict[str, float | None]:
        """Per metric and ``all``: 100 · met / offered (None for an unjudged metric; 0 for
        no offered request)."""
        out: dict[str, float | None] = {}
        for k, name in enumerate((*METRICS, "all")):
            if k < 3 and not self.judged[k]:
                out[name] = None
            else:
                out[name] = 100.0 * self.met[k] / self.offered if self.offered else 0.0
        return out

    def to_dict(self) -> dict:
        return {
            "ttft_ms": self.targets.ttft_ms,
            "itl_ms": self.targets.itl_ms,
            "e2e_ms": self.targets.e2e_ms,
            "offered_requests": self.offered,
            "completed_requests": self.completed,
            "met_requests": dict(zip((*METRICS, "all"), self.met, strict=True)),
            "attainment_pct": self.attainment_pct(),
            "goodput_rps": self.goodput_rps,
        }


@dataclass
class SLOReport:
    """The ``"slo"`` section: the overall scope and one per SLO class (sorted)."""

    overall: SLOScope
    per_class: dict[str, SLOScope]

    def to_dict(self) -> dict:
        return self.overall.to_dict() | {
            "per_class": {k: v.to_dict() for k, v in self.per_class.items()}}


def slo_report(spec: SLOSpec, tally: SLOTally, offered_by_class: Mapping[str, int],
               duration_s: float) -> SLOReport:
    """Attainment and goodput from ``tally``, the requests offered per class and the simulated
    duration (seconds; goodput is 0 when it is 0). Classes are the union of both (sorted)."""
    classes = sorted(set(tally.counts) | {k or DEFAULT_SLO_CLASS for k in offered_by_class})
    offered = {}
    for k, n in offered_by_class.items():
        cls = k or DEFAULT_SLO_CLASS
        offered[cls] = offered.get(cls, 0) + n

    def rate(n: int) -> float:
        return n / duration_s if duration_s > 0 and math.isfinite(duration_s) else 0.0

    per_class = {}
    totals = [0, 0, 0, 0, 0]
    judged = [False, False, False]
    for cls in classes:
        targets = spec.targets_for(cls)
        row = tally.counts.get(cls, [0, 0, 0, 0, 0])
        j = tuple(t is not None for t in targets.as_tuple())
        per_class[cls] = SLOScope(targets, offered.get(cls, 0), row[0], tuple(row[1:]),
                                  rate(row[4]), j)
        for k in range(5):
            totals[k] += row[k]
        judged = [a or b for a, b in zip(judged, j, strict=True)]
    n_offered = sum(offered.values())
    overall = SLOScope(spec.default, n_offered, totals[0], tuple(totals[1:]), rate(totals[4]),
                       tuple(judged) if classes else tuple(t is not None for t in spec.default.as_tuple()))
    return SLOReport(overall, per_class)
