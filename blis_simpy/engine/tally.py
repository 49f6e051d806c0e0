"""Per-request warnings summarised per cause at the end of a run (docs/cli.md, "Logs").

A run that drops 2,195 requests used to print 2,195 warnings. The engine now notes each such
event here (:func:`note`: what happened, why, to which request) and the simulation prints one
line per cause when it ends (:func:`flush`)::

    WARNING blis_simpy.engine: dropped 2,195 requests: input length N >= MaxModelLen N (no room
    for output); first: request_3 (input length 5000 >= MaxModelLen 4096 (no room for output)),
    request_7, request_9

Causes that differ only in their numbers share a line (the numbers show as ``N``; the first
request's own text follows its ID). Each event is still logged at DEBUG as it happens. The
tally is one per process (a run is single-threaded); :func:`reset` starts a run's, and its
size is bounded by the number of distinct causes, each keeping :data:`FIRST_IDS` IDs.
"""

from __future__ import annotations

import logging
import re

#: request IDs named per cause
FIRST_IDS = 3
#: distinct causes kept; later new causes are counted under one "other causes" line
MAX_CAUSES = 64

_NUMBER = re.compile(r"\d+")


class Tally:
    """Counts of per-request events by (logger, what, cause)."""

    def __init__(self) -> None:
        self._causes: dict[tuple[str, str, str, int], list] = {}

    def note(self, logger: logging.Logger, what: str, cause: str, request_id,
             level: int = logging.WARNING) -> None:
        """One event: ``what`` (``dropped``) happened to ``request_id`` because of ``cause``."""
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s request %s: %s", what, request_id, cause)
        key_cause = _NUMBER.sub("N", cause)
        key = (logger.name, what, key_cause, level)
        entry = self._causes.get(key)
        if entry is None:
            if len(self._causes) >= MAX_CAUSES:
                key = (logger.name, what, "other causes", level)
                entry = self._causes.get(key)
            if entry is None:
                entry = self._causes[key] = [0, []]
        entry[0] += 1
        if len(entry[1]) < FIRST_IDS:
            entry[1].append(f"{request_id} ({cause})" if not entry[1] and cause != key[2]
                            else str(request_id))

    def lines(self) -> list[tuple[str, int, str]]:
        """``(logger name, level, line)`` per cause, in first-seen order."""
        out = []
        for (name, what, cause, level), (n, ids) in self._causes.items():
            more = ", ..." if n > len(ids) else ""
            out.append((name, level, f"{what} {n:,} request{'s' if n != 1 else ''}: {cause}; "
                                     f"first: {', '.join(ids)}{more}"))
        return out

    def flush(self) -> None:
        """Log one line per cause (on the logger that noted it) and start over."""
        for name, level, line in self.lines():
            logging.getLogger(name).log(level, "%s", line)
        self._causes.clear()

    def reset(self) -> None:
        self._causes.clear()


TALLY = Tally()
note = TALLY.note
flush = TALLY.flush
reset = TALLY.reset
