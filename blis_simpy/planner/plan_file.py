"""The plan file of ``blis-simpy plan PLAN.yaml`` (docs/planning.md, "Plans").

A plan names a model, the candidate GPUs, a workload (a base scenario file, inline
distribution keys, or a trace), SLOs as percentile thresholds, a search space and GPU prices::

    model: qwen/qwen3-14b
    gpus: [H100]
    max_gpus: 8                          # budget: GPUs of one deployment
    workload: {rate: 30, num_requests: 2000, prompt_tokens: {...}, output_tokens: {...}}
    slo: {ttft_p99_ms: 1000, itl_p99_ms: 50, min_completed_fraction: 0.99}
    search: {instances: {min: 1, max: 8}, tp: [1, 2, 4, 8], pd: {disaggregated: true}}
    cost: {gpu_hour_usd: {H100: 2.5}}    # optional; without prices deployments rank by GPU count
    max_rate: {deployment: winner, min_rate: 5, max_rate: 80, tolerance: 0.5}

**The SLO rule.** A run meets the SLOs when every named percentile of the run (cluster-wide,
``ttft_p99_ms`` = the 99th percentile of TTFT in ms, as ``blis-simpy run --format json``
reports it) is at most its threshold, and the completed requests are at least
``min_completed_fraction`` (default 0.99) of the offered ones (a deployment that drops or
never finishes requests would otherwise look fast). A deployment meets them when its run
meets them for **every** seed of ``search.seeds``.

Every model forbids unknown keys at every depth; errors are located (``FILE:LINE: key``).
Sizes are capped so an untrusted plan cannot ask for an unbounded search.
"""

from __future__ import annotations

import copy
import os
from typing import Annotated, Literal

import pydantic
from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from blis_simpy.config.loader import Source, load_raw, read_yaml, validate, validation_problem
from blis_simpy.config.scenario import MAX_DP, DistributionWorkload, Strict
from blis_simpy.errors import ConfigError
from blis_simpy.planner.candidates import deployment_count
from blis_simpy.units import MAX_INT64

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]

#: percentiles a run reports per latency (``<metric>_<stat>_ms``), hence the SLO keys
SLO_METRICS = ("ttft", "itl", "e2e")
SLO_STATS = ("mean", "p90", "p95", "p99")
SLO_KEYS = tuple(f"{m}_{s}_ms" for m in SLO_METRICS for s in SLO_STATS) + ("scheduling_delay_p99_ms",)
#: caps on what a plan file can make us loop over
MAX_INSTANCES = 4096
MAX_CHOICES = 64
MAX_SEEDS = 100
MAX_CANDIDATES = 100_000
#: keys and values of a plan file (YAML nodes), refused while parsing: the longest lists
#: (search.instances, 4096 items) and the rest fit many times over
MAX_PLAN_NODES = 20_000


class InstanceRange(Strict):
    """Every instance count from ``min`` to ``max`` (inclusive)."""

    min: PosInt = 1
    max: Annotated[int, Field(gt=0, le=MAX_INSTANCES)]

    @model_validator(mode="after")
    def _ordered(self) -> InstanceRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class TraceRef(Strict):
    """A TraceV2 trace (paths relative to the plan file)."""

    header: str
    data: str


def _optional(model: type[BaseModel], skip: tuple[str, ...]) -> dict:
    """Every field of ``model`` but ``skip``, with its type and constraints, made optional
    (None: not given)."""
    out = {}
    for name, f in model.model_fields.items():
        if name not in skip:
            typ = Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation
            out[name] = (typ | None, Field(None, description=f.description))
    return out


#: the distribution keys a plan's workload may give: the run scenario's own schema
#: (``DistributionWorkload``), each optional — not a copy of it
DistributionKeys = create_model("DistributionKeys", __base__=Strict,
                                **_optional(DistributionWorkload, ("kind",)))
DISTRIBUTION_KEYS = tuple(DistributionKeys.model_fields)


class PlanWorkload(DistributionKeys):
    """What every candidate serves. ``scenario``: a base scenario file (engine limits,
    routing, latency coefficients, its workload...); the distribution keys (every key of a
    scenario's ``workload: {kind: distribution}``: rate, num_requests, prompt_tokens,
    output_tokens, prefix_tokens, arrival, arrival_cv) replace its workload's. Without
    ``scenario`` the workload is BLIS's distribution mode with these keys."""

    scenario: str = Field("", description="base scenario YAML (relative to the plan file)")
    trace: TraceRef | None = Field(None, description="replay this trace instead of a rate")

    def given(self) -> dict:
        """The distribution keys given, as scenario YAML values."""
        return {k: (v.model_dump() if isinstance(v, BaseModel) else v)
                for k in DISTRIBUTION_KEYS if (v := getattr(self, k)) is not None}

    @model_validator(mode="after")
    def _one_source(self) -> PlanWorkload:
        if self.trace is not None:
            given = list(self.given())
            if given:
                raise ValueError(f"a trace workload takes no {given[0]} (the trace fixes it)")
        elif not self.scenario and self.rate is None:
            raise ValueError("give a rate (requests/s), a trace or a base scenario file")
        return self


