"""Logging that a flood cannot turn into a flood of log lines."""

from __future__ import annotations

import logging
import time
from typing import Callable


class RateLimitedLog:
    """At most one line per key and interval; the lines held back are counted in the next."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # key -> (logged at, held back since)

    def log(self, level: int, key: str, msg: str, *args, exc_info: bool = False) -> None:
        now = self.clock()
        at, held = self._last.get(key, (None, 0))
        if at is not None and now - at < self.interval_s:
            self._last[key] = (at, held + 1)
            return
        if held:
            msg += " (%d more like it in the last %.0fs)"
            args = (*args, held, now - at)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        self._last[key] = (now, 0)
