"""The snapshot provider's fast constructor (:func:`blis_simpy.snapshot.make_snapshot`) builds
the same frozen :class:`InstanceSnapshot` as its constructor."""

from __future__ import annotations

import dataclasses

import pytest

from blis_simpy.snapshot import InstanceSnapshot, make_snapshot


def test_make_snapshot_equals_the_constructor_and_stays_frozen():
    vals = ("instance_3", 3, 5, 7, 0.25, 120, 0.5, 9, "m")
    snap = make_snapshot(*vals)
    ref = InstanceSnapshot(*vals)
    assert type(snap) is InstanceSnapshot and snap == ref and hash(snap) == hash(ref)
    assert dataclasses.astuple(snap) == vals and repr(snap) == repr(ref)
    assert snap.effective_load == 5 + 7 + 9
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.queue_depth = 0
