"""Sim vs real: replay a measured run through a scenario (:mod:`.twin`), compare the
latencies (:mod:`.compare`), render them (:mod:`.report`, :mod:`.plots`); ``blis-simpy fit``
(:mod:`blis_simpy.fit`) minimises the same errors."""

from blis_simpy.calibrate.compare import Comparison, compare
from blis_simpy.calibrate.twin import SimRun, scenario_data, simulate

__all__ = ["Comparison", "SimRun", "compare", "scenario_data", "simulate"]
