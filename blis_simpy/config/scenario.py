"""The scenario: one validated description of a deployment, its engines and its workload.

A scenario YAML file is the first-class input; BLIS's command-line flags override its keys
(``blis_simpy.cli.flags`` holds the flag → key table). Every model forbids unknown keys and
rejects wrong types, negative numbers where BLIS requires ≥ 0, and NaN/Inf.

Units: ``*_us`` are integer microseconds; ``rate`` is requests per second; token counts are
tokens; KV sizes are blocks of ``block_size`` tokens.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from blis_simpy.bounds import (
    MAX_CONCURRENCY,
    MAX_LOAD_PIECES,
    MAX_LOAD_RATE,
    MAX_REQUESTS,
    MAX_STAGE_S,
    MAX_THINK_MS,
    MAX_TOKENS,
)
from blis_simpy.latency.frontend import FrontendParams
from blis_simpy.metrics.fitness import FITNESS_KEYS
from blis_simpy.units import MAX_INT64

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]
#: KV blocks per instance: the cache keeps a few Python objects per block, so an absurd count
#: would exhaust memory before the run starts (1e11 was a MemoryError)
MAX_KV_BLOCKS = 100_000_000
KVBlocks = Annotated[int, Field(gt=0, le=MAX_KV_BLOCKS)]
#: data-parallel ranks per engine: every rank is a simulated engine core, so untrusted input
#: must not be able to ask for millions of them
MAX_DP = 1024
# Upper bounds of every count, size and delay a scenario (or its flag) can set
# (docs/scenarios.md, "Limits"). Each is far above any real deployment; together they keep
# what a scenario can make the simulator allocate, loop over or add to its clock finite.
#: tokens per KV block: the fast engine keeps one set per token slot of a block
MAX_BLOCK_SIZE = 1024
#: running-batch cap (requests)
MAX_RUNNING_REQS = 1_048_576
#: engine instances, and simulated engine ranks (instances x dp) in all
MAX_INSTANCES = 4096
#: tensor parallelism (GPUs per engine rank)
MAX_TP = 256
#: control-plane latencies, KV reload and fabric base latencies, refresh intervals: one hour
#: of simulated time, in µs (also the longest engine step, ``engine.limits.MAX_STEP_US``)
MAX_DELAY_US = 3_600_000_000
#: the KV-transfer fabric's bandwidth range, GB/s (1 MB/s to 1 PB/s), and its largest KV
#: footprint per token, bytes (1 GiB)
MIN_FABRIC_GBPS, MAX_FABRIC_GBPS = 1e-3, 1e6
MAX_KV_BYTES_PER_TOKEN = 2**30
#: the CPU→GPU KV reload bandwidth range, blocks/µs
MIN_RELOAD_BLOCKS_PER_US, MAX_RELOAD_BLOCKS_PER_US = 1e-6, 1e6
#: the largest CPU KV offload tier, GiB (64 TiB: beyond the host memory of any server)
MAX_KV_CPU_GIB = 65536.0
#: why an API server is refused with ``disaggregation.compat: checkout`` (docs/frontend.md)
FRONTEND_CHECKOUT = ("cannot be combined with disaggregation.compat checkout (BLIS parity has no "
                     "API server): set every cost to 0 or use compat fixed")
Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
PosTokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
DelayUs = Annotated[int, Field(ge=0, le=MAX_DELAY_US)]
Instances = Annotated[int, Field(ge=0, le=MAX_INSTANCES)]


class Strict(BaseModel):
    """Base: unknown keys are errors, no silent type coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


class GPUEntry(Strict):
    """A GPU added in the scenario (figures are dense, no sparsity)."""

    tflops_peak: PosFloat = Field(description="dense BF16/FP16 TFLOP/s")
    tflops_fp8: NonNegFloat = Field(0.0, description="dense FP8 TFLOP/s; 0 = none")
    bw_peak_tbs: PosFloat = Field(description="memory bandwidth, TB/s")
    mfu_prefill: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
    mfu_decode: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
    memory_gib: PosFloat = Field(description="device memory, GiB")
    source: str = ""
    # optional (None = keep the value of the GPU this entry replaces, else the GPUSpec default)
    memory_torch_gib: NonNegFloat | None = Field(
        None, description="device memory as the driver reports it (cudaMemGetInfo total), GiB")
    interconnect: str | None = Field(None, description="GPU-to-GPU link of TP/EP collectives: nvlink | pcie")
    interconnect_gen: NonNegInt | None = Field(None, description="NVLink 3/4/5 or PCIe 4/5")
    link_bw_gbps: NonNegFloat | None = Field(
        None, description="link bandwidth per GPU and per direction, GB/s")
    host_link_gbps: NonNegFloat | None = Field(
        None, description="host (CPU) <-> GPU link bandwidth per GPU and per direction, GB/s "
                          "(CPU KV offload); 0 = unknown")
    p2p: bool | None = Field(None, description="direct GPU peer-to-peer access")
    collective_latency_us: NonNegFloat | None = Field(
        None, description="fixed cost of one collective, µs")
    bw_sustained_tbs: NonNegFloat | None = Field(
        None, description="measured sustained memory bandwidth, TB/s (0 = unknown: physics uses the peak)")
    tflops_sustained: NonNegFloat | None = Field(
        None, description="measured large-GEMM dense BF16 rate, TFLOP/s (0 = unknown: physics uses the peak)")
    price_per_hour_usd: PosFloat | None = Field(
        None, description="USD per GPU-hour (deployment cost; docs/metrics.md)")

    @field_validator("interconnect")
    @classmethod
    def _known_interconnect(cls, v: str | None) -> str | None:
        if v is not None and v not in ("nvlink", "pcie"):
            raise ValueError("must be one of nvlink, pcie")
        return v


