"""The loading delay of an instance the autoscaler starts (docs/control-plane.md, "Autoscaling").

``delay_us = round(startup_s · 10⁶) + ceil(weight_bytes / (load_bandwidth_gbps · 10⁹) · 10⁶)``:
a fixed start-up (process, CUDA context, engine initialisation) and then the model's weights
read at the load bandwidth (storage or network to GPU memory, the instance's aggregate;
GB = 10⁹ B). ``weight_bytes`` is the count the KV capacity uses
(:func:`blis_simpy.kv.capacity.weight_bytes`: parameters × bytes per weight, all GPUs
together), from the deployment's model config, else the model config found offline (the
built-in catalog or ``model_config_folder``). With ``load_bandwidth_gbps: null`` only the
start-up counts.
"""

from __future__ import annotations

import math

from blis_simpy.config.scenario import Scenario
from blis_simpy.deploy.lookups import Lookups
from blis_simpy.deploy.resolve import Deployment
from blis_simpy.errors import ConfigError
from blis_simpy.kv.capacity import weight_bytes
from blis_simpy.units import seconds_to_us

FIELD = "cluster.autoscaler.load_bandwidth_gbps"


def model_weight_bytes(scenario: Scenario, deployment: Deployment) -> int:
    """The model's weight bytes (all GPUs); a :class:`ConfigError` on the load bandwidth when
    no model config is known."""
    cfg = deployment.model_config
    if cfg is None and scenario.model:
        cfg = Lookups(scenario, True).model_config(scenario.model)[0]
    if cfg is None:
        raise ConfigError(f"the loading delay needs the weight bytes of model {scenario.model or '(none)'!r}: "
                          "no model config is known (give model_config_folder), or set "
                          "load_bandwidth_gbps to null to count the start-up only", field=FIELD)
    return weight_bytes(cfg)


def loading_delay_us(scenario: Scenario, deployment: Deployment) -> int:
    """µs from the decision to start an instance to its first request (module docstring)."""
    a = scenario.cluster.autoscaler
    startup_us = seconds_to_us(a.startup_s)
    if a.load_bandwidth_gbps is None:
        return startup_us
    nbytes = model_weight_bytes(scenario, deployment)
    return startup_us + math.ceil(nbytes * 1e6 / (a.load_bandwidth_gbps * 1e9))
