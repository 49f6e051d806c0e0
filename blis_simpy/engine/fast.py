"""The production engine: :class:`~blis_simpy.engine.instance.Instance` with the lazy ledger.

:class:`FastInstance` runs the one instance loop with decoding requests advanced lazily
(:class:`~blis_simpy.engine.lazy_ledger.LazyLedger`): O(1) Python work per decoding
request per step in the common case instead of O(batch). Results are identical to the
reference engine's (:class:`~blis_simpy.engine.instance.Instance`, eager ledger), and so is
the request state every hook, listener and policy sees.
"""

from __future__ import annotations

from blis_simpy.engine.instance import Instance
from blis_simpy.engine.lazy_ledger import LazyLedger


class FastInstance(Instance, name="fast"):
    """An engine instance whose decoding requests cost O(1) per step in the common case."""

    ledger_class = LazyLedger
    coalesce_steps = True
