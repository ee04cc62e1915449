"""Holding one job at a bandwidth cap with the MB values a host has (issue #27, item 3).

Every period (sub-second: ``DEFAULT_PERIOD_S``) the caller measures the job's bandwidth
from MBM over the period it just held and asks ``CapController.update`` what to hold next.
The answer is a ``Hold``: a lower MB value, and a higher one for a share of the period,
because the values that exist rarely give the cap itself (ten steps on Intel, coarser still
where the part quantises), and MBA acts on each request at once, so holding two values
for parts of a period gives the bandwidth between them over that period.

How it chooses (one concept each):

* It learns the job's value -> bandwidth curve as it runs, per number of busy threads
  (``LevelCurve``): one MB value gives bandwidth in proportion to busy threads.
* It never asks for more than the curve's upper bound allows: the next value is the largest
  whose upper bound (``LevelCurve.upper``: monotone, concave) is at or below the target, so
  a value it has not measured is approached from below, not overshot.
* The target is the cap plus an integral of the error, clamped to 5 % of the cap, fed only
  near the cap (within 10 %) and reset while the hold is pinned at either end of the scale
  or the curve has just moved (anti-windup): what the curve cannot explain (a bias in the
  mix) it takes out over a few periods; what it can, it learns.
* A period that mixes two values tells about one of them (the one measured longer ago):
  a small correction so learned is taken by half (the other value's own error is in it,
  and taken whole it goes back and forth between the two points and grows while demand
  ramps); a higher value found to pass no more than the lower one says the lower point is
  wrong: the next period holds the lower value alone to measure it (below the cap, never
  above it).
* What a period held is what the holder's writes really held where it says so
  (``in_force``: a starved holder switches late), not the plan: each value's share as it
  was in force, a value of the last plan still in force at the start taken out at its
  point. A period not held as planned feeds no integral: its error is the timing's, which
  the holder pays back itself (noded.capping.owed).
* On AMD the value is an absolute limit per thread (1/8 GB/s): the first guess is the cap
  divided over the busy threads, then MBM corrects it like any other point.
* Below the lowest value's bandwidth nothing here can meet the cap: ``Hold.unreachable``
  says so (fewer cores is the only lever left; the CPU owner writes those).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Mapping

from noded.capping.curve import LevelCurve

DEFAULT_PERIOD_S = 0.1
MIN_PROBE_SHARE = 0.1  # of a period, on a value never measured: less says too little through noisy counters
AMD_UNIT_BYTES = 125_000_000  # 1/8 GB/s, AMD's MB unit
MIX_DAMP_WITHIN = 0.05  # a point's correction from a mixed period this small is taken by half
#: a period whose higher value was in force within this share of its plan was held as planned
AS_PLANNED_WITHIN = 0.05


@dataclass(frozen=True)
class Hold:
    """What to hold for one period: ``high`` for ``high_share`` of it, then ``low``."""

    low: int
    high: int
    high_share: float = 0.0
    unreachable: bool = False

    @property
    def values(self) -> list[tuple[int, float]]:
        """(MB value, share of the period), the higher first."""
        if self.high_share <= 0 or self.high == self.low:
            return [(self.low, 1.0)]
        if self.high_share >= 1:
            return [(self.high, 1.0)]
        return [(self.high, self.high_share), (self.low, 1.0 - self.high_share)]


def _high_share(hold: Hold) -> float:
    """The share of a period ``hold`` holds its higher value."""
    parts = hold.values
    if len(parts) == 2:
        return parts[0][1]
    return 1.0 if parts[0][0] == hold.high != hold.low else 0.0


class CapController:
    """Steers one job's MB value so its bandwidth holds at ``cap_bps``."""

    def __init__(self, values: list[int], cap_bps: float, *, absolute_unit_bytes: float | None = None,
                 integral_gain: float = 0.5, integral_limit: float = 0.05):
        if not values or sorted(set(values)) != list(values):
            raise ValueError("values must be the host's MB values, ascending, without repeats")
        if cap_bps <= 0:
            raise ValueError(f"a cap must be a positive bandwidth, got {cap_bps!r} bytes/s")
        self.values = list(values)
        self.cap = cap_bps
        self.absolute_unit = absolute_unit_bytes  # AMD: bytes/s per unit per thread
        self.gain = integral_gain
        self.limit = integral_limit * cap_bps
        self.integral = 0.0
        self.curves: dict[int, LevelCurve] = {}
        self.threads = 0
        self._remeasure = False  # the last period contradicted the curve: hold the lower value alone
        self._last: Hold | None = None
        self._target = cap_bps  # what the last hold was chosen for

    def set_cap(self, cap_bps: float) -> None:
        if cap_bps <= 0:
            raise ValueError(f"a cap must be a positive bandwidth, got {cap_bps!r} bytes/s")
        self.limit *= cap_bps / self.cap  # the clamp is a share of the cap
        self.cap = cap_bps
        self.integral = 0.0

    def _curve(self, threads: int) -> LevelCurve:
        threads = max(1, threads)
        curve = self.curves.get(threads)
        if curve is None:
            known = min(self.curves, key=lambda n: abs(n - threads), default=None)
            curve = self.curves[threads] = (self.curves[known].seeded_for(threads / known)
                                            if known is not None else LevelCurve())
        self.threads = threads
        return curve

    def update(self, measured_bps: float, busy_threads: int, held: Hold,
               in_force: Mapping[int, float] | None = None, *, learn: bool = True,
               makeup_bps: float = 0.0) -> Hold:
        """The job moved ``measured_bps`` over the period it held ``held``: what next.
        ``in_force``: each MB value's share of that period as the holder's writes really
        landed (noded.capping.in_force), where it knows them; else the plan's shares.
        ``learn=False``: the period is not learned from (when its values changed is too
        little known), only the next hold chosen. ``makeup_bps``: added to the target for
        the next period (the holder's account of the bytes its job moved against the cap,
        noded.capping.account: negative pays back what went over)."""
        curve = self._curve(busy_threads)
        learnt = self._as_held(curve, measured_bps, held, in_force) if learn else None
        moved = learnt is not None and self._learn(curve, learnt[1], learnt[0], busy_threads)
        pinned = (held.low == held.high == self.values[0] and measured_bps > self.cap) or \
                 (held.low == self.values[-1] and measured_bps < self.cap)
        if moved or pinned:
            self.integral = 0.0  # anti-windup: the curve took the change, or the scale ran out
        elif abs(self.cap - measured_bps) > 0.1 * self.cap:
            pass  # far from the cap: the curve's error to learn, not a bias to integrate
        elif learnt is None or abs(_high_share(learnt[0]) - _high_share(held)) > AS_PLANNED_WITHIN:
            # not held as planned (a starved holder's late switch, or what it paid back of
            # one): the error is the timing's, which the holder pays back itself
            # (noded.capping.owed); integrated, the periods that overran would count and
            # those that paid back (far below the cap) would not
            pass
        else:
            self.integral = max(-self.limit, min(self.limit, self.integral + self.gain * (self.cap - measured_bps)))
        self._target = max(0.0, self.cap + self.integral + makeup_bps)
        self._last = self._choose(curve, self._target)
        return self._last

    def _as_held(self, curve: LevelCurve, measured: float, held: Hold,
                 in_force: Mapping[int, float] | None) -> tuple[Hold, float] | None:
        """The period as it really was: ``held``'s two values at the shares they were in force,
        and what the job moved at them. A value of another plan in force for part of it (the
        last period's, until this one's first write landed) is taken out at what its curve
        says; where the curve has no point for it, the period teaches nothing (None)."""
        if in_force is None:
            return held, measured
        others = {v: s for v, s in in_force.items() if v not in (held.low, held.high) and s > 0}
        if any(v not in curve.points for v in others):
            return None
        rest = 1.0 - sum(others.values())
        if rest < MIN_PROBE_SHARE:
            return None  # the plan was barely in force: its values' shares say too little
        measured = max(0.0, (measured - sum(s * curve.points[v] for v, s in others.items())) / rest)
        high_share = in_force.get(held.high, 0.0) / rest if held.high != held.low else 0.0
        return Hold(held.low, held.high, min(1.0, high_share), held.unreachable), measured

    def _learn(self, curve: LevelCurve, measured: float, held: Hold, threads: int) -> bool:
        """Fold the period into the curve; True where the curve moved by more than noise."""
        parts = held.values
        if self.absolute_unit and not curve.points:
            self._seed_absolute(curve, measured, threads, held)
        if len(parts) == 1:
            value, learned = parts[0][0], measured
        else:
            # Two values, the lower one measured before (it was chosen for that): the period
            # tells about the one measured longer ago (the higher one if never), within a
            # quarter above what this job has been seen to move (a small share of a period
            # magnifies the counters' noise). Far from what the curve predicted, demand has
            # moved: the next period holds the lower value alone, to measure it afresh.
            (high, share), (low, _) = parts
            if low not in curve.points:
                return False
            at_low, top = curve.points[low], max(curve.points.values())
            at_high = curve.points.get(high)
            if at_high is not None:
                predicted = share * at_high + (1 - share) * at_low
                self._remeasure = predicted > 0 and abs(measured / predicted - 1) > 0.05
            if at_high is None or curve.age(high) <= curve.age(low):
                if share < MIN_PROBE_SHARE:
                    return False
                value = high
                raw = (measured - (1 - share) * at_low) / share
                if at_high is not None and raw <= at_low:
                    # the higher value giving no more than the lower: the lower one's point is
                    # what is wrong (a share of a period magnifies its error into the higher's);
                    # measure it alone next, learn nothing from this period
                    self._remeasure = True
                    return False
                learned = min(max(at_low, raw), 1.25 * max(top, measured))
            else:
                if 1 - share < MIN_PROBE_SHARE:
                    # the lower value barely in force (a starved holder's late switch back):
                    # the counters' noise and the higher value's error, magnified, would be all
                    # it learned
                    return False
                value = low
                learned = min(max(0.0, (measured - share * at_high) / (1 - share)), at_high)
        before = curve.points.get(value)
        if len(parts) > 1 and before and abs(learned / before - 1) <= MIX_DAMP_WITHIN:
            # a small correction from a mixed period: half of it (the other value's own error
            # is in it too; taken whole, each period's share of it goes back and forth between
            # the two points and grows); from a point of 0 (nothing moved there) none is small
            learned = before + 0.5 * (learned - before)
        curve.learn(value, learned)
        return before is not None and before > 0 and abs(learned / before - 1) > 0.05

    def _seed_absolute(self, curve: LevelCurve, measured: float, threads: int, held: Hold) -> None:
        # AMD: a value is a limit per thread, so the job's bandwidth is threads x value x unit
        # up to what it demands (measured unthrottled): the curve's first shape, from the docs.
        unit = self.absolute_unit
        assert unit is not None
        curve.points[self.values[0]] = threads * self.values[0] * unit
        if held.low == self.values[-1]:
            saturating = self.values[min(len(self.values) - 1,
                                         bisect.bisect_left(self.values, measured / (threads * unit)))]
            curve.points[saturating] = measured

    def _choose(self, curve: LevelCurve, target: float) -> Hold:
        # The bandwidth a value gives at most. Intel: no value passes nothing, but a throttle's
        # curve bends through 0 (concave); AMD: linear in the value, as documented.
        if self.absolute_unit:
            bound = curve.interpolate
        else:
            def bound(v: int) -> float:
                return curve.upper(v, True)
        if self._remeasure and self._last is not None:
            self._remeasure = False
            return Hold(self._last.low, self._last.low)
        known_low = max((v for v, b in curve.points.items() if b <= target), default=None)
        if known_low is None:
            low = self.values[0]
            # nothing lower to try; unreachable where even that passes more than the cap (not
            # merely more than a target lowered to pay back an overrun)
            return Hold(low, low, unreachable=low in curve.points and curve.points[low] > self.cap + self.integral)
        # The largest value that cannot pass more than the target, measured or not.
        guess = max((v for v in self._candidates(curve) if bound(v) <= target), default=known_low)
        if guess > known_low and guess not in curve.points:
            if self.absolute_unit:
                return Hold(guess, guess)  # the documented linear limit: hold it, then correct
            high = guess  # tried for a share of the period the cap can afford even if it is far off
        elif known_low == self.values[-1]:
            return Hold(known_low, known_low)
        else:
            high = self.values[self.values.index(known_low) + 1]
        at_low = curve.points[known_low]
        at_high = curve.points.get(high)
        if at_high is None:  # unmeasured: assume the most this job has been seen to move
            at_high = max(max(curve.points.values()), at_low)
            if at_high <= at_low and not self.absolute_unit and bound(high) < float("inf"):
                # nothing higher seen (a curve cleared or first learned at its lowest value):
                # the most a concave throttle lets it pass there, so it is tried from below
                # rather than never
                at_high = bound(high)
        if at_high <= at_low:
            return Hold(known_low, known_low)
        share = max(0.0, min(1.0, (target - at_low) / (at_high - at_low)))
        if high not in curve.points:
            share = max(share, MIN_PROBE_SHARE)  # enough of it to learn what it gives
        return Hold(known_low, high, share if share >= 0.02 else 0.0)

    def _candidates(self, curve: LevelCurve) -> list[int]:
        """Values worth testing: all of them on a short scale; on AMD's 2049, the measured
        ones and the straight-line guesses between each pair around the target."""
        if len(self.values) <= 64:
            return self.values
        xs = sorted(curve.points) or [self.values[0]]
        picks = set(xs) | {self.values[0]}
        for a, b in zip(xs, xs[1:]):
            ya, yb = curve.points[a], curve.points[b]
            if ya < self._target <= yb and yb > ya:
                guess = a + (self._target - ya) * (b - a) / (yb - ya)
                i = bisect.bisect_right(self.values, guess) - 1
                picks.add(self.values[max(0, i)])
        return sorted(picks)


class KernelStyleController:
    """The kernel's mba_MBps controller (update_mba_bw) run over any scale: once a second,
    one step down when above the target, one step up when the target is above what it
    measured scaled by (value + first step) / value. The baseline the benchmark compares to."""

    period_s = 1.0

    def __init__(self, values: list[int], cap_bps: float):
        self.values = list(values)
        self.cap = cap_bps

    def update(self, measured_bps: float, busy_threads: int, held: Hold) -> Hold:
        i = self.values.index(held.low)
        current, floor = self.values[i], self.values[0] or self.values[1]
        if i > 0 and self.cap < measured_bps:
            i -= 1
        elif i < len(self.values) - 1 and self.cap > measured_bps * (current + floor) / current:
            i += 1
        return Hold(self.values[i], self.values[i])
