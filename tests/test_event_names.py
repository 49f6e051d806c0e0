"""The events a user may hook are listed in one module (:data:`blis_simpy.des.EVENTS`), by
names that grep finds in the code that runs them, each with the hooks that exist."""

from __future__ import annotations

import re
from pathlib import Path

import blis_simpy
from blis_simpy import des
from blis_simpy.admission.base import AdmissionPolicy
from blis_simpy.admission.gateway import GatewayPolicy
from blis_simpy.cluster.cluster import Cluster
from blis_simpy.cluster.gateway import Gateway
from blis_simpy.cluster.pd import PDCluster
from blis_simpy.disagg.deciders import DisaggregationDecider
from blis_simpy.disagg.fabric import KVTransferFabric
from blis_simpy.engine.instance import Instance
from blis_simpy.engine.listener import InstanceListener
from blis_simpy.routing.base import Router

CLASSES = {c.__name__: c for c in (AdmissionPolicy, Cluster, PDCluster, DisaggregationDecider,
                                   KVTransferFabric, Instance, InstanceListener, Router,
                                   GatewayPolicy, Gateway)}
ROOT = Path(blis_simpy.__file__).parent


def test_every_event_name_is_found_outside_the_list():
    code = "\n".join(p.read_text() for p in ROOT.rglob("*.py") if p.name != "des.py")
    missing = [name for name in des.EVENTS if not re.search(rf"\b{name}\b", code)]
    assert missing == []


def test_every_hook_named_exists_and_every_key_is_a_key():
    named = 0
    for name, (key, hooks) in des.EVENTS.items():
        assert isinstance(key, int) and key >= 0, name
        for cls, attr in re.findall(r"\b([A-Z]\w+)\.(\w+)", hooks):
            assert hasattr(CLASSES[cls], attr), f"{name}: {cls}.{attr}"
            named += 1
    assert named >= len(des.EVENTS)
