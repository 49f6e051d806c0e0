"""The v2 workload specification (docs/workloads.md): pydantic models, v1 upgrade, validation, loading.

Every model forbids unknown keys. Structural problems (unknown key, wrong type) are found by
pydantic; semantic rules (rates, SLO classes, distribution parameters, arrival cv ranges, …)
by :func:`validate_spec`, whose :class:`~blis_simpy.errors.ConfigError` names the field like
BLIS does (``client[2].rate_fraction``). :func:`load_workload_spec` adds the file and the
1-based line of the offending key.

Units: ``aggregate_rate`` and stage ``rate`` are requests per second; ``*_us`` fields,
``horizon`` and ``timeout`` are integer µs; token lengths are tokens.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from blis_simpy.bounds import MAX_REQUESTS
from blis_simpy.errors import ConfigError
from blis_simpy.units import MAX_INT64
from blis_simpy.workload import _yaml
from blis_simpy.workload.arrivals import ARRIVAL_PROCESSES, WEIBULL_CV_RANGE
from blis_simpy.workload.lengths import MAX_TOKENS, make_length_sampler

log = logging.getLogger(__name__)

SLO_CLASSES = ("", "critical", "standard", "sheddable", "batch", "background")
V1_SLO_UPGRADE = {"realtime": "critical", "interactive": "standard"}
CATEGORIES = ("", "language", "multimodal", "reasoning")

NonNegInt = Annotated[int, Field(ge=0)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
#: a token count: at most 2^24, as every length parameter (lengths.MAX_TOKENS)
Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class DistSpec(_Strict):
    """A token-length distribution: ``type`` ∈ gaussian, exponential, pareto_lognormal,
    constant, empirical; ``params`` as in docs/workloads.md (empirical: token count → probability)."""

    type: str
    params: dict[str, float] = Field(default_factory=dict)
    file: str = ""

    @field_validator("params", mode="before")
    @classmethod
    def _keys_to_str(cls, v: Any) -> Any:
        # empirical PMFs are written with integer keys (``128: 0.5``)
        return {str(k): p for k, p in v.items()} if isinstance(v, dict) else v


class ArrivalSpec(_Strict):
    """Arrival process of a client; ``cv`` (coefficient of variation) defaults to 1.0."""

    process: str
    cv: float | None = None


class NetworkSpec(_Strict):
    """Client network (metadata only): ``rtt_ms`` in ms, ``bandwidth_mbps`` in Mbit/s."""

    rtt_ms: NonNegFloat = 0.0
    bandwidth_mbps: NonNegFloat = 0.0


class WindowSpec(_Strict):
    """An active window ``[start_us, end_us)``."""

    start_us: NonNegInt
    end_us: NonNegInt


class LifecycleSpec(_Strict):
    windows: list[WindowSpec] = Field(default_factory=list)


class MultimodalSpec(_Strict):
    """Per-modality token lengths (docs/workloads.md, "Samplers"); a modality needs both its dists."""

    text_distribution: DistSpec | None = None
    image_distribution: DistSpec | None = None
    image_count_distribution: DistSpec | None = None
    audio_distribution: DistSpec | None = None
    audio_count_distribution: DistSpec | None = None
    video_distribution: DistSpec | None = None
    video_count_distribution: DistSpec | None = None


class MultiTurnSpec(_Strict):
    """Multi-turn sessions (docs/workloads.md); ``think_time_us`` in µs."""

    max_rounds: Annotated[int, Field(ge=1)]
    think_time_us: NonNegInt = 0
    context_growth: Literal["", "accumulate"] = ""
    single_session: bool = False


class ReasoningSpec(_Strict):
    reason_ratio_distribution: DistSpec | None = None
    multi_turn: MultiTurnSpec | None = None


class ClientSpec(_Strict):
    """One client of the workload (docs/workloads.md). ``timeout`` is µs per request (0 = none)."""

    id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    rate_fraction: FiniteFloat = 0.0
    arrival: ArrivalSpec
    input_distribution: DistSpec | None = None
    output_distribution: DistSpec
    prefix_group: str = ""
    prefix_length: Tokens = 0
    streaming: bool = False
    network: NetworkSpec | None = None
    lifecycle: LifecycleSpec | None = None
    multimodal: MultimodalSpec | None = None
    reasoning: ReasoningSpec | None = None
    timeout: int | None = None
    closed_loop: bool | None = None


class DiurnalSpec(_Strict):
    peak_hour: Annotated[int, Field(ge=0, le=23)]
    peak_to_trough_ratio: Annotated[float, Field(ge=1, allow_inf_nan=False)]


class SpikeSpec(_Strict):
    start_time_us: NonNegInt
    duration_us: Annotated[int, Field(gt=0)]


class DrainSpec(_Strict):
    start_time_us: NonNegInt
    ramp_duration_us: Annotated[int, Field(gt=0)]


class CohortSpec(_Strict):
    """A population of identical clients (docs/workloads.md, "Cohorts"), expanded by
    :func:`blis_simpy.workload.expand.expand_cohort`."""

    id: str = ""
    population: Annotated[int, Field(ge=1, le=100_000)]
    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    arrival: ArrivalSpec
    input_distribution: DistSpec
    output_distribution: DistSpec
    prefix_group: str = ""
    streaming: bool = False
    rate_fraction: FiniteFloat = 0.0
    diurnal: DiurnalSpec | None = None
    spike: SpikeSpec | None = None
    drain: DrainSpec | None = None


class ServeGenDataSpec(_Strict):
    """ServeGen chunk directory (docs/workloads.md, "ServeGen"); span bounds in s, 0 = open."""

    path: str
    span_start: NonNegFloat = 0.0
    span_end: NonNegFloat = 0.0


#: an inference-perf stage's rate (req/s) and duration (s) ranges: 10,000 stages of the longest
#: duration end before 2^63 µs, and a multi-turn client's rounds (rate x duration) and think
#: time (N·M / rate in µs) fit int64; outside them the expansion overflowed
MIN_STAGE_RATE = 1e-6
MAX_STAGE_RATE = 1e9
MAX_STAGE_DURATION_S = 1e8


class StageSpec(_Strict):
    rate: Annotated[float, Field(ge=MIN_STAGE_RATE, le=MAX_STAGE_RATE, allow_inf_nan=False)]
    duration: Annotated[float, Field(gt=0, le=MAX_STAGE_DURATION_S, allow_inf_nan=False)]


#: inference-perf: the most clients (stages x system prompts x users) and stages a definition expands to
MAX_INFERENCE_PERF_CLIENTS = 100_000
MAX_INFERENCE_PERF_STAGES = 10_000


class SharedPrefixSpec(_Strict):
    num_unique_system_prompts: Annotated[int, Field(gt=0, le=MAX_INFERENCE_PERF_CLIENTS)]
    num_users_per_system_prompt: Annotated[int, Field(gt=0, le=MAX_INFERENCE_PERF_CLIENTS)]
    system_prompt_len: Tokens = 0
    question_len: Tokens = 0
    output_len: Tokens = 0
    enable_multi_turn_chat: bool = False


class InferencePerfSpec(_Strict):
    """inference-perf stages + shared prefix (docs/workloads.md, "inference-perf"), expanded by
    :func:`blis_simpy.workload.expand.expand_inference_perf`."""

    stages: list[StageSpec] = Field(min_length=1, max_length=MAX_INFERENCE_PERF_STAGES)
    shared_prefix: SharedPrefixSpec

    @field_validator("shared_prefix")
    @classmethod
    def _few_clients(cls, v: SharedPrefixSpec, info: ValidationInfo) -> SharedPrefixSpec:
        n = v.num_unique_system_prompts * v.num_users_per_system_prompt
        if n > MAX_INFERENCE_PERF_CLIENTS:
            raise ValueError(f"{n} clients (system prompts x users), at most {MAX_INFERENCE_PERF_CLIENTS}")
        # every stage has its own N x M clients: 10,000 stages of 100,000 were 10^9 clients
        stages = len(info.data.get("stages") or ())
        if stages * n > MAX_INFERENCE_PERF_CLIENTS:
            raise ValueError(f"{stages * n} clients ({stages} stages x {n} system prompts x users), "
                             f"at most {MAX_INFERENCE_PERF_CLIENTS}")
        return v


class WorkloadSpecV2(_Strict):
    """A v2 workload spec. ``version`` "" or "1" is upgraded to "2" by :func:`upgrade_v1`."""

    version: str = ""
    seed: int = 0
    category: str = ""
    aggregate_rate: FiniteFloat = 0.0
    num_requests: Annotated[int, Field(ge=0, le=MAX_REQUESTS)] = 0     # docs/scenarios.md "Limits"
    horizon: Annotated[int, Field(ge=0, le=MAX_INT64)] = 0
    clients: list[ClientSpec] = Field(default_factory=list)
    cohorts: list[CohortSpec] = Field(default_factory=list)
    servegen_data: ServeGenDataSpec | None = None
    inference_perf: InferencePerfSpec | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _version_to_str(cls, v: Any) -> Any:
        # Go's yaml decodes ``version: 2`` into the string "2"
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


# ---------------------------------------------------------------------------- upgrade / check

def upgrade_v1(spec: WorkloadSpecV2) -> WorkloadSpecV2:
    """Upgrade a v1 spec ("" or "1"): SLO realtime→critical, interactive→standard (warning)."""
    if spec.version not in ("", "1"):
        return spec
    log.warning("workload spec version %r is deprecated; upgraded to \"2\"", spec.version)
    clients = [c.model_copy(update={"slo_class": V1_SLO_UPGRADE.get(c.slo_class, c.slo_class)})
               for c in spec.clients]
    cohorts = [c.model_copy(update={"slo_class": V1_SLO_UPGRADE.get(c.slo_class, c.slo_class)})
               for c in spec.cohorts]
    return spec.model_copy(update={"version": "2", "clients": clients, "cohorts": cohorts})


def _check_dist(d: DistSpec, field: str) -> None:
    if d.file:
        raise ConfigError("file-based distributions are not implemented", field=f"{field}.file")
    make_length_sampler(d.type, d.params, field)


def _check_arrival(a: ArrivalSpec, field: str) -> None:
    if a.process not in ARRIVAL_PROCESSES:
        raise ConfigError(f"unknown arrival process {a.process!r} "
                          f"(valid: {', '.join(ARRIVAL_PROCESSES)})", field=f"{field}.process")
    if a.cv is not None:
        if not (math.isfinite(a.cv) and a.cv > 0):
            raise ConfigError(f"must be a finite number > 0, got {a.cv}", field=f"{field}.cv")
        lo, hi = WEIBULL_CV_RANGE
        if a.process == "weibull" and not lo <= a.cv <= hi:
            raise ConfigError(f"weibull cv must be in [{lo}, {hi}], got {a.cv}", field=f"{field}.cv")


def _check_common(c: ClientSpec | CohortSpec, f: str) -> None:
    if not (math.isfinite(c.rate_fraction) and c.rate_fraction > 0):
        raise ConfigError(f"must be a finite number > 0, got {c.rate_fraction}",
                          field=f"{f}.rate_fraction")
    if c.slo_class not in SLO_CLASSES:
        raise ConfigError(f"unknown SLO class {c.slo_class!r} (valid: "
                          f"{', '.join(s for s in SLO_CLASSES if s)} or empty)", field=f"{f}.slo_class")
    _check_arrival(c.arrival, f"{f}.arrival")


def _check_client(c: ClientSpec, f: str) -> None:
    _check_common(c, f)
    if c.input_distribution is not None:
        _check_dist(c.input_distribution, f"{f}.input_distribution")
    elif c.multimodal is None:
        raise ConfigError("required key is missing", field=f"{f}.input_distribution")
    _check_dist(c.output_distribution, f"{f}.output_distribution")
    if c.timeout is not None and c.timeout < 0:
        raise ConfigError(f"must be >= 0 µs, got {c.timeout}", field=f"{f}.timeout")
    if c.lifecycle is not None:
        for j, w in enumerate(c.lifecycle.windows):
            if w.end_us < w.start_us:
                raise ConfigError(f"end_us ({w.end_us}) is before start_us ({w.start_us})",
                                  field=f"{f}.lifecycle.windows[{j}].end_us")
    if c.multimodal is not None:
        for name in MultimodalSpec.model_fields:
            d = getattr(c.multimodal, name)
            if d is not None:
                _check_dist(d, f"{f}.multimodal.{name}")
    if c.reasoning is not None and c.reasoning.reason_ratio_distribution is not None:
        _check_dist(c.reasoning.reason_ratio_distribution,
                    f"{f}.reasoning.reason_ratio_distribution")


def validate_spec(spec: WorkloadSpecV2) -> None:
    """Semantic validation of an (upgraded) spec; raises ConfigError naming the field."""
    if spec.version != "2":
        raise ConfigError(f"unsupported version {spec.version!r} (expected \"2\")", field="version")
    if spec.category not in CATEGORIES:
        raise ConfigError(f"unknown category {spec.category!r} (valid: language, multimodal, "
                          "reasoning or empty)", field="category")
    sources = [n for n, on in (("clients", bool(spec.clients)),
                               ("servegen_data", spec.servegen_data is not None),
                               ("inference_perf", spec.inference_perf is not None)) if on]
    if len(sources) > 1:
        raise ConfigError(f"{' and '.join(sources)} are mutually exclusive", field=sources[1])
    if not (spec.clients or spec.cohorts or spec.servegen_data or spec.inference_perf):
        raise ConfigError("at least one client, cohort or servegen_data source is required",
                          field="clients")
    if spec.inference_perf is None and not (math.isfinite(spec.aggregate_rate)
                                            and spec.aggregate_rate > 0):
        raise ConfigError(f"must be a finite number > 0 (req/s), got {spec.aggregate_rate}",
                          field="aggregate_rate")
    for i, c in enumerate(spec.clients):
        _check_client(c, f"client[{i}]")
    for i, c in enumerate(spec.cohorts):
        f = f"cohort[{i}]"
        _check_common(c, f)
        _check_dist(c.input_distribution, f"{f}.input_distribution")
        _check_dist(c.output_distribution, f"{f}.output_distribution")


def parse_workload_spec(data: Any, path: str | None = None, node=None) -> WorkloadSpecV2:
    """Validate a decoded YAML/JSON mapping into an upgraded, checked spec."""
    if not isinstance(data, dict):
        raise ConfigError("workload spec must be a YAML mapping", file=path, line=1 if path else None)
    try:
        spec = upgrade_v1(WorkloadSpecV2.model_validate(data))
        validate_spec(spec)
    except ValidationError as e:
        raise _yaml.from_validation_error(e, path, node, WorkloadSpecV2) from None
    except ConfigError as e:
        raise (_yaml.locate(e, path, node) if path else e) from None
    return spec


def load_workload_spec(path: str | os.PathLike) -> WorkloadSpecV2:
    """Read, upgrade and validate a workload-spec YAML; errors carry file, line and field."""
    path = str(path)
    data, node = _yaml.load_yaml(path)
    return parse_workload_spec(data, path, node)
