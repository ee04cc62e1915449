"""Rate limits against floods: of log lines (RateLimitedLog), and of what tenants send
(TokenBuckets: exec events per uid, reports per uid and per job)."""

from __future__ import annotations

import logging
import time
from typing import Callable, Hashable


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


class TokenBuckets:
    """A token bucket per key (a uid, a job): ``per_s`` a second, as many at once.

    At most ``most_keys`` buckets are kept: past it, the full ones (the same as none)
    are forgotten, so a flood of new keys costs no more than the keys spending now."""

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic, *, most_keys: int = 4096):
        if not per_s > 0:
            raise ValueError(f"a rate must be above 0, not {per_s!r}")
        self.per_s = per_s
        self.clock = clock
        self.most_keys = most_keys
        self._buckets: dict[Hashable, list[float]] = {}  # key -> [tokens, at]

    def take(self, key: Hashable) -> bool:
        """One token of ``key``'s, if it has one."""
        return self.wait(key) == 0.0

    def wait(self, key: Hashable) -> float:
        """0.0, taking one of ``key``'s tokens; else the seconds until it has one (nothing taken)."""
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.most_keys:
                self._forget_full(now)
            bucket = self._buckets[key] = [self.per_s, now]
        tokens = min(self.per_s, bucket[0] + (now - bucket[1]) * self.per_s)
        bucket[1] = now
        if tokens < 1:
            bucket[0] = tokens
            return (1 - tokens) / self.per_s
        bucket[0] = tokens - 1
        return 0.0

    def _forget_full(self, now: float) -> None:
        self._buckets = {k: b for k, b in self._buckets.items() if b[0] + (now - b[1]) * self.per_s < self.per_s}
