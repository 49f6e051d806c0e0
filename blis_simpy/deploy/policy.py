"""BLIS's policy bundle (``--policy-config FILE``; docs/control-plane.md, "The policy bundle")
and the control-plane flags.

The bundle is strict YAML — unknown keys, wrong types, negative or non-finite numbers,
unknown policy or scorer names are ``FILE:LINE: field: problem`` errors. Every key is
optional::

    admission:
      policy: token-bucket            # always-admit | token-bucket | reject-all | tier-shed
      token_bucket_capacity: 10000.0  # finite, >= 0
      token_bucket_refill_rate: 1000.0
      tier_shed_threshold: 0          # ours (docs/divergences.md #12): int >= 0
      tier_shed_min_priority: 3       # ours: 0..4
    routing:
      policy: weighted                # round-robin | least-loaded | weighted | always-busiest
      scorers: [{name: queue-depth, weight: 2.0}, {name: kv-utilization, weight: 2.0}]
      tie_break: first                # ours: random | first
    priority:
      policy: constant                # constant | slo-based | inverted-slo
    scheduler: fcfs                   # fcfs | priority-fcfs | sjf | reverse-priority

:func:`apply_policy_settings` merges the bundle, the control-plane flags and the scenario
file into the scenario's ``cluster.admission``, ``cluster.routing``, ``engine.scheduler``
and ``engine.priority_policy`` with BLIS's precedence: an explicitly given flag wins;
otherwise a non-empty bundle value; otherwise the scenario file's value; otherwise the
default. A policy parameter flag (``--token-bucket-capacity`` → ``capacity``,
``--tier-shed-*`` → ``threshold`` / ``min_priority``, ``--routing-scorers`` → ``scorers``,
``--routing-tie-break`` → ``tie_break``) fills the parameter of that name when the chosen
policy declares it in its ``Params`` (built-in or plugin); otherwise it has no effect (a
warning says so). Scenario-file parameters are kept only when the policy name is unchanged.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from blis_simpy.admission import AdmissionPolicy
from blis_simpy.config.loader import error_loc, read_mapping, set_dotted, validation_problem
from blis_simpy.engine.scheduling import PriorityPolicy, Scheduler
from blis_simpy.errors import ConfigError
from blis_simpy.routing import Router
from blis_simpy.routing.scorers import check_scorer

log = logging.getLogger("blis_simpy.config")

NonNegFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    # strict, as the scenario's models: a quoted number ("10") is a string, not a number
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)   # built on first use


class BundleAdmission(_Strict):
    policy: StrictStr = ""
    token_bucket_capacity: NonNegFinite | None = None
    token_bucket_refill_rate: NonNegFinite | None = None
    tier_shed_threshold: Annotated[int, Field(ge=0, strict=True)] | None = None
    tier_shed_min_priority: Annotated[int, Field(ge=0, le=4, strict=True)] | None = None


class BundleScorer(_Strict):
    name: StrictStr
    weight: float = Field(allow_inf_nan=True)


class BundleRouting(_Strict):
    policy: StrictStr = ""
    scorers: list[BundleScorer] = Field(default_factory=list)
    tie_break: Literal["random", "first"] | None = None


class BundlePriority(_Strict):
    policy: StrictStr = ""


class PolicyBundle(_Strict):
    """The parsed ``--policy-config`` file."""

    admission: BundleAdmission = Field(default_factory=BundleAdmission)
    routing: BundleRouting = Field(default_factory=BundleRouting)
    priority: BundlePriority = Field(default_factory=BundlePriority)
    scheduler: StrictStr = ""


def load_policy_bundle(path: str):
    """Read and validate a bundle. Returns ``(PolicyBundle, Source)``."""

    data, src = read_mapping(path, "a policy bundle")
    try:
        bundle = PolicyBundle.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise src.error(validation_problem(first, PolicyBundle), error_loc(data, first)) from None
    fam = policy_families()
    for loc, family, name in ((("admission", "policy"), "admission", bundle.admission.policy),
                              (("routing", "policy"), "routing", bundle.routing.policy),
                              (("priority", "policy"), "priority", bundle.priority.policy),
                              (("scheduler",), "scheduler", bundle.scheduler)):
        if name:
            try:
                fam[family].lookup(name)
            except ConfigError as exc:
                raise src.error(exc.problem, loc) from None
    seen: set[str] = set()
    for i, sc in enumerate(bundle.routing.scorers):
        try:
            check_scorer(sc.name, sc.weight, seen)
        except ValueError as exc:
            raise src.error(str(exc), ("routing", "scorers", i)) from None
    return bundle, src


def policy_families() -> dict[str, type]:
    """The policy registries (importing the packages registers the built-ins)."""
    return {"admission": AdmissionPolicy, "routing": Router, "scheduler": Scheduler,
            "priority": PriorityPolicy}


# ---------------------------------------------------------------------------- merging
#: (flag, bundle key, parameter name) per section
ADMISSION_PARAMS = (
    ("--token-bucket-capacity", "token_bucket_capacity", "capacity"),
    ("--token-bucket-refill-rate", "token_bucket_refill_rate", "refill_rate"),
    ("--tier-shed-threshold", "tier_shed_threshold", "threshold"),
    ("--tier-shed-min-priority", "tier_shed_min_priority", "min_priority"),
)
ROUTING_PARAMS = (
    ("--routing-scorers", "scorers", "scorers"),
    ("--routing-tie-break", "tie_break", "tie_break"),
)
_DEFAULT_POLICY = {"admission": "always-admit", "routing": "round-robin"}


def _bundle_value(section, key: str):
    v = getattr(section, key)
    if key == "scorers":
        return [{"name": s.name, "weight": s.weight} for s in v] if v else None
    return v


def apply_policy_settings(ov, data: dict, presets=None) -> None:
    """The cross-flag rule of the control plane (runs after the policy flag rows).

    ``ov`` holds the parsed given flags (``ov.values``) and collects where scenario keys
    came from (``ov.origin``); ``data`` is the raw scenario dict, edited in place.
    """
    vals = ov.values
    bundle = src = None
    if vals.get("--policy-config"):
        try:
            bundle, src = load_policy_bundle(vals["--policy-config"])
        except ConfigError as exc:
            if exc.line is None and exc.field is None:   # unreadable file: name the flag too
                raise ConfigError(exc.problem, file=exc.file, field="--policy-config") from None
            raise
        log.info("policy bundle %s", vals["--policy-config"])
    if bundle is not None:
        for flag, path, value in (
                ("--priority-policy", "engine.priority_policy", bundle.priority.policy),
                ("--scheduler", "engine.scheduler", bundle.scheduler)):
            if value and flag not in vals and set_dotted(data, path, value):
                ov.origin[path] = "--policy-config"
    fam = policy_families()
    for section, specs in (("admission", ADMISSION_PARAMS), ("routing", ROUTING_PARAMS)):
        _merge_section(ov, data, fam[section], section, specs,
                       getattr(bundle, section) if bundle is not None else None, src)


def _merge_section(ov, data, family, section: str, specs, bsec, src) -> None:
    vals = ov.values
    cluster = data.setdefault("cluster", {})
    if not isinstance(cluster, dict):
        return
    cfg = cluster.get(section)
    if cfg is None:
        cfg = cluster[section] = {}
    if not isinstance(cfg, dict):
        return
    flag_name = f"--{section}-policy"
    scen_policy = cfg.get("policy", _DEFAULT_POLICY[section])
    if flag_name in vals:
        policy = vals[flag_name]
    elif bsec is not None and bsec.policy:
        policy = bsec.policy
        ov.origin[f"cluster.{section}.policy"] = "--policy-config"
    else:
        policy = scen_policy
    try:
        cls = family.lookup(policy)
    except (ConfigError, TypeError):
        return  # an unknown name is reported by validation, located where it was written
    params = cfg.get("params", {})
    if policy != scen_policy:
        params = {}
    elif not isinstance(params, dict):
        return  # not a mapping: validation reports it, located where it was written
    params = dict(params)
    fields = cls.Params.model_fields
    from_bundle: dict[str, tuple] = {}
    from_flag: dict[str, str] = {}
    for flag, bkey, pname in specs:
        given = vals.get(flag)
        if flag == "--routing-scorers" and not given:
            given = None      # "" means "not given" (BLIS: an empty flag value)
        if pname not in fields:
            if given is not None:
                log.warning("%s has no effect with %s policy %r", flag, section, policy)
            continue
        if given is not None:
            params[pname] = given
            from_flag[pname] = flag
            ov.origin[f"cluster.{section}.params.{pname}"] = flag
        elif bsec is not None and _bundle_value(bsec, bkey) is not None:
            params[pname] = _bundle_value(bsec, bkey)
            from_bundle[pname] = (section, bkey)
            ov.origin[f"cluster.{section}.params.{pname}"] = "--policy-config"
    cfg["policy"] = policy
    cfg["params"] = params
    if not from_flag and not from_bundle:
        return  # scenario parameters are validated later, located in the scenario file
    try:
        cls.parse_params(params)
    except ConfigError as exc:
        name = (exc.field or "").split(".")[0]
        problem = exc.problem.removeprefix("Value error, ")
        if name in from_flag:
            raise ConfigError(problem, field=from_flag[name]) from None
        if name in from_bundle and src is not None:
            raise src.error(f"{problem} (with {section} policy {policy})", from_bundle[name]) from None
        raise
