"""Whether the control loop is alive: what ``/healthz`` answers and a liveness probe asks.

A hung loop (a tick that never returns: a driver call that blocks, a deadlock) still
serves /metrics from its last result, so a probe of /metrics passes and
``noded_ticks_total`` merely stands still. ``Liveness`` is told when the loop starts and
when each round ends (completed or failed: a failing tick is in its own metrics and
alert, and a restart would not mend it, as systemd's watchdog reasons); ``check`` says
why the loop is stalled, or None. Stalled is no round for ``STALE_PERIODS`` tick periods,
and never less than ``MIN_STALE_S``: a slow round (an overrun) is not a stall.
"""

from __future__ import annotations

import time
from typing import Callable

from noded.util.ages import format_age

#: rounds a loop may miss before it counts as stalled
STALE_PERIODS = 10
#: ... and never sooner than this (a 0.1 s tick still gets a few seconds)
MIN_STALE_S = 5.0


class Liveness:
    def __init__(self, clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        self.clock = clock
        self.wall_clock = wall_clock
        self.started: float | None = None  # when the loop started (clock)
        self.last_round: float | None = None  # when its last round ended (clock)
        #: the wall-clock time of that, for noded_last_tick_timestamp_seconds (time() - it in PromQL)
        self.last_round_wall: float | None = None
        self.period_s = 1.0

    def loop_started(self, period_s: float) -> None:
        self.started, self.period_s = self.clock(), period_s

    def round_ended(self, period_s: float) -> None:
        self.last_round, self.last_round_wall, self.period_s = self.clock(), self.wall_clock(), period_s

    def stale_after_s(self) -> float:
        return max(MIN_STALE_S, STALE_PERIODS * self.period_s)

    def check(self) -> str | None:
        """Why the loop is not alive now, or None while it is."""
        if self.started is None:
            return "the control loop has not started"
        since = self.last_round if self.last_round is not None else self.started
        age = self.clock() - since
        limit = self.stale_after_s()
        if age <= limit:
            return None
        what = "its last round ended" if self.last_round is not None else "it started, with no round ended since,"
        return (f"the control loop is stalled: {what} {format_age(age)} ago, more than {format_age(limit)} "
                f"({STALE_PERIODS} tick periods of {self.period_s:g}s, at least {MIN_STALE_S:g}s)")

    def describe(self) -> str:
        """A healthy loop, in words."""
        if self.last_round is None:
            return "the control loop has started; no round has ended yet"
        return f"the control loop's last round ended {format_age(self.clock() - self.last_round)} ago"