class LatencyConfig(Strict):
    """Which latency backend times the steps, and its coefficients (docs/latency-models.md)."""

    model: str = Field("physics", description="blackbox | physics | trained-physics | roofline | "
                                               "crossmodel | trained-roofline | a plugin's name; "
                                               "default physics, blackbox when both alpha_coeffs "
                                               "and beta_coeffs are given")
    params: dict = Field(default_factory=dict,
                         description="the backend's own parameters (a plugin's Params; built-ins take none)")
    alpha_coeffs: list[NonNegFloat] | None = Field(
        None, description="alpha0 (µs), alpha1 (µs/input token), alpha2 (µs/output token)")
    beta_coeffs: list[NonNegFloat] | None = Field(
        None, description="beta0 (µs/step), beta1 (µs/prefill token), beta2 (µs/decode token), ...")
    coefficients: str = Field(
        "", description="coefficient-set file (YAML, as `blis-simpy fit` writes) for this backend; "
                        "`default` = physics' physical default set; empty: physics uses the GPU's "
                        "built-in set, else the default")
    compat: Literal["fixed", "checkout"] = Field(
        "fixed", description="checkout = BLIS 89bece82 parity: roofline MoE weights at batch 0, "
                             "MoE threshold E > 0 (docs/divergences.md #8, #9)")

    @model_validator(mode="after")
    def _coefficients_mean_blackbox(self):
        """As on the command line: given both coefficient lists and no backend, blackbox."""
        if ("model" not in self.model_fields_set and self.alpha_coeffs is not None
                and self.beta_coeffs is not None):
            self.model = "blackbox"
        return self


class EngineConfig(Strict):
    """vLLM engine limits and KV cache of every instance (docs/engine.md, docs/kv-cache.md)."""

    total_kv_blocks: KVBlocks | None = Field(
        None, description="GPU KV blocks per instance (at most 100,000,000: 1.6 billion tokens at "
                          "16 a block); None = resolve from catalog / default")
    block_size: Annotated[int, Field(gt=0, le=MAX_BLOCK_SIZE)] = Field(
        16, description="tokens per KV block (--block-size-in-tokens), at most 1024")
    max_num_running_reqs: Annotated[int, Field(gt=0, le=MAX_RUNNING_REQS)] = Field(
        256, description="running-batch cap, at most 1,048,576")
    max_num_scheduled_tokens: PosTokens = Field(2048, description="per-step token budget")
    long_prefill_token_threshold: Tokens = Field(0, description="prefill chunk cap; 0 = off")
    max_model_len: Tokens = Field(0, description="context cap in tokens; 0 = unlimited")
    scheduler: str = Field("fcfs", description="fcfs | priority-fcfs | sjf | reverse-priority")
    priority_policy: str = Field("constant", description="constant | slo-based | inverted-slo")
    kv_cache_dtype: Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="KV cache element type (vLLM --kv-cache-dtype); auto = the model dtype. "
                            "Read by the physics backend and the vllm KV capacity model")
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = Field(
        0.9, description="fraction of GPU memory vLLM may use (KV auto-sizing only)")
    kv_capacity_model: Literal["vllm", "blis"] = Field(
        "vllm", description="KV auto-sizing: vllm (per GPU, as vLLM profiles it) or blis (BLIS's "
                            "formula, parity)")
    preemption_model: Literal["vllm", "blis"] = Field(
        "vllm", description="recompute preemption: vllm (prompt + outputs so far recomputed as a "
                            "prefill, as vLLM v1) or blis (outputs regenerated, BLIS parity)")
    step_model: Literal["vllm", "blis"] = Field(
        "vllm", description="what a step whose requests all finish does to the instance: vllm "
                            "(default; it holds the engine until it ends, as vLLM's engine core "
                            "runs one step at a time) or blis (the instance is idle from the "
                            "step's start, so a later arrival may start a step that overlaps it; "
                            "parity)")
    async_scheduling: bool = Field(
        True, description="vLLM's async scheduling: a step's batch is chosen when the step before it "
                          "starts, so a request queued during a step is admitted one step later "
                          "(default, as vLLM >= 0.12 runs); false = BLIS (admitted at the next step)")
    kv_cpu_blocks: Annotated[int, Field(ge=0, le=MAX_KV_BLOCKS)] = Field(
        0, description="CPU KV tier blocks; 0 = GPU tier only")
    kv_offload_threshold: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = Field(
        0.9, description="deprecated and ignored (BLIS keeps the flag)")
    kv_transfer_bandwidth: Annotated[float, Field(
        ge=MIN_RELOAD_BLOCKS_PER_US, le=MAX_RELOAD_BLOCKS_PER_US, allow_inf_nan=False)] = Field(
        100.0, description="CPU→GPU reload bandwidth, blocks/µs (1e-6 to 1e6)")
    kv_transfer_base_latency_us: DelayUs = Field(0, description="fixed cost per reloaded block, µs")
    kv_cpu_gib: Annotated[float, Field(ge=0, le=MAX_KV_CPU_GIB, allow_inf_nan=False)] = Field(
        0.0, description="CPU KV offload tier of vLLM's OffloadingConnector (--kv-offloading-size, "
                         "native backend), GiB per engine (DP rank), split over its TP ranks; at "
                         "most 65536; 0 = off. Exclusive with kv_cpu_blocks (BLIS's mirror tier)")
    kv_cpu_latency_us: DelayUs = Field(
        0, description="fixed cost of one CPU offload transfer job (one direction), µs; the "
                       "bytes move at the GPU catalog's host_link_gbps")
    implementation: str = Field(
        "fast", description="registered engine implementation: fast (lazy decode set), reference "
                            "(literal per-request loops) or a plugin's name")
    kv_cache: str | None = Field(
        None, description="registered KV cache: gpu | tiered | offload | a plugin's name; None = "
                           "offload when kv_cpu_gib > 0, tiered when kv_cpu_blocks > 0, else gpu")
    kv_cache_params: dict = Field(
        default_factory=dict, description="the KV cache's own parameters (its Params; tiered: "
                                          "cpu_blocks, transfer_bandwidth, transfer_base_latency_us, "
                                          "offload_threshold, by default the kv_* keys above)")
    batching: str = Field(
        "vllm", description="registered batching policy: vllm (chunked prefill, recompute "
                            "preemption) or a plugin's name (docs/extending.md)")
    batching_params: dict = Field(default_factory=dict, description="the batching policy's own "
                                                                     "parameters (its Params)")


