"""Driving a bare :class:`blis_simpy.des.SimEnv` in tests the way a simulation drives it."""

from __future__ import annotations

from blis_simpy.des import SimEnv


def run_through_horizon(env: SimEnv) -> None:
    """Process every event whose time is at most ``env.horizon_us`` (integer µs), one
    ``env.step()`` at a time, and stop before the first later one — the loop of
    :meth:`blis_simpy.run.simulation.Simulation.run`. The clock stays at the last
    event processed."""
    while env.peek() <= env.horizon_us:
        env.step()
