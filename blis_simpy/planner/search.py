"""``plan``: the cheapest deployment that meets the SLOs, and the highest rate one sustains.

**(a) Cheapest deployment** (:func:`search_cheapest`). The space is a set of families
(:class:`~blis_simpy.planner.candidates.Family`: GPU × TP × DP × EP × split shape, one
instance count free). Assumption: within a family, meeting the SLOs is **monotone in the
count** — at a fixed arrival rate, one more instance never turns a passing deployment into a
failing one. Then each family's cheapest passing count is found by bisection (a lower-bound
search over ``len(counts) + 1`` slots: ``ceil(log2(n + 1))`` runs), and:

* families are visited cheapest-first (by the cost of their smallest count);
* **branch and bound**: with ``keep = 1 + runner_ups`` family minima wanted, a family whose
  smallest cost already exceeds the ``keep``-th best cost found is skipped, and a bisection
  only looks at counts whose cost is at most that bound (ties are evaluated, so ties rank
  the same as a brute force would);
* ``parallel`` families are bisected in lock step, their probes run as one batch (the
  executor's workers run them side by side); the bound applies at every step.

The ranking of passing deployments is ``(cost, GPUs, score, family key)``: score is the
worst p99 TTFT over the seeds (lower is better). The result equals the brute force's
(:func:`brute_force`: every count of every family) whenever the monotonicity holds; where
it can fail: routing that keeps affinity (prefix-aware scorers spread a shared prefix over
more instances, so cache hits fall), a fabric or admission limit shared by all instances,
and run-to-run noise near the threshold (a different instance count changes which requests
share an instance). :func:`brute_force` reports the families where it does not hold.

**(b) Highest sustained rate** (:func:`max_rate_search`): the SLOs are assumed monotone
(decreasing) in the rate; bisection between ``min_rate`` and ``max_rate`` until the bracket
is at most ``tolerance`` req/s wide, as DistServe's and Vidur-Search's capacity searches.

The functions here take an injected ``judge`` (a candidate list → verdicts with ``meets``
and ``score``): :class:`PlanRunner` judges by running points, the tests by formulas.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from blis_simpy.planner.candidates import Candidate, Family

Judge = Callable[[list[tuple[Family, int]]], list]


@dataclass
class Found:
    """A family's cheapest passing count and its verdict."""

    family: Family
    count: int
    verdict: object

    @property
    def deployment(self) -> Candidate:
        return self.family.deployment(self.count)

    @property
    def cost(self) -> float:
        return self.family.cost(self.count)

    def rank(self) -> tuple:
        score = getattr(self.verdict, "score", math.inf)
        return (self.cost, self.deployment.gpus, score if score == score else math.inf, self.family.key)


@dataclass
class SearchResult:
    """``best``: the ``keep`` cheapest family minima, best first. ``runs``: candidates judged,
    in order. ``skipped``: families never run (bound). ``searched``: families bisected."""

    best: list[Found]
    runs: list[tuple[Family, int, object]] = field(default_factory=list)
    skipped: list[Family] = field(default_factory=list)
    searched: list[Family] = field(default_factory=list)
    non_monotone: list[Family] = field(default_factory=list)   # brute force only

    @property
    def winner(self) -> Found | None:
        return self.best[0] if self.best else None


def cross_product_size(families: Sequence[Family]) -> int:
    return sum(len(f.counts) for f in families)


def _family_search(fam: Family, bound: Callable[[], float]):
    """Generator: yields counts to judge, receives verdicts; returns the index of the
    cheapest passing count (or None) among those costing at most ``bound()``.

    The smallest allowed count first (once a bound is known most families pass there or
    nowhere), then the largest allowed (if it fails, nothing passes), then bisection between."""
    def allowed() -> int:
        b = bound()
        return sum(1 for c in fam.counts if fam.cost(c) <= b)

    lo, hi = 0, allowed()                # the answer's index lies in [lo, hi]; hi = none
    if lo >= hi:
        return None
    if (yield fam.counts[lo]).meets:
        return lo
    lo = 1
    hi = min(hi, allowed())
    if lo >= hi:
        return None
    if not (yield fam.counts[hi - 1]).meets:
        return None
    hi = found = hi - 1
    while True:
        hi = min(hi, allowed())
        if lo >= hi:
            break
        mid = (lo + hi) // 2
        verdict = yield fam.counts[mid]
        if verdict.meets:
            hi = found = mid
        else:
            lo = mid + 1
    return found if found == lo else None