class AdmissionConfig(Strict):
    """``params`` are the policy's own (token-bucket: capacity, refill_rate; tier-shed:
    threshold, min_priority)."""

    policy: str = "always-admit"
    params: dict = Field(default_factory=dict)


class RoutingConfig(Strict):
    """``params`` are the policy's own (weighted: scorers, tie_break; least-loaded: tie_break)."""

    policy: str = "round-robin"
    params: dict = Field(default_factory=dict)


class FairShareConfig(Strict):
    """Weighted fair share of the gateway queue between flows (docs/control-plane.md,
    "Gateway queue")."""

    key: Literal["tenant", "slo_class"] = Field(
        "tenant", description="what a flow is: the request's tenant_id or its SLO class (empty = default)")
    weights: dict[str, PosFloat] = Field(default_factory=dict, description="flow -> weight (> 0)")
    default_weight: PosFloat = Field(1.0, description="weight of a flow not in weights")


class GatewayConfig(Strict):
    """A gateway queue with flow control between admission and routing (docs/control-plane.md,
    "Gateway queue"); absent = none. Depths and limits are requests; 0 = unlimited."""

    policy: str = Field("standard", description="registered gateway policy: standard or a plugin's name")
    params: dict = Field(default_factory=dict, description="the policy's own parameters (its Params)")
    max_depth: Annotated[int, Field(ge=0, le=MAX_REQUESTS)] = Field(
        0, description="queued requests at most; a request arriving at a full queue is shed (or a victim, shed: lowest)")
    order: Literal["fifo", "priority", "slo-deadline"] = Field(
        "fifo", description="fifo (arrival) | priority (SLO band, then arrival) | slo-deadline "
                            "(arrival + the class's slo TTFT target, earliest first)")
    shed: Literal["arriving", "lowest"] = Field(
        "arriving", description="when full: shed the arriving request, or (lowest) the queued "
                                "sheddable one that ranks last when the arriving one outranks it")
    band_queue_limit: Annotated[int, Field(ge=0, le=MAX_REQUESTS)] = Field(
        0, description="queued requests per priority band at most (BLIS --per-band-capacity)")
    band_inflight_limit: Annotated[int, Field(ge=0, le=MAX_REQUESTS)] = Field(
        0, description="requests per priority band sent on and not yet finished, at most")
    detector: Literal["never", "concurrency", "utilization"] = Field(
        "never", description="when the cluster has room for one more request (flow control)")
    max_concurrency: Annotated[int, Field(gt=0, le=MAX_REQUESTS)] = Field(
        100, description="concurrency: in-flight requests per instance below which there is room")
    queue_depth_threshold: PosFloat = Field(5.0, description="utilization: wait-queue length of a full instance")
    kv_util_threshold: PosFloat = Field(0.8, description="utilization: KV utilisation of a full instance")
    dispatch_tick_us: Annotated[int, Field(gt=0, le=MAX_DELAY_US)] = Field(
        1000, description="utilization: re-check every this many µs while requests wait")
    fair_share: FairShareConfig | None = Field(
        None, description="weighted fair share between flows; None = the best-ranked head first")
#: the autoscaler's decision interval, s (1 ms to one simulated day), and its start-up delay, s
MIN_AUTOSCALE_INTERVAL_S, MAX_AUTOSCALE_INTERVAL_S = 0.001, 86_400.0
MAX_STARTUP_S = MAX_DELAY_US / 1e6


