"""The planner: sweeps and plans, run in parallel on Dask (docs/planning.md).

Sweeps (``blis-simpy sweep``), into a Parquet dataset:

* :mod:`~blis_simpy.planner.sweep_file` — the sweep file (``SWEEP.yaml``), validated and located.
* :mod:`~blis_simpy.planner.sweep_points` — a sweep expanded into points, each with a config hash.
* :mod:`~blis_simpy.planner.executor` — :class:`~blis_simpy.planner.executor.Executor`, a Dask
  distributed client (a local cluster by default) mapping a function over items.
* :mod:`~blis_simpy.planner.dataset` — the Parquet dataset of results, resume and summary.

Plans (``blis-simpy plan``), the cheapest deployment that meets the SLOs:

* :mod:`~blis_simpy.planner.plan_file` — the plan file (``PLAN.yaml``), validated and located.
* :mod:`~blis_simpy.planner.candidates` — candidate deployments and families, the point each
  one runs, and whether its runs meet the SLOs.
* :mod:`~blis_simpy.planner.search` — the searches: cheapest per family, highest rate, brute force.
* :mod:`~blis_simpy.planner.plan_runner` — judging candidates by simulation, the plan's result.
* :mod:`~blis_simpy.planner.pareto` — Pareto fronts of evaluated deployments.

The planner never imports the command line: the function that runs one point is injected
(:func:`blis_simpy.run.point.run_point`).
"""

#: ``plan --parallel`` when not given (here, not in plan_runner, so that the CLI's help text
#: does not import the planner). A constant, not the executor's workers: the families searched
#: side by side decide which points the search runs (the bound prunes what a family started
#: earlier already ran), so a default tied to the workers made the plan document differ
#: between --serial, --workers 1 and --workers 2 (docs/determinism.md, INV-6)
DEFAULT_PARALLEL = 2
