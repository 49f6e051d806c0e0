"""Registries of pluggable deciders, filled by subclassing, and third-party plugin loading.

Every policy family (latency models, schedulers, priority policies, routers, admission
policies, ...) has one root class deriving from :class:`Pluggable`. A concrete policy
registers itself by name when its class is defined::

    class MyRouter(Router, name="mine"):
        class Params(BaseModel):      # optional: its own validated parameters
            alpha: float = 1.0

Third-party policies live in ordinary modules; they are imported by a scenario's
``plugins:`` list (module paths) or through the ``blis_simpy.plugins`` entry-point group.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib import metadata
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from blis_simpy.errors import BlisError, ConfigError


class NoParams(BaseModel):
    """Parameters of a policy that takes none."""

    model_config = ConfigDict(extra="forbid")


class Pluggable:
    """Root of a registry family. Subclass with ``family="..."`` to start a new family (the
    root may register itself too: ``family="engine", name="reference"``)."""

    family: ClassVar[str] = ""
    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    Params: ClassVar[type[BaseModel]] = NoParams
    _registry: ClassVar[dict[str, type]]
    _blis_builtin: ClassVar[bool] = True

    def __init_subclass__(cls, *, family: str | None = None, name: str | None = None,
                          aliases: tuple[str, ...] = (), **kw: Any):
        super().__init_subclass__(**kw)
        #: defined in this package: trusted, so the engine skips checking what it returns
        cls._blis_builtin = is_builtin(cls)
        if family is not None:     # a new family; its root may also register itself by name
            cls.family = family
            cls._registry = {}
        if name is not None:
            reg = cls._registry
            for key in (name, *aliases):
                if key in reg and reg[key] is not cls:
                    raise ValueError(f"{cls.family} {key!r} is already registered by {reg[key].__name__}")
            cls.name = name
            cls.aliases = aliases
            for key in (name, *aliases):
                reg[key] = cls

    # ------------------------------------------------------------------ lookup
    @classmethod
    def names(cls) -> list[str]:
        """Registered primary names, sorted."""
        return sorted({c.name for c in cls._registry.values()})

    @classmethod
    def lookup(cls, name: str, *, field: str | None = None) -> type:
        try:
            return cls._registry[name]
        except KeyError:
            raise ConfigError(f"unknown {cls.family} {name!r}; valid: {', '.join(cls.names())}",
                              field=field) from None

    @classmethod
    def parse_params(cls, params: dict | None, *, field: str | None = None) -> BaseModel:
        try:
            return validate_params(cls.Params, params or {})
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ""
            key = err["type"] == "invalid_key"      # ``1: x``: the last part is a key, not an index
            for i, part in enumerate(err["loc"]):
                index = isinstance(part, int) and not (key and i == len(err["loc"]) - 1)
                loc += f"[{part}]" if index else ("." if loc else "") + str(part)
            where = f"{field}.{loc}" if field and loc else (field or loc or None)
            problem = err["msg"].removeprefix("Value error, ")
            if err["type"] in _SCALAR_TYPES and isinstance(err.get("input"), str):
                problem += f", got {err['input']!r} (a quoted string)"
            raise ConfigError(problem, field=where) from None


_SCALAR_TYPES = ("int_type", "float_type", "bool_type")


def validate_params(model: type[BaseModel], data: object) -> BaseModel:
    """``model`` validated from ``data`` as pydantic does, except that a number or boolean
    written as a quoted string (``"10"``, ``"true"``) is refused, as the scenario's strict
    models and the policy bundle refuse it: one rule for every YAML file."""
    try:
        model.model_validate(data, strict=True)
    except ValidationError as exc:
        for e in exc.errors(include_url=False):
            if e["type"] in _SCALAR_TYPES and isinstance(e.get("input"), str):
                raise ValidationError.from_exception_data(exc.title, [
                    {"type": e["type"], "loc": e["loc"], "input": e["input"]}]) from None
    return model.model_validate(data)


def is_builtin(cls: type) -> bool:
    """True for a class defined in this package (not a plugin)."""
    return cls.__module__.split(".", 1)[0] == "blis_simpy"


def describe(plugin) -> str:
    """``family 'name' (module.Class)`` of a plugin class or object, as its errors name it."""
    cls = plugin if isinstance(plugin, type) else type(plugin)
    where = f"({cls.__module__}.{cls.__qualname__})"
    registered = getattr(cls, "_registry", {}).get(cls.name) is cls   # else: not by this name
    return f"{cls.family} {cls.name!r} {where}" if registered else f"{cls.family} {where}"


def plugin_error(plugin, problem: str, *, field: str | None = None) -> ConfigError:
    """The one-line error of a plugin that misbehaved: ``problem`` after the plugin's family,
    registered name and class; ``field`` is the scenario key that chose it (exit 2)."""
    return ConfigError(f"{describe(plugin)} {problem}", field=field)


def call_failure(plugin, method: str, exc: Exception, *, field: str | None = None) -> BlisError:
    """A plugin's ``method`` raised ``exc`` while the simulation ran: that plugin's error
    (an error of our own, such as a :class:`ConfigError`, passes through unchanged)."""
    if isinstance(exc, BlisError):
        return exc
    text = str(exc).replace("\n", " ")
    return plugin_error(plugin, f"failed: {method}() raised {type(exc).__name__}"
                        + (f": {text}" if text else ""), field=field)


def build_failure(cls: type[Pluggable], exc: Exception, *, field: str | None) -> ConfigError:
    """A plugin's constructor raised: the one-line error naming the plugin (its family and
    registered name), as a failing plugin import is reported."""
    return ConfigError(f"{describe(cls)} failed to build: {type(exc).__name__}: {exc}", field=field)


ENTRY_POINT_GROUP = "blis_simpy.plugins"
_loaded: set[str] = set()


def load_plugins(modules: list[str] | tuple[str, ...] = (), *, entry_points: bool = True,
                 source: str | None = None) -> None:
    """Import plugin modules (each registers its policies by subclassing).

    ``modules`` are dotted module paths. They are looked up on ``sys.path`` and, when
    ``source`` (the scenario file) is given, first in the scenario's own folder — so a
    ``my_router.py`` next to the scenario is found as ``plugins: [my_router]``.
    """
    if entry_points and "<entry-points>" not in _loaded:
        _loaded.add("<entry-points>")
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as exc:
                raise ConfigError(f"plugin entry point {ep.name!r} ({ep.value}) failed to load: "
                                  f"{type(exc).__name__}: {exc}") from None
            except SystemExit as exc:
                raise ConfigError(f"plugin entry point {ep.name!r} ({ep.value}) called "
                                  f"sys.exit({exc.code!r}) while loading") from None
    folder = os.path.dirname(os.path.abspath(source)) if source else None
    for mod in modules:
        if mod in _loaded:
            continue
        added = folder is not None and folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise ConfigError(f"cannot import plugin module {mod!r}: {exc}", file=source,
                              field="plugins") from None
        except Exception as exc:  # user code failing at import time (e.g. a duplicate name)
            raise ConfigError(f"plugin module {mod!r} failed to import: {type(exc).__name__}: {exc}",
                              file=source, field="plugins") from None
        except SystemExit as exc:  # sys.exit() (or exit()) in the module's top-level code
            raise ConfigError(f"plugin module {mod!r} called sys.exit({exc.code!r}) while being "
                              "imported", file=source, field="plugins") from None
        finally:
            if added:
                sys.path.remove(folder)
        _loaded.add(mod)