def _check_bounds(model, kind: str):
    """``min_instances <= initial_instances <= max_instances`` of an autoscaler or one of its
    pools, as a located error."""
    def bad(field: str, problem: str, value):
        return ValidationError.from_exception_data(type(model).__name__, [InitErrorDetails(
            type=PydanticCustomError(kind, problem), loc=(field,), input=value)])
    if model.min_instances > model.max_instances:
        raise bad("min_instances", f"min_instances {model.min_instances} is above "
                  f"max_instances {model.max_instances}", model.min_instances)
    n = model.initial_instances
    if n is not None and not model.min_instances <= n <= model.max_instances:
        raise bad("initial_instances", f"initial_instances {n} is outside [min_instances "
                  f"{model.min_instances}, max_instances {model.max_instances}]", n)
    return model


class PoolAutoscaleConfig(Strict):
    """The bounds of one prefill/decode pool under the autoscaler (``cluster.autoscaler.pools``;
    docs/control-plane.md, "Autoscaling prefill/decode pools"). ``initial_instances`` (None =
    the pool's ``disaggregation.<pool>_instances`` clamped to [min, max]) serve from time 0."""

    min_instances: Annotated[int, Field(gt=0, le=MAX_INSTANCES)] = 1
    max_instances: Annotated[int, Field(gt=0, le=MAX_INSTANCES)] = 1
    initial_instances: Annotated[int, Field(gt=0, le=MAX_INSTANCES)] | None = None

    @model_validator(mode="after")
    def _bounds(self) -> PoolAutoscaleConfig:
        return _check_bounds(self, "autoscaler_pool_bounds")


class AutoscalerConfig(Strict):
    """The autoscaler (docs/control-plane.md, "Autoscaling"): every ``interval_s`` a policy
    sets the number of instances between ``min_instances`` and ``max_instances``. A new
    instance serves after its loading delay: ``startup_s`` + the model's weight bytes over
    ``load_bandwidth_gbps`` (GB/s, 1 GB = 1e9 B; None = no weight loading, start-up only).
    ``initial_instances`` (None = ``cluster.num_instances`` clamped to [min, max]) serve from
    time 0."""

    policy: str = Field("target-utilization", description="registered autoscaling policy: "
                        "target-utilization | queue-depth | scheduled | a plugin's name")
    params: dict = Field(default_factory=dict, description="the policy's own parameters (its Params)")
    interval_s: Annotated[float, Field(ge=MIN_AUTOSCALE_INTERVAL_S, le=MAX_AUTOSCALE_INTERVAL_S,
                                       allow_inf_nan=False)] = Field(
        15.0, description="seconds between decisions, 0.001 to 86400 (default 15, the Kubernetes "
                          "HPA's sync period)")
    min_instances: Annotated[int, Field(gt=0, le=MAX_INSTANCES)] = 1
    max_instances: Annotated[int, Field(gt=0, le=MAX_INSTANCES)] = 1
    initial_instances: Annotated[int, Field(gt=0, le=MAX_INSTANCES)] | None = None
    load_bandwidth_gbps: Annotated[float, Field(ge=MIN_FABRIC_GBPS, le=MAX_FABRIC_GBPS,
                                                allow_inf_nan=False)] | None = Field(
        2.0, description="GB/s at which a new instance loads its weights (0.001 to 1e6); None = "
                         "no weight loading")
    startup_s: Annotated[float, Field(ge=0, le=MAX_STARTUP_S, allow_inf_nan=False)] = Field(
        0.0, description="fixed start-up of a new instance before its weights load, s (at most 1 h)")
    pools: dict[Literal["prefill", "decode"], PoolAutoscaleConfig] | None = Field(
        None, description="with prefill/decode pools: the bounds of each pool scaled (a pool "
                          "not named keeps its size); None without pools")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalerConfig:
        return _check_bounds(self, "autoscaler_bounds")

    def pool_bounds(self, sizes: dict[str, int]) -> dict[str, PoolAutoscaleConfig]:
        """Each pool's bounds, resolved: ``sizes`` are the pools' configured instance counts
        (``disaggregation.prefill_instances``, ``decode_instances``); a pool not in
        :attr:`pools` is fixed at its size; an unset ``initial_instances`` is the size clamped
        to [min, max]."""
        out = {}
        for name, n in sizes.items():
            b = (self.pools or {}).get(name)
            if b is None:
                b = PoolAutoscaleConfig(min_instances=n, max_instances=n, initial_instances=n)
            elif b.initial_instances is None:
                b = b.model_copy(update={"initial_instances": min(max(n, b.min_instances),
                                                                  b.max_instances)})
            out[name] = b
        return out


