"""How a simulation holds the plugins it runs to account (docs/extending.md, "When a plugin
misbehaves"): the scenario key of each plugin family, a plugin class's constructor and an
engine class's results checked, an exception traced back to the plugin whose code raised
it, and the plugins named on a simulation error they may have caused.

Built-in classes are never wrapped, so the simulation's hot paths cost what they did."""

from __future__ import annotations

from blis_simpy.deploy.backends import whole_us
from blis_simpy.engine.instance import Instance
from blis_simpy.errors import ConfigError, SimulationError
from blis_simpy.metrics.records import InstanceMetrics
from blis_simpy.plugins import (
    Pluggable,
    build_failure,
    call_failure,
    checked_results,
    describe,
    is_builtin,
    raised_in_plugin,
)

#: the scenario key that chooses a plugin of each family (a router knows its own key)
PLUGIN_FIELDS = {
    "engine implementation": "engine.implementation", "cluster": "cluster.implementation",
    "kv transfer fabric": "disaggregation.transfer.fabric", "latency model": "latency.model",
    "kv cache": "engine.kv_cache", "batching policy": "engine.batching",
    "disaggregation decider": "disaggregation.decider.policy", "scheduler": "engine.scheduler",
    "priority policy": "engine.priority_policy", "admission policy": "cluster.admission.policy",
    "routing policy": "cluster.routing.policy", "routing scorer": "cluster.routing.params.scorers",
}


def plugin_failure(exc: BaseException) -> ConfigError | None:
    """The one-line error of the plugin whose own code raised ``exc`` (on the key that chose
    it), or None when no plugin code raised it."""
    found = raised_in_plugin(exc)
    if found is None:
        return None
    plugin, method, raised = found
    field = getattr(plugin, "config_field", None)
    field = f"{field}.policy" if field else PLUGIN_FIELDS.get(type(plugin).family)
    return call_failure(plugin, method, raised, field=field)


def guarded(cls: type, field: str):
    """``cls`` itself if it is built in; for a plugin class, a constructor whose failures are
    reported as that plugin's one-line :class:`ConfigError` on ``field``."""
    if is_builtin(cls):
        return cls

    def build(*args, **kw):
        try:
            return cls(*args, **kw)
        except ConfigError:
            raise
        except Exception as exc:
            raise build_failure(cls, exc, field=field) from None

    return build


def _metrics(value) -> InstanceMetrics:
    if isinstance(value, InstanceMetrics):
        return value
    raise ValueError("the instance's InstanceMetrics (return super().finalize())")


def check_instance(inst: Instance) -> None:
    """Check what a plugin engine class's own ``step_time_us`` (a whole number of µs >= 0)
    and ``finalize`` (the metrics) return; hooks it does not override are not wrapped."""
    checks = {"finalize": _metrics}
    if type(inst).step_time_us is not Instance.step_time_us:
        checks["step_time_us"] = whole_us
    checked_results(inst, checks, field="engine.implementation")


def plugins_in_use(cluster, instances) -> list[Pluggable]:
    """The plugin objects (not built in) a run calls, one per class: the cluster, its
    admission, router, scorers, decider and fabric, each instance and its latency model,
    KV cache, scheduler, priority policy and batching policy."""
    router = getattr(cluster, "router", None)
    objs = [cluster, getattr(cluster, "admission", None), router,
            getattr(cluster, "decider", None), getattr(cluster, "fabric", None),
            *getattr(router, "scorers", ())]
    for inst in instances:
        objs += [inst, getattr(inst, "latency", None), getattr(inst, "kv", None),
                 getattr(inst, "scheduler", None), getattr(inst, "priority_policy", None),
                 getattr(inst, "batching", None)]
    seen, out = set(), []
    for o in objs:
        if isinstance(o, Pluggable) and not o._blis_builtin and type(o) not in seen:
            seen.add(type(o))
            out.append(o)
    return out


def with_plugin_hint(exc: Exception, cluster, instances) -> BaseException:
    """The error to report for ``exc``, a failure of our code in a run: when the run calls
    plugin code, a :class:`SimulationError` naming those plugins (``... (this run calls
    plugin code, check it first: cluster 'x' (m.X))``; a plugin that breaks the simulator's
    rules without raising shows up as a simulation, invariant or internal error, which the
    built-ins are tested not to cause); else ``exc`` itself."""
    plugins = plugins_in_use(cluster, instances)
    if not plugins:
        return exc
    hint = f" (this run calls plugin code, check it first: {'; '.join(map(describe, plugins))})"
    if isinstance(exc, SimulationError):
        return type(exc)(f"{exc.problem}{hint}", time_us=exc.time_us, instance=exc.instance,
                         request=exc.request)
    return SimulationError(f"internal error: {type(exc).__name__}: {exc}{hint}")
