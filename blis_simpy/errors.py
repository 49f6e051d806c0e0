"""The small error hierarchy. The CLI catches :class:`BlisError` in one place.

* :class:`ConfigError` — bad user input (file, line, field); the CLI prints one line, exit 2.
  :class:`UnknownName` — one of them: a name no registry holds.
* :class:`SimulationError` — something broke while simulating (time, instance, request).
* :class:`InvariantError` — an end-of-run invariant (conservation, causality) does not hold.

:func:`validation_problem` words a pydantic error as every YAML key's error is worded.
"""

from __future__ import annotations

import difflib
import types
import typing


class BlisError(Exception):
    """Base class of every error the CLI reports as a single line."""

    exit_code = 2

    def one_line(self) -> str:
        return str(self).replace("\n", " ")


class ConfigError(BlisError):
    """Invalid input: a scenario key, a flag, a trace row, a missing file.

    Rendered as ``FILE:LINE: field: problem`` (parts that are unknown are left out).
    """

    def __init__(self, problem: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.problem = problem
        self.file = file
        self.line = line
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        fld = f"{self.field}: " if self.field else ""
        return f"{where}{fld}{self.problem}"


class UnknownName(ConfigError):
    """A name that no registry holds (a router, a scheduler, a latency backend): a
    :class:`ConfigError` that ``validate`` can set aside while a scenario's plugin modules,
    which may register the name, are not imported (docs/extending.md, "Loading plugins").
    ``name``: what was looked up (``routing policy 'least-kv'``)."""

    def __init__(self, problem: str, *, name: str, field: str | None = None):
        self.name = name
        super().__init__(problem, field=field)


class SimulationError(BlisError):
    """A failure during simulation, located by simulated time, instance and request."""

    exit_code = 1

    def __init__(self, problem: str, *, time_us: int | None = None, instance: str | None = None,
                 request: str | None = None):
        self.problem = problem
        self.time_us = time_us
        self.instance = instance
        self.request = request
        parts = []
        if time_us is not None:
            parts.append(f"t={time_us}us")
        if instance:
            parts.append(instance)
        if request:
            parts.append(request)
        loc = f"[{' '.join(parts)}] " if parts else ""
        super().__init__(f"simulation error: {loc}{problem}")


class InvariantError(SimulationError):
    """An invariant (docs/determinism.md, "Invariants") is broken at the end of a run."""


#: pydantic error types for "not a mapping" (a model's or a dict's input): pydantic's text
#: names our classes ("... or instance of BundleRouting"), the user wrote YAML
_NOT_A_MAPPING = frozenset(("model_type", "model_attributes_type", "dict_type", "dataclass_type"))


def did_you_mean(word: str, choices, *, n: int = 3, cutoff: float = 0.6, prefix: str = "") -> str:
    """`` (did you mean A or B?)`` naming the ``choices`` closest to ``word`` (difflib's
    ratio at least ``cutoff``; each written after ``prefix``), or ``""`` when none is close.
    Every unknown key, flag, metric and model name is completed by this one function."""
    near = difflib.get_close_matches(word, list(choices), n=n, cutoff=cutoff)
    return f" (did you mean {' or '.join(prefix + c for c in near)}?)" if near else ""


def _models_in(annotation) -> list[type]:
    """The pydantic model classes an annotation can hold (through Optional, unions, lists,
    dicts and Annotated)."""
    from pydantic import BaseModel
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None:
        return []
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        args = args[:1]
    elif origin is dict:
        args = args[1:]
    elif origin not in (typing.Union, types.UnionType, list, tuple, set, frozenset):
        return []
    return [m for a in args for m in _models_in(a)]


def known_keys(model: type, loc: tuple) -> list[str]:
    """The keys a YAML mapping may hold at ``loc`` (the location of an unknown key, the key
    itself last) in ``model``'s schema: field names and aliases of every model that can sit
    there. Empty when the schema cannot say."""
    models = [model]
    for part in loc[:-1]:
        if not isinstance(part, str):
            continue            # a list index: the same models hold the items
        fields = [f for m in models for name, f in m.model_fields.items() if part in (name, f.alias)]
        if fields:
            models = [m for f in fields for m in _models_in(f.annotation)]
        # else: a key of a dict of models (variants:, pools:): the same models hold the values
        if not models:
            return []
    keys: list[str] = []
    for m in models:
        for name, f in m.model_fields.items():
            keys.append(f.alias or name)
    return sorted(set(keys))


def validation_problem(first: dict, model: type | None = None) -> str:
    """A short problem text for one pydantic error (a dict of ``errors()``), as every YAML
    key is reported: the scenario's, the policy bundle's, a workload spec's, a coefficient
    set's and a plugin's ``params``. Never names one of our classes. With the ``model`` that
    was validated, an unknown key names the closest known keys (:func:`did_you_mean`)."""
    kind = first["type"]
    if kind == "extra_forbidden":
        loc = tuple(first.get("loc") or ())
        if model is not None and loc and isinstance(loc[-1], str):
            return "unknown key" + did_you_mean(loc[-1], known_keys(model, loc))
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = "input should be a mapping" if kind in _NOT_A_MAPPING else first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    msg = msg[0].lower() + msg[1:] if msg else "invalid value"
    if "input" in first and not isinstance(first["input"], (dict, list)) and ", got " not in msg:
        msg += f", got {first['input']!r}"      # (a validator's own message may say it already)
    return msg