class ClusterConfig(Strict):
    """The control plane in front of the instances (docs/control-plane.md)."""

    num_instances: Annotated[int, Field(gt=0, le=MAX_INSTANCES)] = 1
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    admission_latency_us: DelayUs = 0
    routing_latency_us: DelayUs = 0
    snapshot_refresh_interval_us: DelayUs = Field(
        0, description="0 = routers see instance state as of now; I > 0 = refreshed every I µs")
    implementation: str | None = Field(
        None, description="registered cluster class: standard | pd | a plugin's name; None = pd "
                          "with prefill/decode pools, else standard")
    gateway: GatewayConfig | None = Field(
        None, description="a gateway queue with flow control after admission; None = none")
    autoscaler: AutoscalerConfig | None = Field(
        None, description="scale the instances over the run (docs/control-plane.md, "
                          "\"Autoscaling\"); None = a fixed deployment of num_instances")

    @property
    def built_instances(self) -> int:
        """Instances the simulation builds: ``max_instances`` with an autoscaler (those not
        serving take no request), else ``num_instances``."""
        a = self.autoscaler
        return a.max_instances if a is not None else self.num_instances

    @property
    def initial_instances(self) -> int:
        """Instances serving at time 0: ``num_instances``, or with an autoscaler its
        ``initial_instances`` (None: ``num_instances`` clamped to [min, max])."""
        a = self.autoscaler
        if a is None:
            return self.num_instances
        if a.initial_instances is not None:
            return a.initial_instances
        return min(max(self.num_instances, a.min_instances), a.max_instances)


class TraceConfig(Strict):
    """The decision trace (docs/metrics.md, "Decision trace")."""

    level: Literal["none", "decisions"] = "none"
    counterfactual_k: Instances = Field(0, description="counterfactual candidates per routing record")
    summarize: bool = Field(False, description="print the Trace Summary section")


class MetricsConfig(Strict):
    """How the end-of-run metrics are kept (docs/metrics.md, "Streaming metrics")."""

    streaming: bool = Field(
        False, description="percentiles from DDSketch sketches (relative accuracy 0.01) and "
                           "requests dropped as they complete; false = exact percentiles")
    measured_at: Literal["server", "client"] = Field(
        "server", description="where latencies are taken (docs/frontend.md): server = from when "
                              "the engine gets the request to when it emits each token; client = "
                              "from the client's send to when each token reaches the client, "
                              "through the front end. The same without a front end")


class OutputConfig(Strict):
    """Extra output files of a run (docs/planning.md, "Reports")."""

    timeline: str = Field(
        "", description="write a per-instance timeline here (.csv or .parquet): running, waiting, "
                        "KV blocks, preemptions, engine steps, PD transfers in flight; empty = none")
    timeline_interval_ms: Annotated[float, Field(ge=1, le=86_400_000, allow_inf_nan=False)] = Field(
        100.0, description="simulated time between timeline samples, ms (1 ms to one day)")


class SLOClassTargets(Strict):
    """SLO targets of one SLO class, ms; unset keys take the defaults (docs/metrics.md)."""

    ttft_ms: PosFloat | None = Field(None, description="time-to-first-token target, ms")
    itl_ms: PosFloat | None = Field(None, description="mean inter-token latency target, ms")
    e2e_ms: PosFloat | None = Field(None, description="end-to-end latency target, ms")


class SLOConfig(SLOClassTargets):
    """SLO targets (ms) and per-SLO-class overrides (docs/metrics.md, "SLOs and goodput");
    ``--slo-ttft``/``--slo-itl``/``--slo-e2e`` override the top-level keys."""

    classes: dict[str, SLOClassTargets] = Field(
        default_factory=dict, description="SLO class -> its own targets (replace the defaults)")


class CostConfig(Strict):
    """Deployment cost (docs/metrics.md, "Deployment and cost")."""

    gpu_hour_usd: PosFloat | None = Field(
        None, description="USD per GPU-hour for every GPU; None = the GPU catalog's price, if any")


class LengthDist(Strict):
    """A clamped Gaussian token-length distribution (BLIS's distribution mode)."""

    mean: FiniteFloat
    stdev: FiniteFloat
    min: Annotated[int, Field(le=MAX_TOKENS)]
    max: Annotated[int, Field(le=MAX_TOKENS)]


# ---- closed-loop clients and time-varying open load (docs/workloads.md, issue 26 items 1-2)
StageSeconds = Annotated[float, Field(gt=0, le=MAX_STAGE_S, allow_inf_nan=False)]


class ThinkTime(Strict):
    """A closed-loop client's pause between the end of one request and its next send."""

    dist: Literal["constant", "exponential", "lognormal"] = Field(
        "constant", description="constant | exponential | lognormal")
    mean_ms: Annotated[float, Field(ge=0, le=MAX_THINK_MS, allow_inf_nan=False)] = Field(
        0.0, description="mean think time, ms (at most one day)")
    sigma: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False)] = Field(
        1.0, description="lognormal: standard deviation of the log, 0 < sigma <= 10")


class ConcurrencyStage(Strict):
    """``concurrency`` clients for ``duration_s`` seconds (0 clients = a pause), or until
    ``num_requests`` requests have been sent and have ended (inference-perf's concurrent stage)."""

    concurrency: Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)]
    duration_s: StageSeconds | None = None
    num_requests: Annotated[int, Field(gt=0, le=MAX_REQUESTS)] | None = None


class RateStage(Strict):
    """Open-loop arrivals at ``rate`` requests/s for ``duration_s`` seconds (inference-perf's stage)."""

    rate: Annotated[float, Field(gt=0, le=MAX_LOAD_RATE, allow_inf_nan=False)]
    duration_s: StageSeconds


