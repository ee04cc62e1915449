"""The search that measures the top first: the fewest cores within the margin of the top.

CODA's greedy walk compares each step with the last point kept, so any pause, dip or
plateau in a job's curve ends it (issue #23). This search compares every point with the
*top*: the best throughput measured, which it measures first, at the most cores the job may
have (its share). Then it bisects 1..bound for the fewest cores whose throughput is within
the margin of the top; a pause or a dip below the answer cannot stop it, because no
decision compares two neighbours. Every decision is re-derived from all the points
measured, so a point that beats the top (a curve that peaks and declines) makes it the new
top and the classification of every point follows.

**Within the margin** means: the point's measured mean is at least ``1 - margin`` of the
top's measured mean, where a point measured more than once counts with the mean of its
windows. **The noise in view**: a window's mean has an error the window itself reports
(its confidence interval from the iteration jitter) and one it cannot see (a background
load that comes and goes between windows). Both are estimated from the windows: each
point's own windows' intervals (those of the two points compared, not the widest seen: a
slow point's long window with few samples made every comparison a tie, and its recheck
cost a step), and the spread of the core counts measured more than once, pooled over the
job. When the answer's distance from the margin lies inside the combined interval of the
answer and the top (a *tie*),
the one of the two with fewer windows (the top on equal terms) is measured again before
the search ends, at most ``rechecks`` times per search; what the means say then decides.

**Peaks.** A curve that falls past its best hides the best between measured points: where
the curve rose into the top from the point below by more than the margin, or the point
above falls from it by more than the margin once a point below it is measured, the gap
above the top is halved; where the point above falls and the one below is within twice the
margin, the gap below too (the wider first), until the top's neighbours are measured. A
fall above the top with nothing measured below it is searched below first: the bisection
goes there anyway, and past a peak the windows above it are the slow ones; at 1 core, with
nothing below it to search, above (a remembered answer of 1 measured beside the top alone).

**A peak hidden above the answer.** Three points cannot tell a knee from a peak: where the
curve rises into the answer from the point below so steeply that, continued halfway into a
gap of ``HIDDEN_GAP`` or more cores to the next point measured above, it would pass the top
by more than ``HIDDEN_RISE``, the middle of that gap is measured before the search ends (a
peak at 6 of 8 cores with 4 and 8 measured alike, the answer 4 at 0.86 of the best, with no
window noise at all; the gap is halved again while the rule holds).

**The noise the job shows.** A window's own interval cannot see a load that moves a whole
window (8 % window noise: a standard deviation of 4 % against a 3 % margin, one comparison
in three wrong near the margin). So the top is measured a second time as soon as a point
lies within ``NEAR`` of the margin, before that comparison decides anything (one of the
``rechecks``): from then on every comparison has the spread between windows in view, and
the top, measured twice, is no longer whichever single window came out highest. A search
whose points all lie far from the margin (a cliff, a steep rise) needs no second window.
Where the windows agree (their spread under ``AGREE``, 2.5 %: 0 and 3 % window noise), no
more rechecks are made, which pays for that window; where they do not, one tie more is
measured again before the search ends. Not with a start (``hint``): its own rules decide on
the top and the start, two windows (a remembered answer that holds ends there), and the top
measured again at a slow job's bound could cost the search its time budget.

**A coarser last step.** When the bracket is two core counts, the one below outside the
margin and the upper one measured within it, the upper one is the answer without measuring
the lower: one core more for a step less (the answer is within the margin either way). Not
where the upper one is the top (past a peak the core below the top may be the peak), nor
where a peak may hide above it: the lower one measured tells how steep the rise is.

Where to start: a remembered answer or a category's default (``hint``) is the first point
tried after the top. This job's own remembered answer (``confirm``) holds when it is within
the margin of the top and measures the throughput remembered with it (within twice the
margin and its window's interval): two measurements, either of which could overturn it. The
remembered throughput is what overturns a stale answer (a job that changed speed changed
shape too: peak 281 of the generated curves kept 15 cores at 0.10 of its best on two
measurements alike); it replaced "clearly within the margin, not a tie", which cost a third
measurement where answers usually lie, near the margin. Otherwise, and for an answer
remembered on other GPUs or for the model, its neighbour below is tried next and the search
goes on. A remembered answer measured outside the margin, or away from its remembered
throughput, says the job changed: what it said of fewer cores goes with it, and the
bisection below it starts from its middle.

Everything is pure: points in, a decision out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: an interval of this many standard errors either side (95 %)
Z = 1.96
#: a point outside the margin by at most this share of the top: the curve approaches the
#: margin smoothly there, and a line through it and the point inside says where it crosses
SMOOTH = 0.3
#: a window whose interval is unknown (fewer than 2 samples) counts as this wide
UNKNOWN_WIDTH = 0.5
#: a peak may hide above the answer in a gap of this many cores or more to the next point
HIDDEN_GAP = 3
#: when the rise into the answer, continued halfway into that gap, passes the top by this share
HIDDEN_RISE = 0.10
#: a point this close to the margin (a share of the top, either side) is where a window moved
#: by the largest window noise the search is built for (8 %: 1.96 x 4 % x sqrt 2) could fall
#: on either side
NEAR = 0.10
#: windows at one core count whose spread (a relative standard deviation) is under this
#: agree: a tie is decided by the means, not measured again
AGREE = 0.025


@dataclass(frozen=True)
class Point:
    """What is known at one core count: the mean of ``windows`` window means."""

    cores: int
    mean: float
    windows: int
    error: float = 0.0  # the relative standard error of the mean from its windows' own intervals


@dataclass(frozen=True)
class Decision:
    """Probe ``cores`` next (``answer`` False), or keep them (``answer`` True)."""

    cores: int
    answer: bool
    recheck: bool = False  # the probe measures a core count again


def points_of(measured: tuple[tuple[int, float], ...], bound: int,
              widths: tuple[float, ...] = ()) -> dict[int, Point]:
    """Per core count within ``bound``: the mean of its windows, and that mean's error from
    the windows' own intervals (``widths``, relative half-widths; none given: 0)."""
    sums: dict[int, list[float]] = {}
    squares: dict[int, float] = {}
    for i, (cores, value) in enumerate(measured):
        if cores <= bound:
            sums.setdefault(cores, []).append(value)
            own = min(widths[i], UNKNOWN_WIDTH) / Z if i < len(widths) else 0.0
            squares[cores] = squares.get(cores, 0.0) + own * own
    return {c: Point(c, math.fsum(v) / len(v), len(v), math.sqrt(squares[c]) / len(v)) for c, v in sums.items()}


