"""The run layer: a scenario and overrides in, a report out (docs/architecture.md).

* :func:`prepare` (:mod:`~blis_simpy.run.describe`): a scenario file or dict plus overrides
  keyed by scenario paths → a validated, frozen :class:`RunDescription`;
* :func:`execute` (:mod:`~blis_simpy.run.execute`): a description → an :class:`Outcome`
  (the simulation's result and the report the CLI prints and the JSON writer serialises);
  :func:`simulate` runs requests a caller built itself (the calibration twin, bench);
* :func:`run_point` (:mod:`~blis_simpy.run.point`): one sweep or plan point → a flat row;
* :class:`Simulation` (:mod:`~blis_simpy.run.simulation`): the composition root, which builds
  the instances, policies and cluster of a scenario on one SimPy environment and runs them.

The CLI, the planner's commands, calibrate, fit and the bench scripts go through it; it
knows no command-line flag.
"""

from blis_simpy.run.describe import Outputs, RunDescription, prepare
from blis_simpy.run.execute import Outcome, execute, simulate
from blis_simpy.run.point import run_point
from blis_simpy.run.simulation import Simulation

__all__ = ["Outcome", "Outputs", "RunDescription", "execute", "prepare", "Simulation", "run_point", "simulate"]
