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
import math
import os
import sys
from collections.abc import Callable
from importlib import metadata
from numbers import Real
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from blis_simpy.errors import BlisError, ConfigError, UnknownName, validation_problem


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
    #: names of class attributes (booleans) that each class declares for itself: a subclass
    #: that does not set one in its own body gets False, not its base's value (a claim
    #: about the class's code, which a base cannot make for a subclass's overrides)
    own_claims: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, *, family: str | None = None, name: str | None = None,
                          aliases: tuple[str, ...] = (), **kw: Any):
        super().__init_subclass__(**kw)
        params = cls.__dict__.get("Params")
        if params is not None and not (isinstance(params, type) and issubclass(params, BaseModel)):
            raise TypeError(f"{cls.__qualname__}.Params must be a pydantic BaseModel subclass, "
                            f"not {params!r}")
        #: defined in this package: trusted, so the engine skips checking what it returns
        cls._blis_builtin = is_builtin(cls)
        for claim in cls.own_claims:
            if claim not in cls.__dict__:
                setattr(cls, claim, False)
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
            raise UnknownName(f"unknown {cls.family} {name!r}; valid: {', '.join(cls.names())}",
                              name=f"{cls.family} {name!r}", field=field) from None

    @classmethod
    def parse_params(cls, params: dict | None, *, field: str | None = None) -> BaseModel:
        try:
            return validate_params(cls.Params, params or {})
        except ConfigError:
            raise
        except (TypeError, AttributeError, LookupError, ArithmeticError) as exc:
            # a validator of the plugin's that raised something pydantic does not catch
            raise ConfigError(f"{describe(cls)} failed to validate its parameters: "
                              f"{type(exc).__name__}: {exc}", field=field) from None
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ""
            key = err["type"] == "invalid_key"      # ``1: x``: the last part is a key, not an index
            for i, part in enumerate(err["loc"]):
                index = isinstance(part, int) and not (key and i == len(err["loc"]) - 1)
                loc += f"[{part}]" if index else ("." if loc else "") + str(part)
            where = f"{field}.{loc}" if field and loc else (field or loc or None)
            raise ConfigError(validation_problem(err, cls.Params), field=where) from None


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


def call_failure(plugin, method: str, exc: BaseException, *,
                 field: str | None = None) -> BlisError:
    """A plugin's ``method`` raised ``exc`` while the simulation ran: that plugin's error
    (an error of our own, such as a :class:`ConfigError`, passes through unchanged).
    ``sys.exit()`` in a plugin's code is its error too, not the end of the program."""
    if isinstance(exc, BlisError):
        return exc
    if method == "__init__":
        return build_failure(type(plugin), exc, field=field)
    if isinstance(exc, SystemExit):
        return plugin_error(plugin, f"called sys.exit({exc.code!r}) in {method}()", field=field)
    text = str(exc).replace("\n", " ")
    return plugin_error(plugin, f"failed: {method}() raised {type(exc).__name__}"
                        + (f": {text}" if text else ""), field=field)


