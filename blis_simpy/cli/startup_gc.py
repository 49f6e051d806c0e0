"""The start-up pause of Python's cyclic garbage collector (docs/performance.md, "Start-up").

Start-up allocates a few hundred thousand objects that live as long as the process (modules,
classes, functions, pydantic schemas) and almost no cyclic garbage; the collector would scan
them again and again while they are made (about a dozen generation-1 passes and one full
pass, ~60 ms of a small run). :func:`pause` (called by ``main()``, the console entry point)
makes generation-0 passes rare; :func:`resume` (called once the scenario is prepared, before
anything runs, by ``runner.prepare()``; ``observe``, which prepares none, calls it before it
sends) moves every object alive then into the collector's permanent generation (``gc.freeze``),
which later passes skip, and restores the thresholds. Reference counting
frees acyclic garbage as always; nothing here changes what a run computes.

A library caller (tests, a notebook) never pauses, so :func:`resume` is then a no-op and
never freezes anything.
"""

from __future__ import annotations

import gc

#: generation-0 threshold during start-up (CPython's default is 700)
STARTUP_THRESHOLD = 100_000

_saved: tuple[int, ...] | None = None


def pause() -> None:
    """Raise the generation-0 threshold until :func:`resume` (once per process)."""
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(STARTUP_THRESHOLD, *_saved[1:])


def resume() -> None:
    """End the pause, if any: freeze what start-up made, restore the thresholds."""
    global _saved
    if _saved is not None:
        gc.freeze()
        gc.set_threshold(*_saved)
        _saved = None