class RatePoint(Strict):
    """From ``at_s`` seconds on (to the next point), arrivals at ``rate`` requests/s."""

    at_s: Annotated[float, Field(ge=0, le=MAX_STAGE_S, allow_inf_nan=False)]
    rate: Annotated[float, Field(ge=0, le=MAX_LOAD_RATE, allow_inf_nan=False)]


class ClosedLoopKeys(Strict):
    """The keys every workload source takes: closed-loop clients (docs/workloads.md,
    "Closed-loop clients"). None of them set = open loop, as before."""

    concurrency: Annotated[int, Field(gt=0, le=MAX_CONCURRENCY)] | None = Field(
        None, description="closed loop: this many clients, each sending its next request when its "
                          "previous one ended plus a think time (the source is the request pool)")
    concurrency_stages: Annotated[list[ConcurrencyStage], Field(min_length=1, max_length=MAX_LOAD_PIECES)] | None = Field(
        None, description="closed loop in stages: [{concurrency, duration_s | num_requests}], one "
                          "after the other")
    think_time: ThinkTime | None = Field(None, description="closed-loop think time (default 0)")

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None or self.concurrency_stages is not None


class DistributionWorkload(ClosedLoopKeys):
    """Synthesised from BLIS's distribution flags (docs/workloads.md)."""

    kind: Literal["distribution"] = "distribution"
    rate: PosFloat = Field(1.0, description="aggregate arrival rate, requests/s")
    num_requests: Annotated[int, Field(ge=0, le=MAX_REQUESTS)] = 100
    prompt_tokens: LengthDist = Field(
        default_factory=lambda: LengthDist(mean=512, stdev=256, min=2, max=7000))
    output_tokens: LengthDist = Field(
        default_factory=lambda: LengthDist(mean=512, stdev=256, min=2, max=7000))
    prefix_tokens: Tokens = 0
    arrival: Literal["constant", "poisson", "gamma"] = Field(
        "constant", description="arrival process: constant (BLIS's spacing 1/rate), poisson, gamma")
    arrival_cv: Annotated[float, Field(ge=1e-3, le=1e3, allow_inf_nan=False)] | None = Field(
        None, description="gamma's coefficient of variation of the gaps, 0.001 to 1000 (default 1.0)")
    stages: Annotated[list[RateStage], Field(min_length=1, max_length=MAX_LOAD_PIECES)] | None = Field(
        None, description="time-varying load: [{rate, duration_s}] one after the other, then none")
    rate_schedule: Annotated[list[RatePoint], Field(min_length=1, max_length=MAX_LOAD_PIECES)] | None = Field(
        None, description="time-varying load: [{at_s, rate}], each rate until the next point")
    rate_csv: str | None = Field(
        None, description="time-varying load: a CSV of time_s,rate rows (as rate_schedule)")

    @property
    def time_varying(self) -> bool:
        return self.stages is not None or self.rate_schedule is not None or self.rate_csv is not None


class TraceWorkload(ClosedLoopKeys):
    """Replay of a TraceV2 trace: YAML header + CSV (docs/workloads.md, "TraceV2")."""

    kind: Literal["trace"] = "trace"
    header: str
    data: str


class SpecWorkload(ClosedLoopKeys):
    """A workload-spec v2 (docs/workloads.md): a YAML file (``path``, relative to the scenario
    file) or the same keys inline (``spec``); BLIS's ``--workload-spec``. The spec's own
    ``seed``, ``horizon`` and ``num_requests`` apply unless the scenario's ``seed`` /
    ``horizon_us`` / this ``num_requests`` (or their flags) are given."""

    kind: Literal["spec"] = "spec"
    path: str = Field("", description="workload-spec YAML file")
    spec: dict[str, Any] | None = Field(None, description="the workload spec, inline")
    num_requests: Annotated[int, Field(ge=0, le=MAX_REQUESTS)] | None = Field(
        None, description="overrides the spec's num_requests")

    @model_validator(mode="after")
    def _one_source(self) -> SpecWorkload:
        if bool(self.path) == (self.spec is not None):
            raise ValueError("give exactly one of path (a workload-spec file) and spec (inline)")
        return self


Workload = Annotated[DistributionWorkload | TraceWorkload | SpecWorkload, Field(discriminator="kind")]


class PoolOverrides(Strict):
    """Per-pool replacements of the global instance config (docs/scenarios.md); None = inherit."""

    tp: Annotated[int, Field(gt=0, le=MAX_TP)] | None = None
    hardware: str | None = None
    latency_model: str | None = None
    max_model_len: PosTokens | None = None
    total_kv_blocks: KVBlocks | None = None
    routing: RoutingConfig | None = Field(
        None, description="this pool's own router (BLIS: --prefill/--decode-routing-scorers)")


class DeciderConfig(Strict):
    policy: str = Field("never", description="never | always | prefix-threshold | direct-to-decode | load-aware")
    params: dict = Field(default_factory=dict)