def window_error(measured: tuple[tuple[int, float], ...], widths: tuple[float, ...]) -> float:
    """One window mean's relative standard error: the larger of what the windows' own
    intervals say (the widest) and the spread of core counts measured more than once."""
    own = max((min(w, UNKNOWN_WIDTH) for w in widths), default=0.0) / Z
    return max(own, between_error(measured))


def between_error(measured: tuple[tuple[int, float], ...]) -> float:
    """The error no window's own interval shows (a load that moves whole windows): the
    spread of the core counts measured more than once, pooled over all of them (0 without)."""
    groups: dict[int, list[float]] = {}
    for cores, value in measured:
        groups.setdefault(cores, []).append(value)
    squares, dof = 0.0, 0
    for values in groups.values():
        if len(values) > 1:
            mean = math.fsum(values) / len(values)
            squares += math.fsum((v / mean - 1) ** 2 for v in values)
            dof += len(values) - 1
    return math.sqrt(squares / dof) if dof else 0.0


def top_of(points: dict[int, Point]) -> Point:
    """The best mean measured (the fewest cores on a tie)."""
    return max(points.values(), key=lambda p: (p.mean, -p.cores))


def within_margin(p: Point, top: Point, margin: float) -> bool:
    return p.mean >= (1 - margin) * top.mean


def confirmed(points: dict[int, Point], hint: int, bound: int, margin: float, error: float, step: int,
              expected: float | None = None) -> bool:
    """A remembered answer holds on two measurements, the top and it, when it measures the
    throughput remembered with it (``expected``, where known), is within the margin of the
    top (a tie too: the remembered throughput is the second look) and the top is not slower
    than it by the margin;
    where the top is (a curve that falls past its best), on a third: the core below it, when
    that is clearly outside the margin (the answer is the peak). Otherwise it is searched:
    a remembered answer further than ``remembers`` from its throughput says the job changed,
    and the shape remembered went with its speed."""
    remembered, at_bound = points[hint], points[bound]
    if expected is not None and not remembers(remembered, expected, margin, error):
        return False
    top = top_of(points)
    within = within_margin(remembered, top, margin)
    if len(points) == 2:
        return within and within_margin(at_bound, remembered, margin)
    below = points.get(hint - step)
    return len(points) == 3 and below is not None and top.cores == hint and within \
        and not within_margin(below, top, margin) and not is_tie(below, top, margin, error)


def remembers(p: Point, expected: float, margin: float, error: float) -> bool:
    """The point measures the throughput remembered for it: within twice the margin, widened
    by its windows' interval (its own and the error between windows)."""
    spread = Z * math.sqrt(p.error ** 2 + error ** 2 / p.windows)
    return abs(p.mean / expected - 1) <= 2 * margin + spread