class SLO(Strict):
    """Percentile thresholds in ms (``<ttft|itl|e2e>_<mean|p90|p95|p99>_ms``,
    ``scheduling_delay_p99_ms``) and the fraction of offered requests that must complete."""

    ttft_mean_ms: PosFloat | None = None
    ttft_p90_ms: PosFloat | None = None
    ttft_p95_ms: PosFloat | None = None
    ttft_p99_ms: PosFloat | None = None
    itl_mean_ms: PosFloat | None = None
    itl_p90_ms: PosFloat | None = None
    itl_p95_ms: PosFloat | None = None
    itl_p99_ms: PosFloat | None = None
    e2e_mean_ms: PosFloat | None = None
    e2e_p90_ms: PosFloat | None = None
    e2e_p95_ms: PosFloat | None = None
    e2e_p99_ms: PosFloat | None = None
    scheduling_delay_p99_ms: PosFloat | None = None
    min_completed_fraction: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.99
    #: a saturated run (docs/metrics.md, "Saturation") fails, ends at its last arrival, and
    #: its deployment's other seeds are not run (``plan --keep-saturated``: False)
    drop_saturated: bool = True

    @model_validator(mode="after")
    def _some(self) -> SLO:
        if not self.thresholds_ms:
            raise ValueError(f"name at least one threshold ({', '.join(SLO_KEYS)})")
        return self

    @property
    def thresholds_ms(self) -> dict[str, float]:
        """SLO key → threshold in ms (the keys given)."""
        return {k: float(getattr(self, k)) for k in SLO_KEYS if getattr(self, k) is not None}


class PDSplits(Strict):
    """Which split shapes to try: co-located instances, and/or every P:D split (P, D >= 1)
    of each instance count, requests routed by ``decider``."""

    colocated: bool = True
    disaggregated: bool = False
    decider: str = Field("always", description="PD decider policy of the disaggregated shapes")

    @model_validator(mode="after")
    def _some(self) -> PDSplits:
        if not (self.colocated or self.disaggregated):
            raise ValueError("enable colocated, disaggregated or both")
        return self


def _capped(v, kind: type, cap: int, what: str):
    """``v`` as given, unless it is a ``kind`` (list, dict) of more than ``cap`` items: a
    "before" validator's check, so an absurd length is refused before its items are."""
    if isinstance(v, kind) and len(v) > cap:
        raise ValueError(f"at most {cap} {what}, got {len(v)}")
    return v


def _choices(v: list, what: str) -> list:
    if not v:
        raise ValueError(f"give at least one {what}")
    if len(v) > MAX_CHOICES:
        raise ValueError(f"at most {MAX_CHOICES} {what} choices, got {len(v)}")
    return sorted(set(v))


class Search(Strict):
    """The space of deployments: instances × TP × DP × EP × split shape on each GPU."""

    instances: InstanceRange | list[Annotated[int, Field(gt=0, le=MAX_INSTANCES)]]
    tp: list[PosInt] = Field(default_factory=lambda: [1])
    dp: list[Annotated[int, Field(gt=0, le=MAX_DP)]] = Field(default_factory=lambda: [1])
    ep: list[bool] = Field(default_factory=lambda: [False],
                           description="expert parallelism (MoE models only)")
    pd: PDSplits = Field(default_factory=PDSplits)
    latency: str | None = Field(None, description="latency backend; None = the base scenario's, "
                                                  "else physics")
    seeds: list[Annotated[int, Field(ge=-MAX_INT64 - 1, le=MAX_INT64)]] = Field(default_factory=lambda: [42])
    runner_ups: Annotated[int, Field(ge=0, le=20)] = 2

    @field_validator("instances", mode="before")
    @classmethod
    def _instances(cls, v):
        return _capped(v, list, MAX_INSTANCES, "instance counts")

    @field_validator("tp")
    @classmethod
    def _tp(cls, v):
        return _choices(v, "tp")

    @field_validator("dp")
    @classmethod
    def _dp(cls, v):
        return _choices(v, "dp")

    @field_validator("ep")
    @classmethod
    def _ep(cls, v):
        return _choices(v, "ep")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        if not v:
            raise ValueError("give at least one seed")
        if len(v) > MAX_SEEDS:
            raise ValueError(f"at most {MAX_SEEDS} seeds, got {len(v)}")
        return list(dict.fromkeys(v))

    @property
    def instance_counts(self) -> list[int]:
        if isinstance(self.instances, InstanceRange):
            return list(range(self.instances.min, self.instances.max + 1))
        return sorted(set(self.instances))


