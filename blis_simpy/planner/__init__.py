"""The planner: parameter sweeps run in parallel on Dask, into a Parquet dataset (docs/planning.md).

* :mod:`~blis_simpy.planner.spec` — the sweep file (``SWEEP.yaml``), validated and located.
* :mod:`~blis_simpy.planner.points` — a sweep expanded into points, each with a config hash.
* :mod:`~blis_simpy.planner.executor` — :class:`~blis_simpy.planner.executor.Executor`, a Dask
  distributed client (a local cluster by default) mapping a function over items.
* :mod:`~blis_simpy.planner.dataset` — the Parquet dataset of results, resume and summary.

The planner never imports the command line: the function that runs one point is injected
(:func:`blis_simpy.run.point.run_point`).
"""

#: ``plan --parallel`` when not given (here, not in plan_run, so that the CLI's help text
#: does not import the planner). A constant, not the executor's workers: the families searched
#: side by side decide which points the search runs (the bound prunes what a family started
#: earlier already ran), so a default tied to the workers made the plan document differ
#: between --serial, --workers 1 and --workers 2 (docs/determinism.md, INV-6)
DEFAULT_PARALLEL = 2