def search_cheapest(families: Sequence[Family], judge: Judge, *, keep: int = 1,
                    parallel: int = 1) -> SearchResult:
    """Branch and bound over ``families`` with bisection inside each (module docstring)."""
    keep = max(1, keep)
    queue = sorted(families, key=lambda f: (f.min_cost, f.key))
    out = SearchResult(best=[])
    found: list[Found] = []

    def bound() -> float:
        return found[keep - 1].cost if len(found) >= keep else math.inf

    active: list[list] = []     # [family, generator, pending count]
    while queue or active:
        while queue and len(active) < max(1, parallel):
            fam = queue.pop(0)
            if fam.min_cost > bound():
                out.skipped.append(fam)
                continue
            gen = _family_search(fam, bound)
            out.searched.append(fam)
            try:
                active.append([fam, gen, next(gen)])
            except StopIteration:
                pass
        if not active:
            continue
        verdicts = judge([(fam, count) for fam, _, count in active])
        still = []
        for (fam, gen, count), v in zip(active, verdicts, strict=True):
            out.runs.append((fam, count, v))
            try:
                still.append([fam, gen, gen.send(v)])
            except StopIteration as stop:
                if stop.value is not None:
                    c = fam.counts[stop.value]
                    verdict = next(r[2] for r in reversed(out.runs) if r[0] is fam and r[1] == c)
                    found.append(Found(fam, c, verdict))
                    found.sort(key=Found.rank)
        active = still
    out.best = found[:keep]
    return out


def brute_force(families: Sequence[Family], judge: Judge, *, keep: int = 1) -> SearchResult:
    """Judge every count of every family (the cross product); the same ranking as
    :func:`search_cheapest`, plus the families where passing is not monotone in the count."""
    items = [(f, c) for f in families for c in f.counts]
    verdicts = judge(items) if items else []
    out = SearchResult(best=[], runs=[(f, c, v) for (f, c), v in zip(items, verdicts, strict=True)],
                       searched=list(families))
    found = []
    for fam in families:
        flags = [(c, v) for f, c, v in out.runs if f is fam]
        first = next(((c, v) for c, v in flags if v.meets), None)
        if first is not None:
            found.append(Found(fam, first[0], first[1]))
            if not all(v.meets for c, v in flags if c >= first[0]):
                out.non_monotone.append(fam)
    found.sort(key=Found.rank)
    out.best = found[:keep]
    return out


# ---------------------------------------------------------------------------- max rate
@dataclass
class RateResult:
    """``sustained``: the highest rate judged passing (None: not even ``min_rate``);
    ``failing``: the lowest rate judged failing (None: ``max_rate`` passes, so the answer is
    at least ``max_rate``). ``probes``: (rate, verdict) in order."""

    sustained: float | None
    failing: float | None
    probes: list[tuple[float, object]]


def max_rate_search(judge_rate: Callable[[float], object], min_rate: float, max_rate: float,
                    tolerance: float) -> RateResult:
    """Bisection on the rate until ``failing - sustained <= tolerance`` (module docstring)."""
    probes: list[tuple[float, object]] = []

    def ok(rate: float) -> bool:
        v = judge_rate(rate)
        probes.append((rate, v))
        return bool(v.meets)

    if not ok(min_rate):
        return RateResult(None, min_rate, probes)
    if ok(max_rate):
        return RateResult(max_rate, None, probes)
    lo, hi = min_rate, max_rate
    while hi - lo > tolerance:
        mid = round((lo + hi) / 2, 9)
        if mid <= lo or mid >= hi:
            break
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return RateResult(lo, hi, probes)