class FixedDeployment(Strict):
    """One deployment: ``instances`` co-located, or ``prefill`` + ``decode`` pools."""

    gpu: str
    tp: PosInt = 1
    dp: Annotated[int, Field(gt=0, le=MAX_DP)] = 1
    ep: bool = False
    instances: Annotated[int, Field(gt=0, le=MAX_INSTANCES)] | None = None
    prefill: Annotated[int, Field(ge=0, le=MAX_INSTANCES)] = 0
    decode: Annotated[int, Field(ge=0, le=MAX_INSTANCES)] = 0

    @model_validator(mode="after")
    def _shape(self) -> FixedDeployment:
        if (self.prefill > 0) != (self.decode > 0):
            raise ValueError("give both prefill and decode instances (or neither)")
        if self.prefill and self.instances is not None:
            raise ValueError("give instances (co-located) or prefill + decode, not both")
        if not self.prefill and self.instances is None:
            raise ValueError("give instances (co-located) or prefill + decode")
        return self


class MaxRate(Strict):
    """(b): the highest rate one deployment sustains within the SLOs, by bisection between
    ``min_rate`` and ``max_rate`` until the bracket is at most ``tolerance`` wide (req/s)."""

    deployment: Literal["winner"] | FixedDeployment = "winner"
    min_rate: PosFloat
    max_rate: PosFloat
    tolerance: PosFloat = 0.5

    @model_validator(mode="after")
    def _bracket(self) -> MaxRate:
        if self.min_rate >= self.max_rate:
            raise ValueError(f"min_rate ({self.min_rate:g}) must be < max_rate ({self.max_rate:g})")
        if (self.max_rate - self.min_rate) / self.tolerance > 2 ** 40:
            raise ValueError("tolerance too small for the rate range")
        return self


class Cost(Strict):
    """GPU prices, USD per GPU-hour (nothing is assumed: without prices, deployments rank by
    GPU count)."""

    gpu_hour_usd: dict[str, PosFloat] = Field(default_factory=dict)

    @field_validator("gpu_hour_usd", mode="before")
    @classmethod
    def _prices(cls, v):
        return _capped(v, dict, MAX_CHOICES, "prices")     # one price per candidate GPU


class PlanSpec(Strict):
    name: str = ""
    description: str = ""
    model: Annotated[str, Field(min_length=1)]
    gpus: list[str]
    max_gpus: PosInt | None = Field(None, description="most GPUs one deployment may use")
    workload: PlanWorkload
    slo: SLO
    search: Search | None = None
    max_rate: MaxRate | None = None
    cost: Cost = Field(default_factory=Cost)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v):
        if not v:
            raise ValueError("name at least one candidate GPU")
        if len(v) > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} GPUs, got {len(v)}")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _parts(self) -> PlanSpec:
        if self.search is None and self.max_rate is None:
            raise ValueError("give search (cheapest deployment), max_rate (highest rate) or both")
        if self.max_rate is not None and self.max_rate.deployment == "winner" and self.search is None:
            raise ValueError("max_rate.deployment: winner needs a search section")
        return self

    @property
    def priced(self) -> bool:
        return bool(self.cost.gpu_hour_usd)


class LoadedPlan:
    """A validated plan: the spec, where it came from, and the base scenario keys."""

    def __init__(self, spec: PlanSpec, src: Source, base: dict, base_path: str | None):
        self.spec = spec
        self.src = src
        self.base = base
        self.base_path = base_path

    def base_scenario(self) -> dict:
        return copy.deepcopy(self.base)


