"""The sweep file (``blis-simpy sweep SWEEP.yaml``, docs/planning.md "Sweeps").

::

    name: rate-knee                 # optional
    base: quickstart.yaml           # a scenario file (relative to this file) or a mapping
    command: run                    # run | replay
    mode: product                   # product (every combination) | list (zip, equal lengths)
    axes:                           # dotted scenario key -> values
      workload.rate: {range: [4, 16, 4]}    # start, stop (included), step -> 4, 8, 12, 16
      cluster.num_instances: [1, 2]
    seeds: [1, 2, 3]                # or repeats: 3 (seeds: the base seed, +1, +2)
    slo: {...}                      # optional: the scenario's slo: for every point

Every key is checked (unknown keys at any depth are errors) and every error names the line
of this file: ``SWEEP.yaml:LINE: axes.workload.rate[2]: ...``. A sweep has at most
:data:`MAX_POINTS` points (configurations x seeds), counted before anything is expanded.
"""

from __future__ import annotations

import math
import os
import re
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from blis_simpy.config.loader import Source, read_yaml, validation_problem
from blis_simpy.errors import ConfigError
from blis_simpy.units import MAX_INT64

__all__ = ["MAX_POINTS", "RangeAxis", "SweepSpec", "axis_values", "load_sweep", "point_count"]

#: points of one sweep at most (configurations x seeds)
MAX_POINTS = 100_000
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
Number = Annotated[float, Field(allow_inf_nan=False)]


def _past_int64(x) -> bool:
    """An integer (not a bool) outside the signed 64-bit range: a dataset's int64 column
    cannot hold it."""
    return isinstance(x, int) and not isinstance(x, bool) and not -MAX_INT64 - 1 <= x <= MAX_INT64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RangeAxis(_Strict):
    """``{range: [start, stop, step]}``: start, start + step, ... up to stop **included**
    (integers when all three are integers)."""

    range: Annotated[list[int | Number], Field(min_length=3, max_length=3)]

    @field_validator("range", mode="before")
    @classmethod
    def _int64(cls, v):
        # before the union: an integer past int64 would pass as a float (or, in the
        # dataset's int64 column, overflow after the points ran)
        for i, x in enumerate(v if isinstance(v, list) else ()):
            if _past_int64(x):
                raise ValueError(f"{_WHICH[i] if i < 3 else f'item {i}'} ({x}) is out of the signed "
                                 "64-bit integer range")
        return v

    @field_validator("range")
    @classmethod
    def _check(cls, v):
        start, stop, step = v
        if step <= 0:
            raise ValueError(f"step must be > 0, got {step}")
        if stop < start:
            raise ValueError(f"stop ({stop}) must be >= start ({start})")
        n = _count(start, stop, step)
        if n > MAX_POINTS:     # before anything is expanded
            raise ValueError(f"range has {n:,} values, more than a sweep's {MAX_POINTS:,} points"
                             if n != math.inf else
                             f"range has more values than a sweep's {MAX_POINTS:,} points")
        return v

    def count(self) -> int:
        return _count(*self.range)

    def values(self) -> list:
        start, _, step = self.range
        n = self.count()
        if all(isinstance(v, int) for v in self.range):
            return [start + i * step for i in range(n)]
        return [round(start + i * step, 12) for i in range(n)]


_WHICH = ("start", "stop", "step")


def _count(start, stop, step) -> int | float:
    """Values of a range: exact for integers; ``math.inf`` when the float quotient is not
    finite (a span of 1e308 by steps of 1e-308)."""
    if all(isinstance(x, int) for x in (start, stop, step)):
        return (stop - start) // step + 1
    q = (stop - start) / step
    return math.floor(q + 1e-9) + 1 if math.isfinite(q) else math.inf


AxisValues = Annotated[list[Any], Field(min_length=1)] | RangeAxis


class SweepSpec(_Strict):
    """A validated sweep file."""

    name: str = ""
    description: str = ""
    base: str | dict[str, Any] = Field(description="scenario file (relative to the sweep file) or mapping")
    command: Literal["run", "replay"] = "run"
    mode: Literal["product", "list"] = "product"
    axes: dict[str, AxisValues] = Field(default_factory=dict)
    seeds: Annotated[list[Annotated[int, Field(ge=-MAX_INT64 - 1, le=MAX_INT64)]],
                     Field(min_length=1)] | None = None
    repeats: Annotated[int, Field(gt=0)] | None = None
    slo: dict[str, Any] | None = Field(None, description="the scenario's slo: for every point")

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if self.seeds is not None and self.repeats is not None:
            raise ValueError("give seeds or repeats, not both")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        return self


