"""The ``--log`` flag: BLIS's log levels onto the ``blis_simpy`` loggers, on stderr."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("blis_simpy")

#: BLIS's ``--log`` levels (logrus) onto Python logging; any other name is refused.
LOG_LEVELS = {"trace": 5, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
              "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL,
              "panic": logging.CRITICAL}
#: the names ``--log`` shows in its help and its error (``warning`` is taken for ``warn``)
LOG_LEVEL_NAMES = ("trace", "debug", "info", "warn", "error", "fatal", "panic")


def level_problem(level: str) -> str | None:
    """None when ``level`` names a ``--log`` level (any case), else the problem."""
    if level.lower() in LOG_LEVELS:
        return None
    return f"unknown log level {level!r}; valid: {', '.join(LOG_LEVEL_NAMES)}"


def setup_logging(level: str | None) -> None:
    """Route the ``blis_simpy`` loggers to the current stderr at the BLIS ``level``; any
    handler an earlier call installed goes (its stream may be gone: an in-process caller
    such as a test runner swaps stderr between invocations). An unknown level is a
    :class:`~blis_simpy.errors.ConfigError` on ``--log`` (nothing is changed then)."""
    key = (level or "warn").lower()
    problem = level_problem(key if level is None else level)
    if problem:
        from blis_simpy.errors import ConfigError
        raise ConfigError(problem, field="--log")
    for h in [h for h in log.handlers if getattr(h, "_blis_cli", False)]:
        log.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler._blis_cli = True
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(LOG_LEVELS[key])
    log.propagate = False
