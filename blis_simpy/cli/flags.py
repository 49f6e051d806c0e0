"""BLIS's command-line flags (docs/cli.md) as one table.

Each :class:`Flag` row says: the BLIS flag name, how its text is parsed, the scenario key it
sets (dotted path; ``None`` = read by the CLI itself), the validation rule, and which
commands accept it. Adding a flag is one row. The table order is BLIS's processing order
(docs/cli.md, "Validation order"), so the first error reported is the one BLIS would report.
The parsers and rules are in :mod:`blis_simpy.cli.flag_values`; applying the given flags to
a scenario, with the cross-flag rules that run right after their row, is
:mod:`blis_simpy.cli.flag_rules`. Values carry the unit of the key they set (the help says it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blis_simpy.cli.flag_values import (
    Rule,
    at_least_one,
    boolean,
    decider_rule,
    decider_text,
    each_non_negative,
    fitness_text,
    fraction,
    integer,
    interference_range,
    lowered,
    non_negative,
    number,
    numbers,
    one_of,
    out_path,
    positive,
    priority_range,
    registered,
    scorer_text,
    text,
    tie_break,
    trace_level,
    unit_interval,
    weights_text,
)
from blis_simpy.cli.logs import LOG_LEVEL_NAMES

RUN, REPLAY = "run", "replay"
BOTH = (RUN, REPLAY)
SIM, WORKLOAD, OUTPUT = "Simulation", "Workload (run)", "Output"
PD = "Prefill/decode disaggregation"
SLO = "SLOs and cost"
GW = "Gateway queue"
LOAD = "Closed-loop clients (run, replay)"
AUTOSCALE = "Autoscaling"


# ---------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Flag:
    name: str                       # "--max-num-running-reqs"
    parse: Callable[[str], Any]     # text -> value; ValueError = bad value
    path: str | None                # scenario key it overrides; None = read by the CLI
    rule: Rule | None = None
    help: str = ""
    commands: tuple[str, ...] = BOTH
    panel: str = SIM
    #: the values the help lists when the rule is checked elsewhere (--log: by setup_logging,
    #: after the scenario, where BLIS reports it)
    choices: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    @property
    def metavar(self) -> str:
        choices = self.choices or getattr(self.rule, "choices", None)
        if choices:                              # one_of(...): the values, as typer shows choices
            return f"<{'|'.join(choices)}>"
        if getattr(self.rule, "family", None):   # a registered name (the help lists them)
            return "NAME"
        return {integer: "INT", number: "FLOAT", numbers: "F,F,...", boolean: ""}.get(self.parse, "TEXT")

    @property
    def boolean(self) -> bool:
        """A Go bool flag: ``--name`` alone, or ``--name=true|false``."""
        return self.parse is boolean


F = Flag
FLAGS: tuple[Flag, ...] = (
    # (1) log level, model, backend name
    F("--log", text, None, None, "log level (default warn)", panel=OUTPUT, choices=LOG_LEVEL_NAMES),
    F("--model", lowered, "model", None, "model ID (lower-cased)"),
    F("--latency-model", text, "latency.model", registered("latency"), "latency backend (default physics; blackbox when both coefficient flags are given)"),
    # (2) coefficients
    F("--alpha-coeffs", numbers, "latency.alpha_coeffs", each_non_negative, "alpha0,alpha1,alpha2 (µs): queueing and output-token overheads"),
    F("--beta-coeffs", numbers, "latency.beta_coeffs", each_non_negative, "beta0,beta1,beta2 (µs): step time per step / prefill token / decode token"),
    # (3) deployment identity
    F("--hardware", text, "hardware", None, "GPU key (e.g. H100)"),
    F("--tp", integer, "tp", non_negative, "tensor parallelism, at most 256"),
    F("--dp", integer, "dp", positive, "data-parallel ranks per instance (default 1)"),
    F("--enable-expert-parallel", boolean, "enable_expert_parallel", None, "shard MoE experts over the TP x DP ranks (all-to-all dispatch/combine)"),
    F("--vllm-version", text, "vllm_version", None, "vLLM version (coefficient lookup)"),
    # (4) where architectures, GPUs and coefficients come from (built-in catalogs otherwise)
    F("--model-config-folder", text, "model_config_folder", None, "folder with a HuggingFace config.json for --model (default: the built-in model catalog; never downloaded)"),
    F("--hardware-config", text, "hardware_config", None, "BLIS hardware_config.json: GPUs added to the built-in catalog"),
    F("--defaults-filepath", text, "defaults_filepath", None, "BLIS defaults.yaml: its model defaults and coefficients override the built-in catalog (read in memory)"),
    F("--coefficients", text, "latency.coefficients", None, "coefficient-set file (YAML, as `blis-simpy fit` writes) for the latency backend; `default` = physics' physical set (default: physics uses the GPU's built-in set, else the physical one)"),
    F("--kv-cache-dtype", text, "engine.kv_cache_dtype", one_of("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"), "KV cache element type (default auto = the model dtype)"),
    F("--latency-compat", text, "latency.compat", one_of("fixed", "checkout"), "fixed (default) or checkout: BLIS 89bece82 parity for MoE latency (roofline expert weights at batch 0; MoE if experts > 0), docs/divergences.md #8, #9"),
    # (6) context cap and workload
    F("--max-model-len", integer, "engine.max_model_len", non_negative, "context cap in tokens, at most 16777216; 0 = unlimited (default 0)"),
    F("--workload-spec", text, None, None, "workload-spec v2 YAML (clients, cohorts, sessions, ...); wins over --workload and the distribution flags", (RUN,), WORKLOAD),
    F("--workload", text, None, None, "distribution (default) or a preset: chatbot, contentgen, summarization, multidoc", (RUN,), WORKLOAD),
    F("--num-requests", integer, "workload.num_requests", non_negative, "requests to generate, at most 10000000 (default 100)", (RUN,), WORKLOAD),
    F("--prefix-tokens", integer, "workload.prefix_tokens", non_negative, "shared prefix length, tokens, at most 16777216 (default 0)", (RUN,), WORKLOAD),
    F("--rate", number, "workload.rate", positive, "arrival rate, requests/s (default 1.0)", (RUN,), WORKLOAD),
    F("--arrival", text, "workload.arrival", one_of("constant", "poisson", "gamma"), "arrival process: constant (default, BLIS: gaps of 1/rate), poisson, gamma", (RUN,), WORKLOAD),
    F("--arrival-cv", number, "workload.arrival_cv", positive, "gamma: coefficient of variation of the gaps, 0.001 to 1000 (default 1.0)", (RUN,), WORKLOAD),
    F("--rate-schedule", text, "workload.rate_csv", None, "time-varying load: a CSV of time_s,rate rows (req/s from each time on; docs/workloads.md)", (RUN,), WORKLOAD),
    F("--prompt-tokens", integer, "workload.prompt_tokens.mean", None, "prompt length mean (default 512)", (RUN,), WORKLOAD),
    F("--prompt-tokens-stdev", integer, "workload.prompt_tokens.stdev", None, "prompt length stdev (default 256)", (RUN,), WORKLOAD),
    F("--prompt-tokens-min", integer, "workload.prompt_tokens.min", None, "prompt length min (default 2)", (RUN,), WORKLOAD),
    F("--prompt-tokens-max", integer, "workload.prompt_tokens.max", None, "prompt length max (default 7000)", (RUN,), WORKLOAD),
    F("--output-tokens", integer, "workload.output_tokens.mean", None, "output length mean (default 512)", (RUN,), WORKLOAD),
    F("--output-tokens-stdev", integer, "workload.output_tokens.stdev", None, "output length stdev (default 256)", (RUN,), WORKLOAD),
    F("--output-tokens-min", integer, "workload.output_tokens.min", None, "output length min (default 2)", (RUN,), WORKLOAD),
    F("--output-tokens-max", integer, "workload.output_tokens.max", None, "output length max (default 7000)", (RUN,), WORKLOAD),
    F("--trace-header", text, "workload.header", None, "TraceV2 YAML header", (REPLAY,), WORKLOAD.replace("run", "replay")),
    F("--trace-data", text, "workload.data", None, "TraceV2 CSV rows", (REPLAY,), WORKLOAD.replace("run", "replay")),
    # closed-loop clients, every workload source (docs/workloads.md, "Closed-loop clients")
    F("--concurrency", integer, "workload.concurrency", positive, "closed loop: N clients, each sending its next request when its previous one ended plus a think time, at most 1000000", panel=LOAD),
    F("--think-time-dist", text, "workload.think_time.dist", one_of("constant", "exponential", "lognormal"), "closed-loop think time distribution (default constant)", panel=LOAD),
    F("--think-time-ms", number, "workload.think_time.mean_ms", non_negative, "closed-loop mean think time, ms, at most 86400000 (default 0)", panel=LOAD),
    F("--think-time-sigma", number, "workload.think_time.sigma", positive, "lognormal think time: standard deviation of the log, at most 10 (default 1)", panel=LOAD),
    # (7) instances, KV, batch limits, horizon
    F("--num-instances", integer, "cluster.num_instances", at_least_one, "instances, at most 4096 (x --dp ranks) (default 1)"),
    F("--total-kv-blocks", integer, "engine.total_kv_blocks", positive, "GPU KV blocks per instance, at most 100000000 (default 1000000)"),
    F("--block-size-in-tokens", integer, "engine.block_size", positive, "tokens per KV block, at most 1024 (default 16)"),
    F("--max-num-running-reqs", integer, "engine.max_num_running_reqs", positive, "running-batch cap, at most 1048576 (default 256)"),
    F("--max-num-scheduled-tokens", integer, "engine.max_num_scheduled_tokens", positive, "per-step token budget, at most 16777216 (default 2048)"),
    F("--long-prefill-token-threshold", integer, "engine.long_prefill_token_threshold", non_negative, "prefill chunk cap, tokens, at most 16777216; 0 = off (default 0)"),
    F("--horizon", integer, "horizon_us", positive, "stop at this simulated time, µs (default unbounded; replay: 2 x last arrival)"),
    F("--seed", integer, "seed", None, "random seed (default 42)"),
    # (8) policy bundle, token bucket, policies, trace, snapshots, control-plane latencies
    F("--policy-config", text, None, None, "policy bundle YAML as BLIS reads it (admission, routing, priority, scheduler); given flags win over it"),
    F("--token-bucket-capacity", number, None, None, "token-bucket size, tokens; finite > 0 (default 10000)"),
    F("--token-bucket-refill-rate", number, None, None, "token-bucket refill, tokens/s; finite > 0 (default 1000)"),
    F("--tier-shed-threshold", integer, None, non_negative, "tier-shed: highest max effective load that still admits every class (default 0)"),
    F("--tier-shed-min-priority", integer, None, priority_range, "tier-shed: lowest class priority admitted under overload, 0-4 (default 3)"),
    F("--admission-policy", text, "cluster.admission.policy", registered("admission"), "admission policy (default always-admit)"),
    F("--routing-policy", text, "cluster.routing.policy", registered("routing"), "routing policy (default round-robin)"),
    F("--priority-policy", text, "engine.priority_policy", registered("priority"), "priority policy (default constant)"),
    F("--scheduler", text, "engine.scheduler", registered("scheduler"), "wait-queue scheduler (default fcfs)"),
    F("--trace-level", text, "trace.level", trace_level, "decision trace (default none)"),
    F("--counterfactual-k", integer, "trace.counterfactual_k", non_negative, "counterfactual candidates per routing record, at most 4096 (default 0)"),
    F("--summarize-trace", boolean, "trace.summarize", None, "print the Trace Summary (implies --trace-level decisions)", panel=OUTPUT),
    F("--snapshot-refresh-interval", integer, "cluster.snapshot_refresh_interval_us", non_negative, "router snapshot refresh, µs, at most 3600000000 (1 h); 0 = always fresh (default 0)"),
    F("--admission-latency", integer, "cluster.admission_latency_us", non_negative, "admission delay, µs, at most 3600000000 (1 h) (default 0)"),
    F("--routing-latency", integer, "cluster.routing_latency_us", non_negative, "routing delay, µs, at most 3600000000 (1 h) (default 0)"),
    F("--routing-scorers", scorer_text, None, None, "weighted scorers 'name:weight,...' (default prefix-affinity:3,queue-depth:2,kv-utilization:2)"),
    F("--routing-tie-break", text, None, tie_break, "routing ties: random (seeded, default) or first (lowest index, BLIS parity)"),
    F("--fitness-weights", fitness_text, "fitness_weights", None, "fitness evaluation 'key:weight,...' (replay: ignored)", panel=OUTPUT),
    # (8, cont.) tiered KV and GPU memory
    F("--kv-cpu-blocks", integer, "engine.kv_cpu_blocks", non_negative, "CPU KV tier blocks, at most 100000000; > 0 enables the tier (default 0)"),
    F("--kv-offload-threshold", number, "engine.kv_offload_threshold", unit_interval, "deprecated and ignored (a warning when given and the CPU tier is on)"),
    F("--kv-transfer-bandwidth", number, "engine.kv_transfer_bandwidth", positive, "CPU->GPU reload bandwidth, blocks/µs, 1e-6 to 1e6 (default 100)"),
    F("--kv-transfer-base-latency", integer, "engine.kv_transfer_base_latency_us", non_negative, "fixed cost per block reloaded CPU->GPU, µs, at most 3600000000 (1 h) (default 0)"),
    F("--kv-cpu-gib", number, "engine.kv_cpu_gib", non_negative, "CPU KV offload tier as vLLM's OffloadingConnector (--kv-offloading-size), GiB per engine, at most 65536; > 0 enables it, exclusive with --kv-cpu-blocks (default 0)"),
    F("--gpu-memory-utilization", number, "engine.gpu_memory_utilization", fraction, "fraction of GPU memory for vLLM, used by KV auto-sizing (default 0.9)"),
    F("--kv-capacity-model", text, "engine.kv_capacity_model", one_of("vllm", "blis"), "KV auto-sizing: vllm (default; per GPU, as vLLM profiles it) or blis (BLIS's formula, parity)"),
    F("--step-model", text, "engine.step_model", one_of("vllm", "blis"), "a step whose requests all finish: vllm (default; it holds the instance until it ends) or blis (the instance is idle from the step's start, so steps may overlap; parity)"),
    F("--async-scheduling", boolean, "engine.async_scheduling", None, "vLLM's async scheduling (default true): a request queued during a step is admitted one step later; --async-scheduling=false for BLIS parity"),
    F("--preemption-model", text, "engine.preemption_model", one_of("vllm", "blis"), "recompute preemption: vllm (default; prompt + outputs so far recomputed as a prefill, as vLLM v1) or blis (outputs regenerated, TTFT overwritten; parity)"),
    # (8, cont.) prefill/decode disaggregation (docs/disaggregation.md); the cross-flag rule is _pd_rule
    F("--prefill-instances", integer, "disaggregation.prefill_instances", non_negative, "prefill pool size: instance_0 … instance_{P-1}; both pool sizes 0 = no PD (default 0)", panel=PD),
    F("--decode-instances", integer, "disaggregation.decode_instances", non_negative, "decode pool size: the next D instances; P + D <= --num-instances (default 0)", panel=PD),
    F("--pd-decider", decider_text, "disaggregation.decider.policy", decider_rule, "which requests are disaggregated (default never)", panel=PD),
    F("--pd-prefix-threshold", integer, None, non_negative, "prefix-threshold: disaggregate when the uncached prompt tokens exceed this (default 512)", panel=PD),
    F("--pd-direct-decode-threshold", integer, None, non_negative, "direct-to-decode: disaggregate prompts of at least this many tokens (default 256)", panel=PD),
    F("--pd-transfer-bandwidth", number, "disaggregation.transfer.bandwidth_gbps", positive, "KV-transfer bandwidth shared by all transfers, GB/s, 0.001 to 1e6 (default 25)", panel=PD),
    F("--pd-transfer-base-latency", number, "disaggregation.transfer.base_latency_ms", non_negative, "fixed cost per KV transfer, ms, at most 3600000 (1 h) (default 0.05)", panel=PD),
    F("--pd-kv-bytes-per-token", integer, "disaggregation.transfer.kv_bytes_per_token", positive, "KV bytes per prompt token, all TP ranks, at most 2^30 (default: from the model shape; --pd-compat checkout: 512)", panel=PD),
    F("--pd-transfer-contention", boolean, None, None, "BLIS's switch: concurrent transfers share the bandwidth (fair-share; with --pd-compat checkout: snapshot)", panel=PD),
    F("--pd-contention-mode", text, "disaggregation.transfer.contention", one_of("none", "snapshot", "fair-share"), "none | snapshot (share fixed at start, BLIS) | fair-share (processor sharing) (default fair-share; --pd-compat checkout: none)", panel=PD),
    F("--prefill-routing-scorers", scorer_text, None, None, "the prefill pool's own weighted router 'name:weight,...' (default: the main policy)", panel=PD),
    F("--decode-routing-scorers", scorer_text, None, None, "the decode pool's own weighted router 'name:weight,...' (default: the main policy)", panel=PD),
    F("--prefill-tp", integer, "disaggregation.prefill_pool.tp", positive, "prefill pool tensor parallelism (default --tp)", panel=PD),
    F("--decode-tp", integer, "disaggregation.decode_pool.tp", positive, "decode pool tensor parallelism (default --tp)", panel=PD),
    F("--prefill-hardware", text, "disaggregation.prefill_pool.hardware", None, "prefill pool GPU; its calibration times the pool (default --hardware)", panel=PD),
    F("--decode-hardware", text, "disaggregation.decode_pool.hardware", None, "decode pool GPU; its calibration times the pool (default --hardware)", panel=PD),
    F("--prefill-latency-model", text, "disaggregation.prefill_pool.latency_model", registered("latency"), "prefill pool latency backend (default --latency-model)", panel=PD),
    F("--decode-latency-model", text, "disaggregation.decode_pool.latency_model", registered("latency"), "decode pool latency backend (default --latency-model)", panel=PD),
    F("--prefill-max-model-len", integer, "disaggregation.prefill_pool.max_model_len", positive, "prefill pool context cap (default: global, lowered to the pool's KV capacity)", panel=PD),
    F("--decode-max-model-len", integer, "disaggregation.decode_pool.max_model_len", positive, "decode pool context cap (default: global, lowered to the pool's KV capacity)", panel=PD),
    F("--pd-interference-prefill", number, "disaggregation.interference.prefill", interference_range, "slowdown factor of mixed batches that are mostly prefill, [0, 100] (default 0)", panel=PD),
    F("--pd-interference-decode", number, "disaggregation.interference.decode", interference_range, "slowdown factor of mixed batches that are mostly decode, [0, 100] (default 0)", panel=PD),
    F("--pd-compat", text, "disaggregation.compat", one_of("fixed", "checkout"), "fixed (default) or checkout: the Go checkout's PD behaviour (parity mode, docs/cli.md)", panel=PD),
    # gateway queue with flow control (docs/control-plane.md, "Gateway queue"); any of these
    # puts a gateway queue in front of the router (cluster.gateway)
    F("--gateway-policy", text, "cluster.gateway.policy", registered("gateway"), "gateway queue policy (default standard)", panel=GW),
    F("--gateway-queue-depth", integer, "cluster.gateway.max_depth", non_negative, "gateway queue: requests queued at most, at most 10000000; 0 = unlimited (default 0; BLIS --max-gateway-queue-depth)", panel=GW),
    F("--gateway-order", text, "cluster.gateway.order", one_of("fifo", "priority", "slo-deadline"), "gateway queue order: fifo (default), priority (SLO band), slo-deadline (arrival + the class's TTFT target) (BLIS --dispatch-order)", panel=GW),
    F("--gateway-shed", text, "cluster.gateway.shed", one_of("arriving", "lowest"), "when the gateway queue is full: shed the arriving request (default) or the lowest-ranked queued sheddable one (BLIS --queue-shedding)", panel=GW),
    F("--gateway-band-queue-limit", integer, "cluster.gateway.band_queue_limit", non_negative, "gateway queue: requests queued per priority band at most; 0 = unlimited (default 0; BLIS --per-band-capacity)", panel=GW),
    F("--gateway-band-inflight-limit", integer, "cluster.gateway.band_inflight_limit", non_negative, "gateway queue: requests per priority band sent on and not finished, at most; 0 = unlimited (default 0)", panel=GW),
    F("--gateway-detector", text, "cluster.gateway.detector", one_of("never", "concurrency", "utilization"), "when the cluster has room for a queued request (default never; BLIS --saturation-detector)", panel=GW),
    F("--gateway-max-concurrency", integer, "cluster.gateway.max_concurrency", positive, "concurrency detector: in-flight requests per instance (default 100; BLIS --max-concurrency)", panel=GW),
    F("--gateway-queue-depth-threshold", number, "cluster.gateway.queue_depth_threshold", positive, "utilization detector: wait-queue length of a full instance (default 5; BLIS --queue-depth-threshold)", panel=GW),
    F("--gateway-kv-util-threshold", number, "cluster.gateway.kv_util_threshold", positive, "utilization detector: KV utilisation of a full instance (default 0.8; BLIS --kv-cache-util-threshold)", panel=GW),
    F("--gateway-dispatch-tick", integer, "cluster.gateway.dispatch_tick_us", positive, "utilization detector: re-check every this many µs while requests wait, at most 3600000000 (default 1000; BLIS --dispatch-tick-interval)", panel=GW),
    F("--gateway-fair-key", text, "cluster.gateway.fair_share.key", one_of("tenant", "slo_class"), "gateway fair share between tenants (default) or SLO classes", panel=GW),
    F("--gateway-fair-share", weights_text, "cluster.gateway.fair_share.weights", None, "gateway weighted fair share 'flow:weight,...' (weights > 0; other flows weigh 1)", panel=GW),
    # autoscaling (docs/control-plane.md, "Autoscaling"); any of them turns the autoscaler on
    F("--autoscaler", text, "cluster.autoscaler.policy", registered("autoscaling"), "autoscaling policy (default: none, a fixed deployment; its params from the scenario)", panel=AUTOSCALE),
    F("--autoscaler-interval", number, "cluster.autoscaler.interval_s", positive, "seconds between autoscaling decisions, 0.001 to 86400 (default 15)", panel=AUTOSCALE),
    F("--min-instances", integer, "cluster.autoscaler.min_instances", at_least_one, "fewest instances the autoscaler keeps (default 1)", panel=AUTOSCALE),
    F("--max-instances", integer, "cluster.autoscaler.max_instances", at_least_one, "most instances the autoscaler starts, at most 4096 (default 1)", panel=AUTOSCALE),
    F("--initial-instances", integer, "cluster.autoscaler.initial_instances", at_least_one, "instances serving at time 0 (default --num-instances within [min, max])", panel=AUTOSCALE),
    F("--prefill-min-instances", integer, "cluster.autoscaler.pools.prefill.min_instances", at_least_one, "prefill pool under the autoscaler: fewest instances (default 1)", panel=AUTOSCALE),
    F("--prefill-max-instances", integer, "cluster.autoscaler.pools.prefill.max_instances", at_least_one, "prefill pool under the autoscaler: most instances, at most 4096 (default 1)", panel=AUTOSCALE),
    F("--prefill-initial-instances", integer, "cluster.autoscaler.pools.prefill.initial_instances", at_least_one, "prefill pool under the autoscaler: instances serving at time 0 (default --prefill-instances within [min, max])", panel=AUTOSCALE),
    F("--decode-min-instances", integer, "cluster.autoscaler.pools.decode.min_instances", at_least_one, "decode pool under the autoscaler: fewest instances (default 1)", panel=AUTOSCALE),
    F("--decode-max-instances", integer, "cluster.autoscaler.pools.decode.max_instances", at_least_one, "decode pool under the autoscaler: most instances, at most 4096 (default 1)", panel=AUTOSCALE),
    F("--decode-initial-instances", integer, "cluster.autoscaler.pools.decode.initial_instances", at_least_one, "decode pool under the autoscaler: instances serving at time 0 (default --decode-instances within [min, max])", panel=AUTOSCALE),
    F("--load-bandwidth", number, "cluster.autoscaler.load_bandwidth_gbps", positive, "GB/s at which a new instance loads the model's weights, 0.001 to 1e6 (default 2)", panel=AUTOSCALE),
    F("--instance-startup", number, "cluster.autoscaler.startup_s", non_negative, "fixed start-up of a new instance before its weights load, s, at most 3600 (default 0)", panel=AUTOSCALE),
    # SLOs and cost (docs/metrics.md, "SLOs and goodput", "Deployment and cost")
    F("--slo-ttft", number, "slo.ttft_ms", positive, "TTFT target, ms: attainment and goodput in the results", panel=SLO),
    F("--slo-itl", number, "slo.itl_ms", positive, "mean inter-token latency target per request, ms", panel=SLO),
    F("--slo-e2e", number, "slo.e2e_ms", positive, "end-to-end latency target, ms", panel=SLO),
    F("--gpu-hour-cost", number, "cost.gpu_hour_usd", positive, "USD per GPU-hour: cost per hour and per 1M output tokens (default: the GPU catalog's price, if any)", panel=SLO),
    # outputs
    F("--results-path", out_path, None, None, "write results JSON here (run: metrics + per-request rows; replay: SimResult array)", panel=OUTPUT),
    F("--trace-output", out_path, None, None, "export the workload as PREFIX.yaml + PREFIX.csv (TraceV2)", (RUN,), OUTPUT),
    F("--trace-output-decisions", out_path, None, None, "write the decision trace to FILE as JSON Lines, one record per line (implies --trace-level decisions)", panel=OUTPUT),
    F("--streaming-metrics", boolean, "metrics.streaming", None, "very long runs: percentiles from DDSketch sketches (relative accuracy 0.01), requests dropped as they complete", panel=OUTPUT),
    F("--measured-at", text, "metrics.measured_at", one_of("server", "client"), "where latencies are taken: server (default; from when the engine gets each request to when it emits each token) or client (from the client's send to when the front end delivers each token; the same without a front end, docs/frontend.md)", panel=OUTPUT),
    F("--requests-out", out_path, None, None, "write one row per request to PATH (.jsonl or .parquet), streamed as requests complete under --streaming-metrics", panel=OUTPUT),
    F("--timeline", out_path, "output.timeline", None, "write a per-instance timeline to PATH (.csv or .parquet): running, waiting, KV blocks, preemptions, engine steps, PD transfers in flight (docs/planning.md, Reports)", panel=OUTPUT),
    F("--timeline-interval-ms", number, "output.timeline_interval_ms", positive, "simulated time between --timeline samples, ms, 1 to 86400000 (default 100)", panel=OUTPUT),
)
BY_NAME = {f.name: f for f in FLAGS}
BY_PATH = {f.path: f for f in FLAGS if f.path}
DIST_FLAGS = tuple(f.name for f in FLAGS if f.path and f.path.startswith("workload.") and RUN in f.commands
                   and f.panel != LOAD)


def flags_for(command: str) -> list[Flag]:
    return [f for f in FLAGS if command in f.commands]


def flag_for_path(path: str) -> Flag | None:
    """The flag whose key is ``path`` or an ancestor of it (``latency.alpha_coeffs[1]``)."""
    while path:
        if path in BY_PATH:
            return BY_PATH[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None