def shown(value, limit: int = 60) -> str:
    """A short ``repr`` of what a plugin returned, with its type, for an error line."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text if value is None else f"{text} ({type(value).__name__})"


def is_number(value) -> bool:
    """A real number a float can hold, not NaN (a plugin's score, priority, rate): not a bool,
    a string, None, or an int too large for a float (``10**400``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return False
    try:
        return not math.isnan(value)
    except OverflowError:
        return False


def fraction(value) -> float:
    """A plugin's rate as a float in [0, 1]; a ValueError saying what was expected otherwise."""
    if is_number(value) and 0 <= value <= 1:
        return float(value)
    raise ValueError("a number from 0 to 1")


def non_negative(value) -> float:
    """A plugin's finite number >= 0 as a float; a ValueError otherwise."""
    if is_number(value) and 0 <= value < math.inf:
        return float(value)
    raise ValueError("a finite number >= 0")


def checked_results(plugin, checks: dict[str, Callable[[Any], Any]], *, field: str | None):
    """``plugin`` (an object of a plugin class) with each method named in ``checks`` replaced,
    on this object only, by one whose result passes through ``check(result)``: the value to
    use, or a ValueError saying what was expected, which becomes the plugin's one-line error
    (``returned nan (float) from step_time_us(); expected ...``). Done once when the object
    is built, so built-in classes, which are not wrapped, cost nothing more per call."""
    for name, check in checks.items():
        setattr(plugin, name, _checked_method(plugin, name, getattr(plugin, name), check, field))
    return plugin


def _checked_method(plugin, name: str, method, check, field: str | None):
    def checked(*args, **kw):
        res = method(*args, **kw)
        try:
            return check(res)
        except ValueError as exc:
            raise plugin_error(plugin, f"returned {shown(res)} from {name}(); expected {exc}",
                               field=field) from None
    return checked


def raised_in_plugin(exc: BaseException) -> tuple[Pluggable, str, BaseException] | None:
    """The plugin object whose own code raised ``exc``, the method it was running and the
    exception as raised; None when no plugin code is on its traceback.

    That is the innermost frame of code outside this package that runs a method of a plugin
    object (``self`` of a :class:`Pluggable` class not built in): a plugin's hook that
    raises, or that calls back into the package with arguments that make it raise. SimPy
    re-raises a process's failure as a copy whose cause is the original, so the cause chain
    is followed too."""
    for _ in range(8):          # a bounded walk down the chain of causes
        if exc is None:
            return None
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        for frame in reversed(frames):
            if frame.f_globals.get("__name__", "").split(".", 1)[0] == "blis_simpy":
                continue
            obj = frame.f_locals.get("self")
            if isinstance(obj, Pluggable) and not obj._blis_builtin:
                return obj, frame.f_code.co_name, exc
        exc = exc.__cause__
    return None


def running_plugin(frame) -> Pluggable | None:
    """The plugin object whose own code ``frame`` (a signal handler's frame) or one of its
    callers is running, as :func:`raised_in_plugin` tells it; None when no plugin code is on
    the stack. Ctrl-C uses it: a plugin that never returns never lets the simulation reach
    its next event, where a run otherwise stops."""
    for _ in range(10_000):     # the stack's depth is bounded by the recursion limit anyway
        if frame is None:
            return None
        if frame.f_globals.get("__name__", "").split(".", 1)[0] != "blis_simpy":
            obj = frame.f_locals.get("self")
            if isinstance(obj, Pluggable) and not obj._blis_builtin:
                return obj
        frame = frame.f_back
    return None


def build_failure(cls: type[Pluggable], exc: BaseException, *,
                  field: str | None) -> ConfigError:
    """A plugin's constructor raised: the one-line error naming the plugin (its family and
    registered name), as a failing plugin import is reported."""
    if isinstance(exc, SystemExit):
        return ConfigError(f"{describe(cls)} called sys.exit({exc.code!r}) while being built",
                           field=field)
    text = str(exc).replace("\n", " ")
    return ConfigError(f"{describe(cls)} failed to build: {type(exc).__name__}"
                       + (f": {text}" if text else ""), field=field)


ENTRY_POINT_GROUP = "blis_simpy.plugins"
_loaded: set[str] = set()


def load_plugins(modules: list[str] | tuple[str, ...] = (), *, entry_points: bool = True,
                 source: str | None = None, folders: tuple[str, ...] = ()) -> None:
    """Import plugin modules (each registers its policies by subclassing).

    ``modules`` are dotted module paths. They are looked up on ``sys.path`` and, when
    ``source`` (the scenario file) is given, first in the scenario's own folder — so a
    ``my_router.py`` next to the scenario is found as ``plugins: [my_router]``; ``folders``
    are searched first too (a sweep's or a plan's base scenario folder, for its points).
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
    search = list(dict.fromkeys(((os.path.dirname(os.path.abspath(source)),) if source else ())
                                + tuple(os.path.abspath(f) for f in folders)))
    for mod in modules:
        if mod in _loaded:
            continue
        added = [f for f in search if f not in sys.path]
        sys.path[:0] = added
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
            for f in added:
                sys.path.remove(f)
        _loaded.add(mod)