def is_tie(p: Point, top: Point, margin: float, error: float) -> bool:
    """The point's distance from the margin is inside the two points' combined interval: their
    own windows' errors and ``error``, the error between windows, per window averaged."""
    if p.cores == top.cores:
        return False
    spread = Z * math.sqrt(p.error ** 2 + top.error ** 2 + error ** 2 * (1 / p.windows + 1 / top.windows))
    return abs(p.mean / top.mean - (1 - margin)) <= spread


def near_the_margin(points: dict[int, Point], top: Point, margin: float) -> bool:
    """A point other than the top lies within NEAR of the margin: its comparison with the top
    is one the noise between windows could turn."""
    return any(abs(p.mean / top.mean - (1 - margin)) <= NEAR for p in points.values() if p.cores != top.cores)


def bracket(points: dict[int, Point], top: Point, margin: float) -> tuple[int, int]:
    """(lo, hi): hi the fewest cores measured within the margin, lo one above the most
    cores measured outside it below hi; the answer lies in lo..hi."""
    hi = min(c for c, p in points.items() if within_margin(p, top, margin))
    lo = 1 + max((c for c, p in points.items() if c < hi and not within_margin(p, top, margin)), default=0)
    return lo, hi


def past_the_peak(points: dict[int, Point], top: Point, margin: float) -> int | None:
    """Where a peak may hide beside the top. Above it, between the top and the next point
    above, when that point falls from the top by more than the margin, or when the curve
    rises into the top from the point below by more than the margin (it was still rising
    there, and nothing measured above is higher). Below it too, between the top and the
    point below, when the curve falls on the other side (a peak, not a step): the middle of
    the wider of the two gaps, while there is one."""
    above = min((c for c in points if c > top.cores), default=None)
    below = max((c for c in points if c < top.cores), default=None)
    falls = above is not None and not within_margin(points[above], top, margin)
    rises = below is not None and not within_margin(points[below], top, margin)
    gaps = []
    if above is not None and above - top.cores >= 2 and (rises or (falls and (below is not None or top.cores == 1))) \
            and not peak_bounded(points, top.cores, above, top):
        gaps.append((above - top.cores, (top.cores + above) // 2))
    if below is not None and top.cores - below >= 2 and falls and within_margin(points[below], top, 2 * margin) \
            and not peak_bounded(points, below, top.cores, top):
        gaps.append((top.cores - below, (top.cores + below + 1) // 2))
    return max(gaps)[1] if gaps else None


def peak_bounded(points: dict[int, Point], left: int, right: int, top: Point) -> bool:
    """No peak above the top can hide between ``left`` and ``right`` (two points measured
    with nothing between): the line through ``left`` and the point measured below it, and
    the line through ``right`` and the point measured above it, extended into the gap, meet
    nowhere above the top. A rise that slows and a fall past a peak stay under those lines
    (a concave curve lies under its chords' extensions); without two points on each side
    nothing bounds the gap. The gap above a knee that falls past it was halved down to one
    core, 1.7-2.2 probes a run on 16 cores, where these lines had long said nothing there
    could beat the top."""
    measured = sorted(points)
    i, j = measured.index(left), measured.index(right)
    if i == 0 or j + 1 >= len(measured):
        return False
    outer_left, outer_right = measured[i - 1], measured[j + 1]
    rise = (points[left].mean - points[outer_left].mean) / (left - outer_left)
    fall = (points[outer_right].mean - points[right].mean) / (outer_right - right)
    most = max(min(points[left].mean + rise * (c - left), points[right].mean + fall * (c - right))
               for c in range(left + 1, right))
    return most <= top.mean


def past_the_plateau(points: dict[int, Point], top: Point, margin: float) -> int | None:
    """Where a peak may hide past a plateau: the most cores measured within the margin of
    the top, when that is not the top itself and the next point measured above falls outside
    the margin, two or more cores further: the middle of that gap. On a plateau the top is
    whichever point the noise favoured; the rule past the peak looks beside the top only, so
    a plateau at 4-13 cores measured at 4, 8 and 16 (a peak at 14-15, 16 falling) ended at 4,
    0.75 of the best, whenever 4 read above 8 (generated mixture 2459, 3 % window noise)."""
    inside = max(c for c, p in points.items() if within_margin(p, top, margin))
    above = min((c for c in points if c > inside), default=None)
    if inside == top.cores or above is None or above - inside < 2 or within_margin(points[above], top, margin):
        return None
    return (inside + above) // 2


def hidden_peak(points: dict[int, Point], top: Point, answer: int) -> int | None:
    """The middle of the gap above ``answer`` when a peak may hide there: the rise into the
    answer from the point below, continued to that middle, passes the top by more than
    HIDDEN_RISE (a curve that still climbs that fast has not levelled off yet, or only just)."""
    above = min((c for c in points if c > answer), default=None)
    below = max((c for c in points if c < answer), default=None)
    if above is None or below is None or above - answer < HIDDEN_GAP:
        return None
    middle = (answer + above) // 2
    at = points[answer].mean
    slope = (at - points[below].mean) / (answer - below)
    return middle if at + slope * (middle - answer) > (1 + HIDDEN_RISE) * top.mean else None


def split(points: dict[int, Point], top: Point, margin: float, lo: int, hi: int) -> int:
    """The next core count to try in lo..hi-1: where the line between the point outside the
    margin below (lo - 1) and the one inside (hi) crosses the margin, rounded up (a smooth
    curve's answer in one or two tries), kept within the middle half of the range (a step
    or a cliff still halves it); the middle without a point below."""
    middle = (lo + hi) // 2
    failed = points.get(lo - 1)
    bar = (1 - margin) * top.mean
    if failed is None or hi - lo < 3 or failed.mean < bar - SMOOTH * top.mean:
        return middle  # far below the margin: a step or a cliff as likely as a slope
    rise = points[hi].mean - failed.mean
    if rise <= 0:
        return middle
    guess = math.ceil((lo - 1) + (bar - failed.mean) / rise * (hi - lo + 1))
    quarter = (hi - lo) // 4
    return min(max(guess, lo + quarter), hi - 1 - quarter)


def decide(measured: tuple[tuple[int, float], ...], widths: tuple[float, ...], bound: int, margin: float,
           hint: int | None = None, neighbour: bool = False, rechecks: int = 2, step: int = 1,
           rechecked: int = 0, confirm: bool = False, expected: float | None = None) -> Decision:
    """The next probe or the answer. ``measured``: (cores, mean) in the order measured;
    ``widths``: each window's relative half-width; ``bound``: the most cores now; ``hint``:
    the first core count to try after the top; ``neighbour``: then its neighbour below
    (``step`` fewer) before bisecting; ``rechecked``: re-measurements made so far;
    ``confirm``: the hint is this job's own remembered answer, kept when the top and it are
    all that is measured and it is within the margin of the top; ``expected``: the
    throughput remembered with it (None: not known), which it must measure again (else the
    job changed: the answer is overturned)."""
    points = points_of(measured, bound, widths)
    if bound not in points:
        return Decision(bound, False)
    top = top_of(points)
    error = between_error(measured)
    if confirm and hint is not None and hint in points and confirmed(points, hint, bound, margin, error, step,
                                                                          expected):
        return Decision(hint, True)
    if hint is None and rechecked == 0 and rechecked < rechecks and near_the_margin(points, top, margin):
        return Decision(top.cores, False, recheck=True)  # the noise the job shows, before it decides
    if rechecked >= 1 and error < AGREE:
        rechecks = min(rechecks, rechecked)  # its windows agree: a tie is decided by the means
    peak = past_the_peak(points, top, margin)
    if peak is None:
        peak = past_the_plateau(points, top, margin)
    if peak is not None and neighbour and top.cores == hint:
        # a remembered answer that is the top: a peak above it is looked for one step up only
        # (the search that found it looked there); higher, the answer is overturned and searched
        up = hint + step
        peak = up if up < min((c for c in points if c > hint), default=bound + 1) and up not in points else None
    if peak is not None:
        return Decision(peak, False)
    overturned = neighbour and hint is not None and hint in points and (
        not within_margin(points[hint], top, margin)
        or (expected is not None and not remembers(points[hint], expected, margin, error)))
    if overturned and hint > 1 and not any(c < hint for c in points):
        # a remembered answer outside the margin: the job changed, and what the answer said
        # of fewer cores (all slower) went with it: below it, a bisection's first split
        return Decision((hint + 1) // 2, False)
    if overturned and hint == 1 and len(points) == 2 and bound - hint >= 2:
        # a remembered 1 core that measures alike with the top but not its remembered speed:
        # nothing below to search, and the two ends alike can hide a peak: the middle, once
        return Decision((hint + bound) // 2, False)
    lo, hi = bracket(points, top, margin)
    if hi - lo == 1 and lo > 1 and hi != top.cores and hidden_peak(points, top, hi) is None:
        lo = hi  # a core more for a step less: see "A coarser last step"
    if lo < hi:
        if hint is not None and lo <= hint < hi and hint not in points:
            return Decision(hint, False)
        below = hint - step if hint is not None else None
        if neighbour and hint == hi and below is not None and lo <= below < hi and below not in points:
            return Decision(below, False)
        return Decision(split(points, top, margin, lo, hi), False)
    # lo == hi: the answer, unless a peak may hide above it, or a tie decided it and a recheck is left
    hidden = hidden_peak(points, top, hi)
    if hidden is not None:
        return Decision(hidden, False)
    if rechecked < rechecks:
        p = points[hi]
        if is_tie(p, top, margin, error):
            again = top if top.windows <= p.windows else p
            return Decision(again.cores, False, recheck=True)
    return Decision(hi, True)
