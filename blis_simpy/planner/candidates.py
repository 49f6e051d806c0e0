"""A plan's candidate deployments, the scenario each one runs, and whether its runs meet the SLOs.

A **candidate** (:class:`Candidate`; not to be confused with the resolved
:class:`~blis_simpy.deploy.resolve.Deployment` a scenario builds) is (GPU, TP, DP, EP, instances) co-located, or (GPU, TP, DP, EP, P, D)
with P prefill and D decode instances; it uses ``instances × TP × DP`` GPUs. A **family**
is a deployment with every axis fixed but one instance count: co-located families vary the
instances, disaggregated ones fix P and vary D. Within a family the cost grows with the
count, and the planner assumes the SLOs are monotone in it (docs/planning.md, "Plans").

A run is a point ``{"command": "run"|"replay", "scenario": {...}}`` (the sweep's point
format); its result row carries ``status``, ``m.<metric>`` and ``slo.<key>`` columns.
"""

from __future__ import annotations

import bisect
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: the plan types (blis_simpy.planner.plan_file, which imports this module)
PlanSpec = LoadedPlan = FixedDeployment = Any

#: the latency backend when neither the plan nor the base scenario names one
DEFAULT_LATENCY = "physics"


@dataclass(frozen=True, order=True)
class Candidate:
    """GPU, parallelism and instance counts; ``prefill == decode == 0`` means co-located."""

    gpu: str
    tp: int
    dp: int
    ep: bool
    instances: int
    prefill: int = 0
    decode: int = 0

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0

    @property
    def gpus(self) -> int:
        return self.instances * self.tp * self.dp

    @property
    def label(self) -> str:
        shape = (f"{self.prefill}P:{self.decode}D" if self.disaggregated
                 else f"{self.instances} inst")
        par = f"TP{self.tp}" + (f" DP{self.dp}" if self.dp > 1 else "") + (" EP" if self.ep else "")
        return f"{shape} x {self.gpu} {par}"

    def as_dict(self) -> dict:
        return {"gpu": self.gpu, "tp": self.tp, "dp": self.dp, "ep": self.ep,
                "instances": self.instances, "prefill": self.prefill, "decode": self.decode,
                "gpus": self.gpus, "label": self.label}


@dataclass(frozen=True)
class Family:
    """Deployments that differ only in one instance count (``counts``, ascending).

    ``fixed`` instances are added to every count (the P of a disaggregated family); cost is
    ``(fixed + count) × gpus_per_instance × price`` (price 1 = rank by GPU count)."""

    gpu: str
    tp: int
    dp: int
    ep: bool
    prefill: int              # 0: co-located (count = instances); else P (count = D)
    counts: tuple[int, ...]
    price: float = 1.0

    @property
    def key(self) -> tuple:
        return (self.gpu, self.tp, self.dp, self.ep, self.prefill)

    @property
    def label(self) -> str:
        shape = f"{self.prefill}P:nD" if self.prefill else "n inst"
        par = f"TP{self.tp}" + (f" DP{self.dp}" if self.dp > 1 else "") + (" EP" if self.ep else "")
        return f"{shape} x {self.gpu} {par}"

    def deployment(self, count: int) -> Candidate:
        if self.prefill:
            return Candidate(self.gpu, self.tp, self.dp, self.ep, self.prefill + count,
                              self.prefill, count)
        return Candidate(self.gpu, self.tp, self.dp, self.ep, count)

    def cost(self, count: int) -> float:
        return self.deployment(count).gpus * self.price

    @property
    def min_cost(self) -> float:
        return self.cost(self.counts[0])


def price_of(spec: PlanSpec, gpu: str) -> float:
    """USD per GPU-hour, or 1 when the plan gives no prices (cost = GPU count)."""
    return float(spec.cost.gpu_hour_usd[gpu]) if spec.priced else 1.0


