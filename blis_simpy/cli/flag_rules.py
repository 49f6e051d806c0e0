"""How the given flags override a scenario, and the cross-flag rules (docs/cli.md).

"Given" matters: every option defaults to ``None`` and only flags the user passed override
the scenario. :func:`apply_flags` checks them in the table's order
(:data:`blis_simpy.cli.flags.FLAGS`); a few cross-flag rules (coefficient pairing, workload
source, trace pairing, the PD flags) are :data:`AFTER` and run right after the row they
follow, so the first error is the one BLIS reports first. Flag problems are
:class:`ConfigError` with ``field="--flag-name"``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blis_simpy.cli.flags import BY_NAME, DIST_FLAGS, Flag, flags_for
from blis_simpy.config.loader import mapping_at
from blis_simpy.config.scenario import DistributionWorkload
from blis_simpy.deploy import policy as P
from blis_simpy.errors import ConfigError

log = logging.getLogger("blis_simpy.cli")


@dataclass
class Overrides:
    """What the given flags did: parsed values and the scenario keys they set."""

    values: dict[str, Any] = field(default_factory=dict)   # flag name -> parsed value
    origin: dict[str, str] = field(default_factory=dict)   # scenario path -> flag name


def _set(data: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    cur = data
    for p in parents:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = cur[p] = {}
        cur = nxt
    cur[last] = value


def parse_flag(f: Flag, text: str):
    """Parse one given flag and check its rule; problems name the flag."""
    try:
        v = f.parse(text)
    except ValueError as exc:
        raise ConfigError(str(exc), field=f.name) from None
    problem = f.rule(v) if f.rule else None
    if problem:
        raise ConfigError(problem, field=f.name)
    return v


def apply_flags(data: dict, given: dict[str, str], command: str, *,
                presets: Callable[[str], dict] | None = None) -> Overrides:
    """Override ``data`` (a raw scenario dict, edited in place) with the given flags.

    Flags are checked in table order; each cross-flag rule of :data:`AFTER` runs right after
    its row, so the first error is the one BLIS's processing order reports first.
    """
    ov = Overrides()
    for f in flags_for(command):
        if f.name in given:
            ov.values[f.name] = parse_flag(f, given[f.name])
        rule = AFTER.get(f.name)
        if rule is not None:
            rule(ov, data, presets)
    for name, v in ov.values.items():
        f = BY_NAME[name]
        if f.path:
            _set(data, f.path, v)
            ov.origin[f.path] = name
    return ov


def _coefficient_rule(ov: Overrides, data: dict, presets) -> None:
    """Coefficients come in pairs (docs/latency-models.md); both without --latency-model ⇒ blackbox.

    One coefficient flag alone is an error unless the scenario file supplies the other list
    (then the flag just replaces its list and the backend is left alone).
    """
    vals = ov.values
    a, b = "--alpha-coeffs" in vals, "--beta-coeffs" in vals
    if a != b:
        have, miss = ("--alpha-coeffs", "--beta-coeffs") if a else ("--beta-coeffs", "--alpha-coeffs")
        lat = data.get("latency")
        if isinstance(lat, dict) and lat.get(BY_NAME[miss].path.split(".")[1]) is not None:
            return
        raise ConfigError(f"must be given together with {miss}", field=have)
    if not a:
        return
    if "--latency-model" not in vals:
        _set(data, "latency.model", "blackbox")
        ov.origin["latency.model"] = "--alpha-coeffs"
    elif vals["--latency-model"] == "roofline":
        raise ConfigError("roofline takes no --alpha-coeffs/--beta-coeffs "
                          "(use --latency-model blackbox, or drop the coefficients)", field="--latency-model")


#: workload keys every source takes (closed-loop clients): kept when a flag replaces the source
CLOSED_LOOP_KEYS = ("concurrency", "concurrency_stages", "think_time")


def _carried(old) -> dict:
    """The closed-loop keys of the scenario's workload ``old``, for a workload a flag replaces it with."""
    return {k: old[k] for k in CLOSED_LOOP_KEYS if k in old} if isinstance(old, dict) else {}


def _spec_source(ov: Overrides, data: dict, presets) -> None:
    """``--workload-spec PATH``: a workload-spec workload; it wins over ``--workload`` and the
    distribution flags (only ``--num-requests`` still applies, docs/workloads.md)."""
    path = ov.values.get("--workload-spec")
    if path is not None:
        data["workload"] = {"kind": "spec", "path": path, **_carried(data.get("workload"))}
        ov.origin["workload.path"] = "--workload-spec"


def _workload_source(ov: Overrides, data: dict, presets) -> None:
    """``--workload distribution`` or a preset: a fresh distribution workload."""
    name = ov.values.get("--workload")
    if name is None:
        return
    if "--workload-spec" in ov.values:
        log.warning("--workload is ignored: --workload-spec is given")
        return
    if name == "distribution":
        w = data.get("workload")
        if not (isinstance(w, dict) and w.get("kind", "distribution") == "distribution"):
            data["workload"] = {"kind": "distribution", **_carried(w)}
        return
    try:
        preset = presets(name) if presets else None
    except ConfigError as exc:
        raise ConfigError(exc.problem, field="--workload") from None
    if preset is None:
        raise ConfigError(f"unknown workload {name!r}; valid: distribution, chatbot, contentgen, "
                          "summarization, multidoc", field="--workload")
    old = data.get("workload")
    keep = {k: old[k] for k in ("rate", "num_requests", "arrival", "arrival_cv", "stages",
                                "rate_schedule", "rate_csv")
            if isinstance(old, dict) and old.get("kind", "distribution") == "distribution" and k in old}
    data["workload"] = {"kind": "distribution", **keep, **_carried(old), **preset}
    for key in preset:
        ov.origin[f"workload.{key}"] = "--workload"


