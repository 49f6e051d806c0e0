"""How a flag's text becomes a value, and the rules a value must pass (docs/cli.md).

A parser takes the flag's text and returns its value (``ValueError`` = a bad value); a rule
takes the parsed value and returns None when it is fine, else the problem (the caller adds the
flag name). The flag table (:mod:`blis_simpy.cli.flags`) names one parser and at most one
rule per flag. Values carry the unit of the scenario key they set (µs, tokens, blocks, …).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from blis_simpy.errors import ConfigError
from blis_simpy.units import MAX_INT64


# ---------------------------------------------------------------------------- parsers
def integer(text: str) -> int:
    """A Go ``int64`` flag value: optional sign and decimal digits."""
    t = text.strip()
    if not t.lstrip("+-").isdigit():
        raise ValueError(f"invalid integer {text!r}")
    v = int(t)
    if not -MAX_INT64 - 1 <= v <= MAX_INT64:
        raise ValueError(f"{text} is out of the int64 range")
    return v


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"invalid number {text!r}") from None


def numbers(text: str) -> list[float]:
    """A comma-separated float list (``1.5,0,2e-3``)."""
    return [number(p) for p in text.split(",")]


def text(value: str) -> str:
    return value


def out_path(value: str) -> str:
    """An output file's path: not empty (``--results-path ""`` wrote nothing, exit 0)."""
    if not value.strip():
        raise ValueError("an empty path: give the file to write")
    return value


def lowered(value: str) -> str:
    return value.lower()


def boolean(value) -> bool:
    """A Go bool flag: ``--flag`` (True), ``--flag=false``; also true/false/1/0 text."""
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("true", "t", "1"):
        return True
    if v in ("false", "f", "0"):
        return False
    raise ValueError(f"invalid boolean {value!r}")


def scorer_text(text: str) -> list[dict]:
    """``--routing-scorers "name:w,name:w"`` → ``[{name, weight}]`` (empty text ⇒ [])."""
    from blis_simpy.routing.scorers import parse_scorers  # the scorer registry: only when given
    return parse_scorers(text) if text.strip() else []


def pairs(text: str, what: str) -> list[tuple[str, str]]:
    """``"key:value,key:value"`` → ``[(key, value text)]`` (empty text ⇒ []); ``what`` names an
    item in the error."""
    out = []
    for item in text.split(",") if text.strip() else ():
        key, sep, v = item.strip().partition(":")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"invalid {what} {item.strip()!r}: expected key:value")
        out.append((key, v))
    return out


def weights_text(text: str) -> dict[str, float]:
    """``--gateway-fair-share "a:2,b:1"`` → ``{flow: weight}``, each weight finite and > 0."""
    out: dict[str, float] = {}
    for key, w in pairs(text, "fair-share weight"):
        try:
            weight = float(w.strip())
        except ValueError:
            raise ValueError(f"invalid weight {w.strip()!r} for flow {key!r}") from None
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"weight for flow {key!r} must be finite and > 0, got {weight:g}")
        if key in out:
            raise ValueError(f"flow {key!r} is given twice")
        out[key] = weight
    return out


def fitness_text(text: str) -> dict[str, float]:
    """``--fitness-weights "key:w,key:w"`` → ``{key: w}`` (docs/metrics.md, "Fitness")."""
    from blis_simpy.metrics.fitness import FITNESS_KEYS
    out: dict[str, float] = {}
    for key, w in pairs(text, "fitness weight"):
        if key not in FITNESS_KEYS:
            raise ValueError(f"unknown fitness key {key!r}; valid keys: {', '.join(sorted(FITNESS_KEYS))}")
        try:
            weight = float(w.strip())
        except ValueError:
            raise ValueError(f"invalid weight {w.strip()!r} for fitness key {key!r}") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"fitness weight for {key!r} must be finite and >= 0, got {weight:g}")
        out[key] = weight
    return out


# ---------------------------------------------------------------------------- rules
# A rule returns None when the value is fine, else the problem (the flag name is added).
Rule = Callable[[Any], "str | None"]


def positive(v) -> str | None:
    return None if v > 0 and math.isfinite(v) else f"must be > 0, got {v}"


def non_negative(v) -> str | None:
    return None if v >= 0 and math.isfinite(v) else f"must be >= 0, got {v}"


def at_least_one(v) -> str | None:
    return None if v >= 1 else f"must be >= 1, got {v}"


def unit_interval(v) -> str | None:
    return None if math.isfinite(v) and 0 <= v <= 1 else f"must be in [0, 1], got {v}"


def fraction(v) -> str | None:
    return None if math.isfinite(v) and 0 < v <= 1 else f"must be in (0, 1], got {v}"


def interference_range(v) -> str | None:
    return None if math.isfinite(v) and 0 <= v <= 100 else f"must be finite in [0, 100], got {v}"


def priority_range(v) -> str | None:
    return None if 0 <= v <= 4 else f"must be in [0, 4], got {v}"


def decider_text(value: str) -> str:
    """``--pd-decider``: ``""`` means ``never`` (BLIS)."""
    return value or "never"


def decider_rule(v) -> str | None:
    from blis_simpy.deploy.pools import check_decider
    try:
        check_decider(v)
    except ConfigError as exc:
        return exc.problem
    return None


decider_rule.family = "decider"   # the help lists the registered deciders (cli/usage.py)


def one_of(*choices: str) -> Rule:
    def rule(v) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"
    rule.choices = choices    # the flag's help shows them (Flag.metavar)
    return rule


trace_level = one_of("none", "decisions")
tie_break = one_of("random", "first")




def each_non_negative(vs) -> str | None:
    for v in vs:
        if not math.isfinite(v) or v < 0:
            return f"every coefficient must be finite and >= 0, got {v}"
    return None


def registered(family: str) -> Rule:
    """The value must name a registered policy of ``family`` (looked up when checked)."""

    def rule(v) -> str | None:
        try:
            families()[family].lookup(v)
        except ConfigError as exc:
            return exc.problem
        return None

    rule.family = family    # the help lists the names registered in it (cli/usage.py)
    return rule


def families() -> dict[str, type]:
    from blis_simpy.admission.base import AdmissionPolicy
    from blis_simpy.admission.gateway import GatewayPolicy
    from blis_simpy.autoscaling import AutoscalePolicy
    from blis_simpy.disagg.deciders import DisaggregationDecider
    from blis_simpy.engine.scheduling import PriorityPolicy, Scheduler
    from blis_simpy.latency.base import LatencyModel
    from blis_simpy.routing.base import Router
    return {"latency": LatencyModel, "admission": AdmissionPolicy, "routing": Router,
            "scheduler": Scheduler, "priority": PriorityPolicy, "decider": DisaggregationDecider,
            "gateway": GatewayPolicy, "autoscaling": AutoscalePolicy}
