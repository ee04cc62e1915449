"""What each MB value gives one job, learned as it runs.

MBA's value is a request to the hardware, not a bandwidth: the same value gives a job
bandwidth in proportion to its busy threads (a limit on each core's requests), parts apply
coarser steps than they accept, and the scale bends (sim/nodesim/resctrl_emulator/mba.py has the
rules and their sources). So the controller keeps, per number of busy threads, the
bandwidth it last measured at each value it held for a whole period, and reads the curve
through them as a monotone function: a larger value never predicts less bandwidth.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class LevelCurve:
    """value -> bytes/s measured there, for one number of busy threads."""

    points: dict[int, float] = field(default_factory=dict)
    learned_at: dict[int, int] = field(default_factory=dict)  # value -> the learn() count when last measured
    _count: int = 0

    def learn(self, value: int, bytes_per_s: float) -> None:
        """A period at ``value`` moved ``bytes_per_s``; points that now contradict
        monotonicity are the stale ones (demand moved): they give way to it."""
        self._count += 1
        self.points[value] = bytes_per_s
        self.learned_at[value] = self._count
        self._make_monotone(value)

    def age(self, value: int) -> int:
        """How recently ``value`` was measured: larger is fresher (0: never, or only seeded)."""
        return self.learned_at.get(value, 0)

    def _make_monotone(self, anchor: int) -> None:
        fresh = self.points[anchor]
        for v in self.points:
            if v < anchor and self.points[v] > fresh:
                self.points[v] = fresh
            elif v > anchor and self.points[v] < fresh:
                self.points[v] = fresh

    def known(self, value: int) -> bool:
        return value in self.points

    def upper(self, value: int, origin: bool = True) -> float:
        """The most bytes/s ``value`` can give, from the points seen: no more than the next
        value up gave, and, a throttle's returns diminishing (a concave curve), no more than
        the line through the two measured values below it (the origin counting as one,
        ``origin``) reaches there. Infinite where nothing bounds it."""
        if value in self.points:
            return self.points[value]
        xs = sorted(self.points)
        ys = [self.points[x] for x in xs]
        if origin and (not xs or xs[0] > 0):
            xs, ys = [0, *xs], [0.0, *ys]
        i = bisect.bisect_left(xs, value)
        bound = ys[i] if i < len(xs) else float("inf")
        if i >= 2 and xs[i - 1] != xs[i - 2]:
            slope = (ys[i - 1] - ys[i - 2]) / (xs[i - 1] - xs[i - 2])
            bound = min(bound, ys[i - 1] + max(0.0, slope) * (value - xs[i - 1]))
        return bound

    def interpolate(self, value: int) -> float:
        """Bytes/s on the straight line between the measured values either side (for a
        knob documented as linear, such as AMD's absolute limit); beyond them, the nearest."""
        if value in self.points:
            return self.points[value]
        xs = sorted(self.points)
        i = bisect.bisect_left(xs, value)
        if i == 0:
            return self.points[xs[0]] if xs else float("inf")
        if i == len(xs):
            return float("inf")
        lo, hi = xs[i - 1], xs[i]
        return self.points[lo] + (self.points[hi] - self.points[lo]) * (value - lo) / (hi - lo)

    def seeded_for(self, ratio: float) -> "LevelCurve":
        """This curve for a job with ``ratio`` times the busy threads: each value is a limit
        per thread, so every point scales with them (a first guess, corrected as measured)."""
        return LevelCurve({v: b * ratio for v, b in self.points.items()})
