"""How long a holder holds a period's higher MB value: its planned share, plus what earlier
periods owe.

A starved holder wakes late and writes late, so a period holds its higher value for less
(a late switch to it) or more (a late switch back) than planned. Timed from when its write
returned, the higher value gets its planned time whenever the holder runs in time; what a
late switch took or added (measured from the holder's own record: from the higher value's
write returning to the lower one's write beginning, the least it was surely in force) is
given back or taken out in the next period, so the job's bandwidth averages to the plan
over a few periods rather than sitting below or above it.

Counted as the least time surely in force, the error that is left (a write's own span) adds
to the higher value's time; the controller learns from the same least time
(noded.capping.in_force), so it takes the higher value's bandwidth as more than it is and
plans less of it: the two errors cancel, and what does not goes under the cap. What is owed
is bounded (``MAX_OWED_SHARE``, ``MAX_AHEAD_SHARE``: less where paying it back goes over the
cap) and forgotten when the pair of values changes (a second at one pair says nothing of
another), so a long stall is not paid back as a burst over the cap.
"""

from __future__ import annotations

#: the most of the higher value owed to the plan, as a share of a period: paid back by
#: holding it longer, over the cap for a while, so no more than half a period
MAX_OWED_SHARE = 0.5
#: the most held beyond the plan, to be taken out: paid back by holding the lower value
#: (under the cap, the safe side), up to a whole period. Where a starved holder can only
#: switch when its CPU quota refills, every period overruns its higher value; whole
#: periods at the lower value now and then are then what brings the mean to the plan.
MAX_AHEAD_SHARE = 1.0


class HighTimeOwed:
    """Seconds of the higher value owed to the plan (negative: held for more than planned)."""

    def __init__(self, period_s: float):
        self.period = period_s
        self.seconds = 0.0
        self._pair: tuple[int, int] | None = None

    def clear(self) -> None:
        """A period held one value: nothing is owed."""
        self.seconds, self._pair = 0.0, None

    def plan(self, high: int, low: int, share: float) -> float:
        """Seconds to hold ``high`` this period (timed from its write returning)."""
        if self._pair != (high, low):
            self.seconds, self._pair = 0.0, (high, low)
        return max(0.0, share * self.period + self.seconds)

    def held_for(self, planned: float, surely: float) -> None:
        """The higher value was planned ``planned`` seconds and surely in force ``surely``."""
        self.seconds = max(-MAX_AHEAD_SHARE * self.period,
                           min(MAX_OWED_SHARE * self.period, planned - max(0.0, surely)))
