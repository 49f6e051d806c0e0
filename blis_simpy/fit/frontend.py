"""The fixed latency outside the engine, fitted from aggregate runs measured at the client.

A client's time to first token is the engine's — the wait for the step that admits the
request, that step — plus what lies outside the engine: the HTTP request, the API server's
handling of it, the first chunk's way back and the client reading it. At light load nothing
queues outside the engine, so with the step costs fitted the gap between the real and the
simulated median TTFT of a run's lightest stage is that fixed latency. The median, not the
mean: a fixed latency shifts the whole distribution, while the mean also carries the few
requests that met a long prefill or a burst (on the Mixtral-8x7B H100 run the mean gap is
15.6 ms, the median 5.5 ms).

:func:`fit_frontend` simulates, for every run measured at the client
(:attr:`~blis_simpy.measured.run.AggregateRun.measured_at`), its lightest stage that lost no
request (lowest rate; with the stages before it, as the run went) with the coefficient set's
front end switched off, and takes the median of the runs' gaps. The set's front end then
carries half of it as ``network_us`` (one way: it is paid on the way in and again on the
way out, so TTFT and E2E grow by the whole gap and ITL not at all). It is one number shared
by every run and GPU — the client and the API server are host software — never per run.

Kept as ``network_us`` rather than API-server CPU (``request_us``) because it does not
queue: a per-request CPU cost of this size (several ms) would make the front end saturate
at a few hundred requests/s, which the light stages cannot confirm.

Units: ``*_us`` µs, ``*_ms`` ms.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

from blis_simpy.calibrate.aggregate import calibrate_aggregate
from blis_simpy.latency.coefficient_sets import PhysicsCoefficients
from blis_simpy.latency.frontend import FrontendParams
from blis_simpy.measured.run import AggregateRun


@dataclass(frozen=True)
class FrontendGap:
    """One run's lightest stage: its index, rate (req/s), and real and simulated median TTFT
    (ms; the mean where the results give no median) with no front end."""

    run: str
    stage: int
    rate_rps: float
    real_ttft_ms: float
    sim_ttft_ms: float

    @property
    def gap_ms(self) -> float:
        return self.real_ttft_ms - self.sim_ttft_ms


@dataclass
class FrontendFit:
    """The fitted front end (``params``) and the gaps it came from."""

    params: FrontendParams
    gaps: list[FrontendGap] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"network_us": round(self.params.network_us, 1),
                "gaps_ms": {g.run: round(g.gap_ms, 3) for g in self.gaps}}


def light_stage(run: AggregateRun) -> int | None:
    """The index of ``run``'s lowest-rate stage that lost no request and has a mean TTFT, or
    None (every stage overloaded, or a run measured at the server)."""
    if run.measured_at != "client":
        return None
    ok = [st for st, real in zip(run.stages, run.real_stages, strict=False)
          if real.successes > 0 and real.failures == 0 and "ttft" in real.latency_ms]
    return min(ok, key=lambda st: (st.rate_rps, st.index)).index if ok else None


def _through(run: AggregateRun, k: int) -> AggregateRun:
    """``run`` cut after its stage ``k`` (the stages before it still run first)."""
    st = run.stages[k]
    return replace(run, stages=run.stages[: k + 1], real_stages=run.real_stages[: k + 1],
                   records=run.records[: st.first + st.count], real_total=None)


def frontend_gap(scenario, run: AggregateRun, deployment) -> FrontendGap | None:
    """Simulate ``run`` through its light stage with ``deployment`` (whose set has no front
    end) and return that stage's TTFT gap; None when the run has no light stage."""
    k = light_stage(run)
    if k is None:
        return None
    c = calibrate_aggregate(scenario, _through(run, k), deployment=deployment)
    row = c.stages[k].row("ttft")
    if row is None or not row.real or not row.sim:
        return None
    p50 = row.real.get("p50")
    stat = "p50" if p50 is not None and not math.isnan(p50) else "mean"
    return FrontendGap(run.name, k, run.stages[k].rate_rps, row.real[stat], row.sim[stat])


def fit_frontend(space, cases, cs: PhysicsCoefficients) -> FrontendFit | None:
    """The front end shared by ``cases`` (fit cases: ``.run``, ``.scenario``) under the step
    costs of ``cs`` (module docstring); None when no case is an aggregate run measured at the
    client with a light stage."""
    bare = cs.model_copy(update={"frontend": FrontendParams()})
    gaps = []
    for c in cases:
        if not isinstance(c.run, AggregateRun) or light_stage(c.run) is None:
            continue
        g = frontend_gap(c.scenario, c.run, space.deployment(c.scenario, bare))
        if g is not None:
            gaps.append(g)
    if not gaps:
        return None
    half_ms = max(0.0, statistics.median(g.gap_ms for g in gaps)) / 2.0
    return FrontendFit(FrontendParams(network_us=round(half_ms * 1000.0, 1)), gaps)


def with_frontend(cs: PhysicsCoefficients, fe: FrontendFit | None) -> PhysicsCoefficients:
    """``cs`` with the fitted front end in place (unchanged when ``fe`` is None)."""
    return cs if fe is None else cs.model_copy(update={"frontend": fe.params})


__all__ = ["FrontendFit", "FrontendGap", "fit_frontend", "frontend_gap", "light_stage", "with_frontend"]