class TransferConfig(Strict):
    """The KV-transfer fabric between the pools (docs/disaggregation.md, "KV-transfer fabric")."""

    bandwidth_gbps: Annotated[float, Field(ge=MIN_FABRIC_GBPS, le=MAX_FABRIC_GBPS, allow_inf_nan=False)] = Field(
        25.0, description="shared fabric bandwidth, GB/s (1 GB = 1e9 B), 0.001 to 1e6")
    base_latency_ms: Annotated[float, Field(ge=0, le=MAX_DELAY_US / 1000, allow_inf_nan=False)] = Field(
        0.05, description="fixed cost per transfer, ms (at most one hour)")
    kv_bytes_per_token: Annotated[int, Field(gt=0, le=MAX_KV_BYTES_PER_TOKEN)] | None = Field(
        None, description="KV bytes per token; None = derived from the model shape")
    contention: Literal["none", "snapshot", "fair-share"] | None = Field(
        None, description="none: every transfer gets the full bandwidth; snapshot: BLIS's share "
                          "fixed at start; fair-share: processor sharing. None = fair-share "
                          "(compat checkout: none)")
    fabric: str = Field("default", description="registered fabric class: default | a plugin's name")


class InterferenceConfig(Strict):
    """Co-location slowdown of mixed prefill/decode batches (docs/disaggregation.md, "Interference")."""

    prefill: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 0.0
    decode: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 0.0


class DisaggregationConfig(Strict):
    """Prefill/decode pools (docs/disaggregation.md). Pools exist when both instance counts are > 0."""

    prefill_instances: Instances = 0
    decode_instances: Instances = 0
    decider: DeciderConfig = Field(default_factory=DeciderConfig)
    transfer: TransferConfig = Field(default_factory=TransferConfig)
    interference: InterferenceConfig = Field(default_factory=InterferenceConfig)
    prefill_pool: PoolOverrides = Field(default_factory=PoolOverrides)
    decode_pool: PoolOverrides = Field(default_factory=PoolOverrides)
    compat: Literal["fixed", "checkout"] = Field(
        "fixed", description="checkout: reproduce the Go checkout's PD behaviour (parity mode)")

    @property
    def enabled(self) -> bool:
        return self.prefill_instances > 0 and self.decode_instances > 0


class Variant(Strict):
    """One alternative of the base scenario, run side by side with the others on the same
    workload (``blis-simpy run``, docs/disaggregation.md). ``overrides`` is a partial
    scenario merged over the base as an RFC 7386 merge patch (mappings merge key by key,
    ``null`` removes a key, anything else replaces); ``blis_simpy.cli.variants`` validates
    the merged scenario in full and rejects keys that would change the workload."""

    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    overrides: dict[str, Any] = Field(default_factory=dict)


