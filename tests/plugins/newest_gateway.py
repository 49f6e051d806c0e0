"""A user-written gateway policy, loaded from a scenario's ``plugins:`` list: the newest
queued request leaves first (a LIFO queue), or the oldest with ``newest: false``::

    plugins: [tests.plugins.newest_gateway]
    cluster:
      gateway: {policy: newest-first, params: {newest: true}, detector: concurrency, max_concurrency: 1}
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from blis_simpy.admission.gateway import StandardGateway


class NewestFirst(StandardGateway, name="newest-first"):
    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        newest: bool = True

    def rank(self, req, seq, now_us):
        return (-seq,) if self.params.newest else (seq,)
