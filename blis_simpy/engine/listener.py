"""What the cluster learns from an engine instance (docs/architecture.md).

An instance calls its listener when a request leaves it and after each of its events; the
cluster (:class:`~blis_simpy.cluster.cluster.Cluster`) is the listener of its instances.
Ticks are integer µs.
"""

from __future__ import annotations


class InstanceListener:
    """What the cluster learns from an instance. Default: nothing."""

    def on_request_done(self, inst, req, tick_us: int) -> None:
        """A request left the instance ``inst`` (an :class:`~blis_simpy.engine.instance.Instance`)
        at ``tick_us``: completed, timed out, or dropped (still queued). The ``RequestDone``
        event of :data:`blis_simpy.des.EVENTS`."""

    def on_event_end(self, inst) -> None:
        """Called after each instance event (step, enqueue, timeout) is processed."""

    #: True: requests reach :meth:`on_request_done` with their ``itl`` list materialised
    #: under every ledger (it costs the lazy ledger O(batch) per step); ``pi`` always is.
    wants_request_state = False

    #: True: :meth:`on_event_end` does nothing after a step from which no request left the
    #: instance, so the fast engine may run such steps back to back without calling it. A
    #: subclass whose ``on_event_end`` comes from a class (itself or a mixin) that precedes,
    #: in its MRO, every class setting ``quiet_steps`` is not quiet unless it says so.
    quiet_steps = True

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "quiet_steps" in cls.__dict__:
            return
        mro = cls.__mro__
        # which class gives the subclass its on_event_end, and which its quiet_steps: a
        # method defined below (or beside, in a mixin) the quiet declaration overrides it
        ends = next(i for i, k in enumerate(mro) if "on_event_end" in k.__dict__)
        quiet = next(i for i, k in enumerate(mro) if "quiet_steps" in k.__dict__)
        if ends < quiet:
            cls.quiet_steps = False