def axis_values(axis) -> list:
    """The values of one axis (a list, or a :class:`RangeAxis` expanded)."""
    return axis.values() if isinstance(axis, RangeAxis) else list(axis)


def _axis_len(axis) -> int:
    return axis.count() if isinstance(axis, RangeAxis) else len(axis)


def point_count(spec: SweepSpec) -> int:
    """Configurations x seeds, computed without expanding anything."""
    lens = [_axis_len(a) for a in spec.axes.values()]
    configs = math.prod(lens) if spec.mode == "product" else (lens[0] if lens else 1)
    seeds = len(spec.seeds) if spec.seeds is not None else (spec.repeats or 1)
    return configs * seeds


def _check_axes(spec: SweepSpec, src: Source) -> None:
    keys = list(spec.axes)
    for key in keys:
        loc = ("axes", key)
        if not _KEY.match(key):
            raise src.error("an axis is a dotted scenario key such as workload.rate", loc)
        if key == "seed":
            raise src.error("the seed is not an axis: use seeds: [...] or repeats: N", loc)
        for other in keys:
            if other != key and other.startswith(key + "."):
                raise src.error(f"overlaps axis {other}", loc)
        axis = spec.axes[key]
        for i, v in enumerate(axis if isinstance(axis, list) else ()):
            # a dataset column of integers is int64: past it the rows could not be written
            # (an OverflowError once the points had run)
            if _past_int64(v):
                raise src.error(f"{v} is out of the signed 64-bit integer range", loc + (i,))
    if spec.mode == "list" and keys:
        n = _axis_len(spec.axes[keys[0]])
        for key in keys[1:]:
            if _axis_len(spec.axes[key]) != n:
                raise src.error(f"mode list needs axes of equal length: {keys[0]} has {n} values, "
                                f"{key} has {_axis_len(spec.axes[key])}", ("axes", key))
    lens = [_axis_len(a) for a in spec.axes.values()]
    configs = math.prod(lens) if spec.mode == "product" else (lens[0] if lens else 1)
    if configs > MAX_POINTS:   # before seeds: the product itself may be astronomical
        raise src.error(f"{configs:,} configurations, more than a sweep's {MAX_POINTS:,} points "
                        "(fewer axis values, or split the sweep)", ("axes",))
    n = point_count(spec)
    if n > MAX_POINTS:
        what = "seeds" if spec.seeds is not None else "repeats"
        raise src.error(f"{n:,} points ({configs:,} configurations x seeds), more than a sweep's "
                        f"{MAX_POINTS:,}", (what,))


def load_sweep(path: str) -> tuple[SweepSpec, Source]:
    """Read and validate a sweep file; errors are located ``FILE:LINE: key: problem``."""
    data, src = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("a sweep file must be a mapping of keys (base, axes, ...)", file=src.path,
                          line=1)
    axes = data.get("axes")
    if isinstance(axes, dict):   # a mapping axis is a range: its own errors, not the union's
        for key, value in axes.items():
            if isinstance(value, dict):
                _validate(RangeAxis, value, src, ("axes", key))
    spec = _validate(SweepSpec, data, src, ())
    _check_axes(spec, src)
    return spec, src


def _validate(model, data, src: Source, at: tuple):
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise src.error(validation_problem(first, model), at + _data_loc(data, first["loc"])) from None


def _data_loc(data, loc) -> tuple:
    """The part of a pydantic error location that names keys and items of ``data`` (union
    member tags such as ``list[any]`` or ``str`` dropped)."""
    out: list = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            cur = cur[part]
        elif isinstance(cur, dict) and isinstance(part, str) and not any(c in part for c in "[]()"):
            out.append(part)     # an unknown or missing key: named, then nothing deeper
            break
        else:
            continue
        out.append(part)
    return tuple(out)


def base_path(spec: SweepSpec, sweep_path: str) -> str | None:
    """The base scenario file (absolute), or None for an inline base."""
    if not isinstance(spec.base, str):
        return None
    return os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(sweep_path)), spec.base))