def load_plan(path: str) -> LoadedPlan:
    """Read, validate and check a plan file; raises a located :class:`ConfigError`."""
    data, src = read_yaml(path, max_nodes=MAX_PLAN_NODES, kind="a plan file")
    if not isinstance(data, dict):
        raise ConfigError("a plan must be a mapping of keys", file=src.path, line=1)
    try:
        spec = PlanSpec.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and any(c in p for c in "[]()")))
        if loc[:2] == ("search", "instances") and len(loc) > 2 and isinstance(loc[2], str) \
                and loc[2] in ("InstanceRange", "list"):
            loc = loc[:2] + loc[3:]
        raise src.error(validation_problem(first, PlanSpec), loc) from None
    here = os.path.dirname(str(path))
    w = spec.workload
    base, base_path = {}, None
    if w.scenario:
        base_path = w.scenario if os.path.isabs(w.scenario) else os.path.join(here, w.scenario)
        try:
            base, base_src = load_raw(base_path)
            # the types of every key, as `run --scenario` checks them (a plan file's
            # `gpus: [H100]` in a base was an AttributeError); the cross-key rules wait for
            # the plan's workload keys, which replace the base's
            validate(copy.deepcopy(base), base_src, semantic=False)
        except ConfigError as exc:
            raise src.error(f"base scenario: {exc.one_line()}", ("workload", "scenario")) from None
        if base.get("variants"):
            raise src.error("the base scenario has variants; a plan builds its own deployments",
                            ("workload", "scenario"))
        bw = base.get("workload")
        if isinstance(bw, dict) and bw.get("kind") not in (None, "distribution") and w.given():
            raise src.error(f"rate and lengths apply to a distribution workload; the base "
                            f"scenario's is {bw.get('kind')}", ("workload", next(iter(w.given()))))
    if w.trace is not None:
        for key in ("header", "data"):
            p = getattr(w.trace, key)
            if p and not os.path.isabs(p):
                setattr(w.trace, key, os.path.normpath(os.path.join(here, p)))
    _check(spec, src, base)
    return LoadedPlan(spec, src, base, base_path)


def _check(spec: PlanSpec, src: Source, base: dict) -> None:
    """Cross-key rules: GPUs and model in the catalogs, prices for every GPU, EP on MoE only,
    a rate for max_rate, a bounded search space."""
    from blis_simpy.catalog.hardware import gpu_catalog
    from blis_simpy.catalog.models import builtin_models
    try:
        cat = gpu_catalog(base.get("hardware_config") or "", base.get("gpus") or None)
    except ConfigError as exc:
        raise src.error(f"base scenario: {exc.one_line()}", ("workload", "scenario")) from None
    for i, g in enumerate(spec.gpus):
        if cat.find(g) is None:
            raise src.error(f"unknown GPU {g!r}; available: {', '.join(cat.names())}", ("gpus", i))
    prices = spec.cost.gpu_hour_usd
    if prices:
        for i, g in enumerate(spec.gpus):
            if g not in prices:
                raise src.error(f"no price for GPU {g!r}: give every candidate GPU a price, or none "
                                "(then deployments rank by GPU count)", ("gpus", i))
        for g in prices:
            if g not in spec.gpus:
                raise src.error(f"{g!r} is not a candidate GPU (gpus: {', '.join(spec.gpus)})",
                                ("cost", "gpu_hour_usd", g))
    entry = builtin_models().find(spec.model)
    moe = entry.config.is_moe if entry is not None else None
    if entry is None and not base.get("model_config_folder"):
        raise src.error(f"model {spec.model!r} is not in the offline model catalog; give a base "
                        "scenario with model_config_folder", ("model",))
    s = spec.search
    if s is not None:
        if True in s.ep and moe is False:
            raise src.error(f"{spec.model} is a dense model; ep applies to MoE models only",
                            ("search", "ep"))
        n = deployment_count(spec)     # counted, not built: the grid may be astronomical
        if n == 0:
            raise src.error("no deployment fits: every candidate exceeds max_gpus", ("max_gpus",))
        if n > MAX_CANDIDATES:
            raise src.error(f"the search space has {n} deployments (at most {MAX_CANDIDATES})",
                            ("search",))
    m = spec.max_rate
    if m is not None:
        if spec.workload.trace is not None or (isinstance(base.get("workload"), dict)
                                               and base["workload"].get("kind") not in (None, "distribution")):
            raise src.error("max_rate varies the arrival rate: it needs a distribution workload, "
                            "not a trace", ("max_rate",))
        d = m.deployment
        if not isinstance(d, str):
            if cat.find(d.gpu) is None:
                raise src.error(f"unknown GPU {d.gpu!r}; available: {', '.join(cat.names())}",
                                ("max_rate", "deployment", "gpu"))
            if prices and d.gpu not in prices:
                raise src.error(f"no price for GPU {d.gpu!r}", ("max_rate", "deployment", "gpu"))
            if d.ep and moe is False:
                raise src.error(f"{spec.model} is a dense model; ep applies to MoE models only",
                                ("max_rate", "deployment", "ep"))