def _distribution_keys(ov: Overrides, data: dict, presets) -> None:
    """Distribution flags need a distribution workload; partial overrides keep the rest."""
    vals = ov.values
    if not any(n in vals for n in DIST_FLAGS):
        return
    w = data.setdefault("workload", {"kind": "distribution"})
    if isinstance(w, dict) and w.get("kind") == "spec":   # only --num-requests applies
        ignored = [n for n in DIST_FLAGS if n in vals and n != "--num-requests"]
        for n in ignored:
            del vals[n]
        if ignored:
            log.warning("%s ignored: the workload is a workload spec", ", ".join(ignored))
        return
    if isinstance(w, dict) and w.get("kind") == "trace":
        name = next(n for n in DIST_FLAGS if n in vals)
        raise ConfigError("applies to a distribution workload, but the scenario's workload is a trace "
                          "(pass --workload distribution to replace it)", field=name)
    for key in ("prompt_tokens", "output_tokens"):
        if isinstance(w, dict) and not isinstance(w.get(key), dict):
            w[key] = DistributionWorkload().model_dump()[key]


def _trace_source(ov: Overrides, data: dict, presets) -> None:
    """``--trace-header``/``--trace-data``: both, unless the scenario's workload is a trace."""
    vals = ov.values
    if "--trace-header" not in vals and "--trace-data" not in vals:
        return
    w = data.get("workload")
    is_trace = isinstance(w, dict) and w.get("kind") == "trace"
    for have, other in (("--trace-header", "--trace-data"), ("--trace-data", "--trace-header")):
        if have in vals and other not in vals and not is_trace:
            raise ConfigError(f"must be given together with {other}", field=have)
    if not is_trace:
        data["workload"] = {"kind": "trace", "header": vals["--trace-header"], "data": vals["--trace-data"],
                            **_carried(w)}


def _pd_rule(ov: Overrides, data: dict, presets) -> None:
    """The PD flags that are not one key each (docs/cli.md, docs/disaggregation.md).

    * ``--pd-decider`` naming another decider than the scenario's drops its parameters.
    * ``--pd-prefix-threshold`` / ``--pd-direct-decode-threshold`` become the decider's
      ``threshold``; given with another decider they are ignored with a warning.
    * ``--pd-transfer-contention`` (BLIS's bool) selects ``fair-share`` — ``snapshot`` under
      ``--pd-compat checkout`` — or ``none`` when false; ``--pd-contention-mode`` names the
      mode directly and must agree with it when both are given.
    * ``--prefill/decode-routing-scorers`` give that pool a weighted router.
    """
    vals = ov.values
    pd = data.get("disaggregation", {})
    if not isinstance(pd, dict):
        return                       # validation reports it
    dec = pd.get("decider", {})
    scen_decider = (dec.get("policy") if isinstance(dec, dict) else None) or "never"
    decider = vals.get("--pd-decider", scen_decider)
    if decider != scen_decider and isinstance(dec, dict) and "params" in dec:
        dec["params"] = {}
    for flag, name in (("--pd-prefix-threshold", "prefix-threshold"),
                       ("--pd-direct-decode-threshold", "direct-to-decode")):
        if flag not in vals:
            continue
        if decider != name:
            log.warning("%s is ignored: the decider is %s, not %s", flag, decider, name)
            continue
        params = mapping_at(data, "disaggregation", "decider", "params")
        if params is not None:
            params["threshold"] = vals[flag]
            ov.origin["disaggregation.decider.params.threshold"] = flag
    if "--pd-transfer-contention" in vals:
        on = vals["--pd-transfer-contention"]
        compat = vals.get("--pd-compat", pd.get("compat", "fixed"))
        mode = vals.get("--pd-contention-mode")
        if mode is not None:
            if (mode != "none") != on:
                raise ConfigError(f"--pd-transfer-contention={'true' if on else 'false'} contradicts "
                                  f"--pd-contention-mode {mode}", field="--pd-transfer-contention")
        else:
            transfer = mapping_at(data, "disaggregation", "transfer")
            if transfer is not None:
                transfer["contention"] = ("snapshot" if compat == "checkout" else "fair-share") if on else "none"
                ov.origin["disaggregation.transfer.contention"] = "--pd-transfer-contention"
    for flag, role in (("--prefill-routing-scorers", "prefill"), ("--decode-routing-scorers", "decode")):
        scorers = vals.get(flag)
        if not scorers:              # "" means not given (BLIS: an empty flag value)
            continue
        pool = mapping_at(data, "disaggregation", f"{role}_pool")
        if pool is not None:
            pool["routing"] = {"policy": "weighted", "params": {"scorers": scorers}}
            ov.origin[f"disaggregation.{role}_pool.routing"] = flag


#: Cross-flag rules, each run right after the row it is keyed by (BLIS's validation order).
AFTER: dict[str, Callable[[Overrides, dict, Any], None]] = {
    "--beta-coeffs": _coefficient_rule,
    "--workload-spec": _spec_source,
    "--workload": _workload_source,
    "--output-tokens-max": _distribution_keys,
    "--trace-data": _trace_source,
    "--fitness-weights": P.apply_policy_settings,
    "--pd-compat": _pd_rule,
}
