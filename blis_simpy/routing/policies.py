"""The built-in routing policies besides round-robin (docs/control-plane.md, "Routing").

* ``least-loaded`` — minimum effective load; ties broken by :func:`break_tie`.
* ``weighted`` — the normalised weighted sum of scorers, argmax; ties by :func:`break_tie`.
* ``always-busiest`` — maximum effective load, first on ties (a pathological test policy).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from blis_simpy.plugins import call_failure, is_number, plugin_error
from blis_simpy.request_view import as_view
from blis_simpy.routing.base import (
    Router,
    RoutingDecision,
    TieBreak,
    TieBreakParams,
    break_tie,
    shown,
)
from blis_simpy.routing.scorers import Scorer, ScorerSpec, check_scorer, default_scorers, parse_scorers
from blis_simpy.snapshot import RouterState


class LeastLoaded(Router, name="least-loaded"):
    """Minimum ``effective_load``."""

    Params = TieBreakParams

    def route(self, req, state: RouterState) -> RoutingDecision:
        snaps = state.snapshots
        loads = [s.queue_depth + s.batch_size + s.in_flight_requests for s in snaps]
        best = min(loads)
        tied = [j for j, x in enumerate(loads) if x == best]
        s = snaps[break_tie(tied, self.params.tie_break, self.rng)]
        return RoutingDecision(s.index, f"least-loaded (load={best})")


class AlwaysBusiest(Router, name="always-busiest"):
    """Maximum ``effective_load``, the first such instance."""

    def route(self, req, state: RouterState) -> RoutingDecision:
        snaps = state.snapshots
        best = max(range(len(snaps)), key=lambda j: (snaps[j].effective_load, -j))
        s = snaps[best]
        return RoutingDecision(s.index, f"always-busiest (load={s.effective_load})")


class Weighted(Router, name="weighted"):
    """``argmax_j Σ_i w_i · clamp(score_i(j), 0, 1)`` with weights normalised to sum 1.

    The scorers run in configuration order; after the pick every stateful scorer observes
    the chosen instance. The decision carries the composite score of every instance.
    """

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        #: ``[{name, weight, params}]`` or BLIS's ``"name:w,name:w"``; empty ⇒ the default
        #: ``prefix-affinity:3, queue-depth:2, kv-utilization:2``
        scorers: list[ScorerSpec] = []
        tie_break: TieBreak = "random"

        @field_validator("scorers", mode="before")
        @classmethod
        def _text_form(cls, v):
            if isinstance(v, str):
                return parse_scorers(v) if v.strip() else []
            return v

        @field_validator("scorers")
        @classmethod
        def _rules(cls, v: list[ScorerSpec]):
            if not v:
                return default_scorers()
            seen: set[str] = set()
            for spec in v:
                check_scorer(spec.name, spec.weight, seen)
            return v

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        specs = self.params.scorers or default_scorers()
        self.scorers: list[Scorer] = []
        for k, spec in enumerate(specs):
            cls = Scorer.lookup(spec.name, field=f"scorers[{k}].name")
            p = cls.parse_params(spec.params, field=f"scorers[{k}].params")
            self.scorers.append(cls(p, block_size=self.block_size))
        total = 0.0
        for spec in specs:
            total += spec.weight
        self.weights = [spec.weight / total for spec in specs]
        self.specs = list(specs)
        self._observers = [s for s in self.scorers if s.stateful]
        self._seers = [s for s in self.scorers if s.sees_state]

    def composite(self, req, snaps) -> list[float]:
        """The weighted composite score of each snapshot (in order)."""
        comp = [0.0] * len(snaps)
        for scorer, w in zip(self.scorers, self.weights, strict=True):
            vals = scorer.score(req, snaps) if scorer._blis_builtin else self._checked(scorer, req, snaps)
            # each value clamped to [0, 1] (NaN and -0.0 kept as they are), times the weight,
            # added in scorer order
            comp = [c + (0.0 if v < 0.0 else 1.0 if v > 1.0 else v) * w
                    for c, v in zip(comp, vals, strict=True)]
        return comp

    def _field(self, scorer: Scorer) -> str:
        return f"{self.config_field}.params.scorers[{self.scorers.index(scorer)}]"

    def _checked(self, scorer: Scorer, req, snaps) -> list[float]:
        """A plugin scorer's scores, checked: one real number (not NaN) per snapshot; anything
        else is that scorer's one-line error."""
        field = self._field(scorer)
        try:
            vals = scorer.score(as_view(req), snaps)
        except Exception as exc:
            raise call_failure(scorer, "score", exc, field=field) from None
        try:
            vals = list(vals)
        except TypeError:
            raise plugin_error(scorer, f"returned {shown(vals)} from score(); expected a list of "
                               f"{len(snaps)} numbers, one per instance", field=field) from None
        if len(vals) != len(snaps):
            raise plugin_error(scorer, f"returned {len(vals)} scores from score() for "
                               f"{len(snaps)} instances; expected one per instance", field=field)
        for s, v in zip(snaps, vals, strict=True):
            if not is_number(v):
                raise plugin_error(scorer, f"returned {shown(v)} for {s.id} from score(); expected "
                                   "a number (NaN is not a score)", field=field)
        return vals

    def route(self, req, state: RouterState) -> RoutingDecision:
        snaps = state.snapshots
        for scorer in self._seers:
            if scorer._blis_builtin:
                scorer.see(state)
                continue
            try:
                scorer.see(state)
            except Exception as exc:
                raise call_failure(scorer, "see", exc, field=self._field(scorer)) from None
        comp = self.composite(req, snaps)
        best = max(comp)
        tied = [j for j, x in enumerate(comp) if x == best]
        chosen = snaps[break_tie(tied, self.params.tie_break, self.rng)]
        for scorer in self._observers:
            if scorer._blis_builtin:
                scorer.observe(req, chosen)
                continue
            try:
                scorer.observe(as_view(req), chosen)
            except Exception as exc:
                raise call_failure(scorer, "observe", exc, field=self._field(scorer)) from None
        scores = {s.id: c for s, c in zip(snaps, comp, strict=True)}
        return RoutingDecision(chosen.index, f"weighted (score={best:.4f})", scores)
