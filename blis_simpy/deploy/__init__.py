"""Building a deployment from a validated scenario: latency models, KV caches, PD pools and
the control-plane policy bundle (:mod:`.resolve`, :mod:`.pools`, :mod:`.pool_deployment`,
:mod:`.policy`). Sits between the scenario schema (:mod:`blis_simpy.config`) and the
cluster that runs it."""
