"""What ``blis-simpy fit`` may change, per backend: a few physical coefficients with bounds.

A :class:`Space` maps a parameter vector ``x`` to a coefficient set
(:mod:`blis_simpy.latency.coefficient_sets`) and to a resolved deployment that uses it.

* ``physics`` — six numbers per GPU or shared across GPUs, never per model:
  ``compute`` (the achieved fraction of peak tensor throughput, as its inverse: every
  compute basis — prefill, decode, attention, MoE — is multiplied by it; ≥ 1, a GPU cannot
  beat its sustained rate), ``memory`` (the same for the streamed weights — dense and MoE
  experts), ``kv_memory`` (the same for the paged KV cache attention reads and writes, whose
  scattered blocks stream less well than weights) — both bounded below so the implied
  bandwidth never exceeds the datasheet peak —
  ``step_cpu_us`` (µs per step: scheduler, launch, sync) and ``request_cpu_us`` (µs per
  scheduled request per step: input preparation, sampling bookkeeping, output processing)
  and ``collectives`` (the TP all-reduce and the EP dispatch/combine multiplier: how the
  GPU's collectives compare with the ring formula at the catalog's link rate and latency;
  runs without TP or EP leave it where it starts). The per-layer launch cost and sampling
  multipliers keep the base set's values: they carry to other models unchanged.
* ``trained-physics`` — BLIS HEAD's β1a (prefill compute), β3 (weight reads), β2b (decode
  KV reads), β6 (µs per request) and β7 (µs per step); the others stay at the base values.
* ``blackbox`` — β0 (µs per step), β1 (µs per prefill token), β2 (µs per decode token);
  alpha (API overheads) stays as resolved.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.backends import backend_options, build_backend
from blis_simpy.deploy.resolve import Deployment, resolve
from blis_simpy.errors import ConfigError
from blis_simpy.latency import physics_terms as P
from blis_simpy.latency.coefficient_sets import AlphaBetaSet, CoefficientSet, PhysicsCoefficients

COMPUTE_BASES = ("prefill_compute", "decode_compute", "attention_compute", "moe_compute")
MEMORY_BASES = ("weight_reads", "moe_expert_reads")          # streamed weights: the GEMMs
KV_BASES = ("prefill_memory", "decode_kv_reads")              # paged KV: attention
FITTABLE = ("physics", "trained-physics", "blackbox")


@dataclass(frozen=True)
class Param:
    """One fitted coefficient: its name, bounds, start value and typical scale."""

    name: str
    lo: float
    hi: float
    x0: float
    scale: float
    unit: str = ""


class Space:
    """The parameters of one backend and how they become a coefficient set."""

    backend = ""

    def __init__(self, scenario: Scenario, dep: Deployment):
        self.scenario = scenario
        self.dep = dep
        self.params: list[Param] = []

    def to_set(self, x) -> CoefficientSet:
        raise NotImplementedError

    def deployment(self, scenario: Scenario, cs: CoefficientSet) -> Deployment:
        """``scenario`` resolved with the set ``cs`` in place of its coefficients."""
        raise NotImplementedError

    def x0(self) -> list[float]:
        return [min(max(p.x0, p.lo), p.hi) for p in self.params]


class PhysicsSpace(Space):
    backend = "physics"

    def __init__(self, scenario: Scenario, dep: Deployment):
        super().__init__(scenario, dep)
        lat = dep.new_latency_model()
        self.base: PhysicsCoefficients = lat.coeffs
        gpu = dep.gpu
        rates = P.gpu_rates(gpu, lat.shape.weight_bytes)
        mem_lo = rates.hbm_bytes_per_us / (gpu.bw_peak_tbs * 1e6)    # ≤ 1: no faster than the datasheet
        b = self.base
        self.params = [
            Param("compute", 1.0, 20.0, max(1.0, b.prefill_compute), 0.3),
            Param("memory", round(mem_lo, 6), 20.0, max(mem_lo, b.weight_reads), 0.1),
            Param("kv_memory", round(mem_lo, 6), 20.0, max(mem_lo, b.decode_kv_reads), 0.1),
            Param("step_cpu_us", 0.0, 50_000.0, b.step_cpu_us, 200.0, "µs"),
            Param("request_cpu_us", 0.0, 2_000.0, b.request_cpu_us, 20.0, "µs"),
            Param("collectives", 0.1, 10.0, b.tp_allreduce, 0.1),
        ]

    def to_set(self, x) -> PhysicsCoefficients:
        compute, memory, kv, step, req, coll = (float(v) for v in x)
        upd = ({k: compute for k in COMPUTE_BASES} | {k: memory for k in MEMORY_BASES}
               | {k: kv for k in KV_BASES})
        upd |= {"step_cpu_us": step, "request_cpu_us": req, "tp_allreduce": coll,
                "ep_dispatch_combine": coll, "backend": "physics", "fit": None}
        return self.base.model_copy(update=upd)

    def deployment(self, scenario: Scenario, cs: CoefficientSet) -> Deployment:
        dep = resolve(scenario, quiet=True) if scenario is not self.scenario else self.dep
        opts = {**backend_options(scenario), "coefficients": cs}
        return replace(dep, latency_factory=partial(build_backend, "physics", dep.model_config, dep.gpu,
                                                    dep.tp, None, None, "fixed", opts))


class _AlphaBetaSpace(Space):
    #: (name, beta index, lo, hi, scale, unit)
    BETAS: tuple = ()

    def __init__(self, scenario: Scenario, dep: Deployment):
        super().__init__(scenario, dep)
        lat = dep.new_latency_model()
        self.alpha = list(getattr(lat, "alpha", None) or dep.alpha or [0.0, 0.0, 0.0])
        self.beta = list(getattr(lat, "beta", None) or dep.beta or [])
        need = max(i for _, i, *_ in self.BETAS) + 1
        self.beta += [0.0] * (need - len(self.beta))
        self.params = [Param(n, lo, hi, self.beta[i], sc, u) for n, i, lo, hi, sc, u in self.BETAS]

    def to_set(self, x) -> AlphaBetaSet:
        beta = list(self.beta)
        for (_, i, *_), v in zip(self.BETAS, x, strict=True):
            beta[i] = float(v)
        return AlphaBetaSet(backend=self.backend, alpha_coeffs=self.alpha, beta_coeffs=beta)

    def deployment(self, scenario: Scenario, cs: CoefficientSet) -> Deployment:
        lat = scenario.latency.model_copy(update={"alpha_coeffs": list(cs.alpha_coeffs),
                                                  "beta_coeffs": list(cs.beta_coeffs),
                                                  "coefficients": ""})
        return resolve(scenario.model_copy(update={"latency": lat}), quiet=True)


class TrainedPhysicsSpace(_AlphaBetaSpace):
    backend = "trained-physics"
    BETAS = (("beta1a_prefill_compute", 0, 0.0, 50.0, 0.1, ""),
             ("beta3_weight_reads", 2, 0.0, 50.0, 0.2, ""),
             ("beta2b_decode_kv", 9, 0.0, 50.0, 0.2, ""),
             ("beta6_request_us", 5, 0.0, 2_000.0, 5.0, "µs"),
             ("beta7_step_us", 6, 0.0, 50_000.0, 100.0, "µs"))


class BlackboxSpace(_AlphaBetaSpace):
    backend = "blackbox"
    BETAS = (("beta0_step_us", 0, 0.0, 1e6, 1000.0, "µs"),
             ("beta1_prefill_token_us", 1, 0.0, 1e4, 0.5, "µs"),
             ("beta2_decode_token_us", 2, 0.0, 1e5, 10.0, "µs"))

    def __init__(self, scenario: Scenario, dep: Deployment):
        super().__init__(scenario, dep)
        if not any(self.beta[:3]):
            self.params = [replace(p, x0=v) for p, v in zip(self.params, (5000.0, 0.5, 50.0), strict=True)]


SPACES = {"physics": PhysicsSpace, "trained-physics": TrainedPhysicsSpace, "blackbox": BlackboxSpace}


def space_for(scenario: Scenario) -> Space:
    """The parameter space of the scenario's backend (ConfigError for others)."""
    backend = scenario.latency.model or "physics"
    cls = SPACES.get(backend)
    if cls is None:
        raise ConfigError(f"fit supports {', '.join(FITTABLE)}, not {backend}", field="--latency-model")
    if backend == "blackbox" and scenario.latency.alpha_coeffs is None:
        # a model with no catalog row still fits: start from zeros, not an error
        lat = scenario.latency.model_copy(update={"alpha_coeffs": [0.0, 0.0, 0.0],
                                                  "beta_coeffs": scenario.latency.beta_coeffs or [1.0, 0.0, 0.0]})
        try:
            dep = resolve(scenario, quiet=True)
        except ConfigError:
            scenario = scenario.model_copy(update={"latency": lat})
            dep = resolve(scenario, quiet=True)
        return cls(scenario, dep)
    return cls(scenario, resolve(scenario, quiet=True))