class Scenario(Strict):
    """Everything one simulation run needs."""

    name: str = ""
    description: str = ""
    seed: Annotated[int, Field(ge=-MAX_INT64 - 1, le=MAX_INT64)] = 42   # Go's int64, as --seed
    horizon_us: Annotated[int, Field(gt=0, le=MAX_INT64)] | None = Field(
        None, description="stop after this simulated time, µs (at most 2^63 - 1)")
    model: str = Field("", description="model ID, lower-cased for every lookup")
    hardware: str = ""
    tp: Annotated[int, Field(ge=0, le=MAX_TP)] = Field(0, description="tensor parallelism, at most 256")
    dp: Annotated[int, Field(gt=0, le=MAX_DP)] = Field(
        1, description="data-parallel ranks per engine instance (vLLM --data-parallel-size), at most "
                       "1024; each rank has its own scheduler, limits and KV pool")
    enable_expert_parallel: bool = Field(
        False, description="shard MoE experts over the TP x DP ranks (vLLM --enable-expert-parallel)")
    vllm_version: str = ""
    model_config_folder: str = Field("", description="folder with a HuggingFace config.json")
    hardware_config: str = Field("", description="BLIS hardware_config.json with extra GPUs")
    defaults_filepath: str = Field("", description="BLIS defaults.yaml read over the built-in coefficient catalog")
    gpus: dict[str, GPUEntry] = Field(default_factory=dict, description="extra GPUs by name")
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    frontend: FrontendParams | None = Field(
        None, description="the API server in front of every instance, costs in µs (docs/frontend.md); "
                          "None = the latency model's (none for the built-in ones); all 0 = no front end")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    disaggregation: DisaggregationConfig = Field(default_factory=DisaggregationConfig)
    workload: Workload = Field(default_factory=DistributionWorkload)
    plugins: list[str] = Field(default_factory=list, description="modules to import (custom policies)")
    trace: TraceConfig = Field(default_factory=TraceConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    slo: SLOConfig = Field(default_factory=SLOConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    fitness_weights: dict[str, NonNegFloat] = Field(
        default_factory=dict, description="fitness key -> weight (docs/metrics.md); empty = no fitness")
    variants: list[Variant] = Field(
        default_factory=list, description="alternatives run side by side on the same workload")

    @field_validator("fitness_weights")
    @classmethod
    def _fitness_keys(cls, v: dict) -> dict:
        for k in v:
            if k not in FITNESS_KEYS:
                raise ValueError(f"unknown fitness key {k!r}; valid keys: {', '.join(sorted(FITNESS_KEYS))}")
        return v

    @model_validator(mode="after")
    def _lower_model(self) -> Scenario:
        if self.model and self.model != self.model.lower():
            object.__setattr__(self, "model", self.model.lower())
        return self

    @model_validator(mode="after")
    def _engine_ranks(self) -> Scenario:
        """At most :data:`MAX_INSTANCES` simulated engine ranks (instances x dp) in all."""
        n = self.cluster.built_instances
        if n * self.dp > MAX_INSTANCES:
            raise ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                type=PydanticCustomError(
                    "too_many_ranks", "{n} instances x dp {dp} = {ranks} engine ranks; at most "
                    "{cap} can be simulated", {"n": n, "dp": self.dp, "ranks": n * self.dp,
                                               "cap": MAX_INSTANCES}),
                loc=("cluster", "num_instances") if self.cluster.autoscaler is None else
                ("cluster", "autoscaler", "max_instances"), input={"num_instances": n, "dp": self.dp})])
        return self

    @model_validator(mode="after")
    def _autoscaled_pools(self) -> Scenario:
        """With prefill/decode pools the autoscaler scales the pools (``pools``, not the
        one-pool bounds), every instance belongs to a pool, and the pools' largest sizes fit
        the simulator; without pools, ``pools`` is refused."""
        a, d = self.cluster.autoscaler, self.disaggregation
        if a is None:
            return self

        def bad(loc: tuple, problem: str, value):
            return ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                type=PydanticCustomError("autoscaled_pools", problem),
                loc=("cluster", "autoscaler", *loc), input=value)])
        if not d.enabled:
            if a.pools is not None:       # located at the first key given (a flag's)
                where: tuple = ("pools",)
                if a.pools:
                    name, b = next(iter(a.pools.items()))
                    where = ("pools", name, *sorted(b.model_fields_set)[:1])
                raise bad(where, "needs prefill/decode pools (disaggregation."
                          "prefill_instances and decode_instances > 0)", a.pools)
            return self
        given = [k for k in ("min_instances", "max_instances", "initial_instances")
                 if k in a.model_fields_set]
        if given:
            raise bad((given[0],), f"bounds one pool; with prefill/decode pools give "
                      f"cluster.autoscaler.pools.prefill.{given[0]} and/or .decode.{given[0]}",
                      getattr(a, given[0]))
        if not a.pools:
            raise bad((), "with prefill/decode pools, give the bounds of the pool(s) to scale "
                      "in cluster.autoscaler.pools (prefill, decode)", None)
        n = self.cluster.num_instances
        if n > d.prefill_instances + d.decode_instances:
            raise ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                type=PydanticCustomError(
                    "autoscaled_pools", "{n} instances, {p} prefill + {q} decode: the autoscaler "
                    "scales the pools, and an instance outside them is not supported",
                    {"n": n, "p": d.prefill_instances, "q": d.decode_instances}),
                loc=("cluster", "num_instances"), input=n)])
        sizes = {"prefill": d.prefill_instances, "decode": d.decode_instances}
        total = sum(b.max_instances for b in a.pool_bounds(sizes).values())
        if total > MAX_INSTANCES:
            raise bad(("pools",), f"the pools' max_instances add up to {total}; at most "
                      f"{MAX_INSTANCES} instances can be simulated", total)
        return self

    @model_validator(mode="after")
    def _one_cpu_tier(self) -> Scenario:
        """One CPU KV tier: BLIS's mirror (kv_cpu_blocks) or vLLM's offload (kv_cpu_gib), and
        the offload tier not with prefill/decode pools."""
        eng = self.engine
        if eng.kv_cpu_gib > 0 and (eng.kv_cpu_blocks > 0 or self.disaggregation.enabled):
            why = ("engine.kv_cpu_blocks (BLIS's mirror tier) is set too: choose one CPU tier"
                   if eng.kv_cpu_blocks > 0 else
                   "the CPU offload tier is not modelled with prefill/decode pools")
            raise ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                type=PydanticCustomError("one_cpu_tier", "{why}", {"why": why}),
                loc=("engine", "kv_cpu_gib"), input=eng.kv_cpu_gib)])
        return self

    @model_validator(mode="after")
    def _coefficient_lists_together(self) -> Scenario:
        """Without a backend named, one coefficient list alone is refused on that list, as
        ``--beta-coeffs`` alone is on the command line (both select blackbox)."""
        lat = self.latency
        given = [k for k in ("alpha_coeffs", "beta_coeffs") if getattr(lat, k) is not None]
        if "model" not in lat.model_fields_set and len(given) == 1:
            other = "beta_coeffs" if given[0] == "alpha_coeffs" else "alpha_coeffs"
            raise ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                type=PydanticCustomError(
                    "coefficients_together", "must be given together with latency.{other} "
                    "(both select blackbox), or name latency.model", {"other": other}),
                loc=("latency", given[0]), input=getattr(lat, given[0]))])
        return self

    @model_validator(mode="after")
    def _no_front_end_in_parity_mode(self) -> Scenario:
        """BLIS's PD parity mode has no API server in front of the instances (docs/frontend.md);
        a latency model's own front end is refused when the simulation is built."""
        d = self.disaggregation
        if self.frontend is not None and self.frontend.active and d.enabled and d.compat == "checkout":
            raise ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                type=PydanticCustomError("frontend_checkout", FRONTEND_CHECKOUT),
                loc=("frontend",), input=self.frontend.model_dump())])
        return self

    @property
    def horizon(self) -> int:
        return self.horizon_us if self.horizon_us is not None else MAX_INT64