def _fitting(counts: list[int], per: int, max_gpus: int | None) -> list[int]:
    """The instance counts (ascending) whose deployments of ``per`` GPUs an instance stay
    within ``max_gpus``."""
    return counts if max_gpus is None else counts[:bisect.bisect_right(counts, max_gpus // per)]


def _shapes(spec: PlanSpec):
    """``(tp, dp, fitting counts, co-located?, disaggregated?)`` of every TP x DP with a count
    within ``max_gpus``: the one place that says which families exist, for :func:`families`
    and :func:`deployment_count`. Disaggregated shapes use DP 1 only: the simulator has no
    data parallelism with PD pools."""
    s = spec.search
    for tp in s.tp:
        for dp in s.dp:
            fit = _fitting(s.instance_counts, tp * dp, spec.max_gpus)
            if fit:
                yield tp, dp, fit, s.pd.colocated, s.pd.disaggregated and dp == 1


def families(spec: PlanSpec) -> list[Family]:
    """Every family of the search space (budget ``max_gpus`` applied), none empty.
    Disaggregated shapes use DP 1 only: the simulator has no data parallelism with PD pools.
    The work is proportional to the deployments built (:func:`deployment_count` first)."""
    s = spec.search
    if s is None:
        return []
    out = []
    for gpu in spec.gpus:
        price = price_of(spec, gpu)
        for tp, dp, fit, colocated, disaggregated in _shapes(spec):
            for ep in s.ep:
                if colocated:
                    out.append(Family(gpu, tp, dp, ep, 0, tuple(fit), price))
                if disaggregated:
                    for p in range(1, fit[-1]):
                        c = tuple(n - p for n in fit[bisect.bisect_right(fit, p):])
                        out.append(Family(gpu, tp, dp, ep, p, c, price))
    return out


def deployment_count(spec: PlanSpec) -> int:
    """``sum(len(f.counts) for f in families(spec))``, counted without building them: a
    disaggregated family of P holds every fitting count N > P, so each fitting N is in N - 1
    of them."""
    s = spec.search
    if s is None:
        return 0
    per = sum(len(fit) * colocated + (sum(fit) - len(fit)) * disaggregated
              for _, _, fit, colocated, disaggregated in _shapes(spec))
    return per * len(s.ep) * len(spec.gpus)


def fixed_deployment(d: FixedDeployment) -> Candidate:
    if d.prefill:
        return Candidate(d.gpu, d.tp, d.dp, d.ep, d.prefill + d.decode, d.prefill, d.decode)
    return Candidate(d.gpu, d.tp, d.dp, d.ep, d.instances or 1)


# ---------------------------------------------------------------------------- scenarios
def _put(data: dict, path: tuple, value) -> None:
    for k in path[:-1]:
        nxt = data.get(k)
        if not isinstance(nxt, dict):
            nxt = data[k] = {}
        data = nxt
    data[path[-1]] = value


def point(plan: LoadedPlan, dep: Candidate, seed: int, rate: float | None = None) -> dict:
    """The run of ``dep`` with ``seed`` (and ``rate`` replacing the plan's): a sweep point."""
    spec = plan.spec
    data = plan.base_scenario()
    data.pop("name", None)
    data.pop("description", None)
    data["model"] = spec.model
    data["hardware"] = dep.gpu
    data["tp"] = dep.tp
    data["dp"] = dep.dp
    data["enable_expert_parallel"] = dep.ep
    data["seed"] = seed
    backend = spec.search.latency if spec.search is not None else None
    if backend is not None or not (data.get("latency") or {}).get("model"):
        _put(data, ("latency", "model"), backend or DEFAULT_LATENCY)
    _put(data, ("cluster", "num_instances"), dep.instances)
    _put(data, ("disaggregation", "prefill_instances"), dep.prefill)
    _put(data, ("disaggregation", "decode_instances"), dep.decode)
    if dep.disaggregated and spec.search is not None:
        _put(data, ("disaggregation", "decider", "policy"), spec.search.pd.decider)
    elif dep.disaggregated:
        _put(data, ("disaggregation", "decider", "policy"), "always")
    w = spec.workload
    command = "run"
    if w.trace is not None:
        data["workload"] = {"kind": "trace", "header": w.trace.header, "data": w.trace.data}
        command = "replay"
    else:
        wl = data.get("workload")
        if not isinstance(wl, dict):
            wl = data["workload"] = {"kind": "distribution"}
        if wl.get("kind") in ("trace",):
            command = "replay"
        wl.update(w.given())
        if rate is not None:
            wl["rate"] = float(rate)
    dirs = [os.path.dirname(os.path.abspath(plan.base_path))] if plan.base_path else []
    return {"command": command, "scenario": data, "plugin_dirs": dirs}


def offered_requests(pt: dict) -> int | None:
    """Requests a distribution workload offers (``None``: not known before the run)."""
    wl = pt["scenario"].get("workload") or {}
    if wl.get("kind", "distribution") == "distribution" and not pt["scenario"].get("horizon_us"):
        return int(wl.get("num_requests", 100))
    return None


# ---------------------------------------------------------------------------- SLO judgement
def judge_row(row: Mapping, slo_ms: Mapping[str, float], min_completed: float,
              offered: int | None) -> tuple[bool, str]:
    """Does one run meet the SLOs? Returns (meets, why-not text, empty when it meets)."""
    if row.get("status") != "ok":
        return False, f"run failed: {row.get('error') or row.get('status')}"
    if row.get("saturated"):           # only points that ask (PlanRunner, drop_saturated)
        return False, f"saturated: {row.get('saturation')}"
    done = row.get("m.completed_requests")
    total = offered if offered is not None else row.get("m.injected_requests")
    if done is None or not total:
        return False, "no completed-request count"
    if done / total < min_completed:     # not done < f * total: 0.55 * 100 is 55.00000000000001
        return False, f"completed {done}/{total} < {min_completed:g}"
    for key, limit in slo_ms.items():
        v = row.get(f"m.{key}")
        if v is None or isinstance(v, str) or (isinstance(v, float) and math.isnan(v)):
            return False, f"{key} missing"
        if v > limit:
            return False, f"{key} {v:.1f} > {limit:g}"
    return True, ""


#: row keys kept per evaluated run in the plan output
KEPT_METRICS = ("ttft_p99_ms", "itl_p99_ms", "e2e_p99_ms", "ttft_mean_ms", "itl_mean_ms",
                "e2e_mean_ms", "responses_per_sec", "completed_requests", "injected_requests")


def goodput_rps(row: Mapping) -> float | None:
    """Requests/s meeting every SLO, when the run's row carries it."""
    for key in ("slo.goodput_rps", "slo.goodput"):
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None
