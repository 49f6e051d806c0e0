"""The planner: parameter sweeps run in parallel on Dask, into a Parquet dataset (docs/planning.md).

* :mod:`~blis_simpy.planner.spec` — the sweep file (``SWEEP.yaml``), validated and located.
* :mod:`~blis_simpy.planner.points` — a sweep expanded into points, each with a config hash.
* :mod:`~blis_simpy.planner.executor` — :class:`~blis_simpy.planner.executor.Executor`, a Dask
  distributed client (a local cluster by default) mapping a function over items.
* :mod:`~blis_simpy.planner.dataset` — the Parquet dataset of results, resume and summary.

The planner never imports the command line: the function that runs one point is injected
(:func:`blis_simpy.run.point.run_point`).
"""
