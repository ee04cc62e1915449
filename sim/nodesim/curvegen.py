"""A seeded random family of throughput-vs-cores curves that nobody tuned a search to.

``curves.py`` holds the paper's shapes, written by the same hands as the allocator; a
search that does well on them only shows it fits the paper. This module draws curves of
every shape an operator's jobs could have (issue #23), from a seed, so the benchmark reports
distributions over many draws and property tests (hypothesis) can draw shapes of their own:

* ``knee``: CODA's shape, a rise to a knee, flat or slightly falling past it;
* ``stairs``: monotone with pauses (rises, flat for a few cores, rises again);
* ``dip``: monotone except a dip of some depth at some place (an SMT or NUMA boundary);
* ``plateaus``: jumps between plateaus at several heights;
* ``cliff``: flat from some core count up, far lower at and below the one before;
* ``slow_slope``: a gentle rise of 1-3 % a core all the way (no knee);
* ``linear``: throughput proportional to the cores up to the top (no knee);
* ``peak``: a rise to a peak and a steady decline past it;
* ``flat``: GPU-bound, one core is enough;
* ``mixture``: a knee, stairs or a slope with a dip and a pause laid over it.

A curve is its relative throughput at 1..max_cores (the best is 1.0, so at 1 iteration/s at
the best one iteration lasts ``1 / share(cores)`` seconds), optionally a second curve it
changes to ``change_after_s`` into the run (its data pipeline, batch size or input changed),
and its noise: ``window_noise``, the largest relative error of one measurement window's mean
(a factor drawn once per window: background load that comes and goes; 95 % of windows fall
within it, none outside), and ``jitter``, the relative standard deviation of one iteration
time around that. Everything is a pure function of the seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KNEE = "knee"
STAIRS = "stairs"
DIP = "dip"
PLATEAUS = "plateaus"
CLIFF = "cliff"
SLOW_SLOPE = "slow_slope"
LINEAR = "linear"
PEAK = "peak"
FLAT = "flat"
MIXTURE = "mixture"
CLASSES = (KNEE, STAIRS, DIP, PLATEAUS, CLIFF, SLOW_SLOPE, LINEAR, PEAK, FLAT, MIXTURE)

#: the benchmark's oracle: the fewest cores within this share of the best true throughput
ORACLE_WITHIN = 0.03
#: no curve is slower than this share of its best anywhere (a job on one core of 16 that ran
#: 50x slower would take minutes per iteration, and a window then measures almost nothing)
MIN_SHARE = 0.1
#: per-iteration jitter is drawn in this range (relative standard deviation)
JITTER = (0.01, 0.05)


@dataclass(frozen=True)
class GeneratedCurve:
    """One drawn curve. ``values[c - 1]``: the throughput at ``c`` cores as a share of the
    best (max 1.0). ``after``: the curve after ``change_after_s`` seconds (None: no change)."""

    name: str
    shape: str
    values: tuple[float, ...]
    window_noise: float = 0.0
    jitter: float = 0.0
    peak: float = 1.0  # iterations/s at the best, relative to the first curve's
    after: "GeneratedCurve | None" = None
    change_after_s: float | None = None

    @property
    def max_cores(self) -> int:
        return len(self.values)

    def share(self, cores: int) -> float:
        return self.values[min(max(cores, 1), self.max_cores) - 1]

    def at(self, t: float) -> "GeneratedCurve":
        """The curve in force ``t`` seconds into the run."""
        if self.after is not None and self.change_after_s is not None and t >= self.change_after_s:
            return self.after
        return self

    def oracle(self, within: float = ORACLE_WITHIN) -> int:
        """The fewest cores within ``within`` of the best true throughput."""
        bar = (1 - within) * max(self.values)
        return next(c for c, v in enumerate(self.values, 1) if v >= bar)

    def iteration_time(self, cores: int, window_factor: float, rng: random.Random) -> float:
        """One iteration's seconds at ``cores`` in a window whose mean is off by ``window_factor``."""
        mean = 1.0 / (self.peak * self.share(cores) * window_factor)
        return mean * max(0.2, 1.0 + self.jitter * rng.gauss(0.0, 1.0))

    def window_factor(self, rng: random.Random) -> float:
        """One window's throughput factor: 1 +- window_noise, 95 % within it (normal, cut there)."""
        if self.window_noise <= 0:
            return 1.0
        return window_factor_of(self.window_noise, rng.gauss(0.0, 1.0))


def window_factor_of(window_noise: float, z: float) -> float:
    """The window factor a standard normal draw ``z`` gives: half the noise a standard
    deviation, cut at the noise (nodesim.window_odds draws the same in bulk)."""
    return 1.0 + window_noise * max(-1.0, min(1.0, 0.5 * z))


def _normalise(raw: list[float]) -> tuple[float, ...]:
    top = max(raw)
    return tuple(round(max(MIN_SHARE, v / top), 6) for v in raw)


def _rise(rng: random.Random, n: int, knee: int, at_one: float, bend: float) -> list[float]:
    """A rise from ``at_one`` at 1 core to 1.0 at ``knee`` (``bend`` < 1 saturating), flat past it."""
    out = []
    for c in range(1, n + 1):
        if c >= knee:
            out.append(1.0)
        else:
            x = (c - 1) / max(1, knee - 1)
            out.append(at_one + (1 - at_one) * x ** bend)
    return out


def _knee(rng, n):
    knee = rng.randint(1, n)
    raw = _rise(rng, n, knee, rng.uniform(0.1, 0.9), rng.uniform(0.5, 1.0))
    fall = rng.choice((0.0, rng.uniform(0.0, 0.02)))
    return [v if c <= knee else 1.0 - fall * (c - knee) for c, v in enumerate(raw, 1)]


def _stairs(rng, n):
    steps = rng.randint(2, 4)
    edges = sorted(rng.sample(range(1, n + 1), min(n, steps)))
    heights = sorted(rng.uniform(0.2, 0.95) for _ in edges[:-1]) + [1.0]
    base = rng.uniform(0.15, heights[0] * 0.8)
    out, level = [], base
    for c in range(1, n + 1):
        for e, h in zip(edges, heights):
            if c >= e:
                level = h
        out.append(level if c >= edges[0] else base * c / edges[0])
    return out


def _dip(rng, n, raw=None):
    raw = raw or _rise(rng, n, rng.randint(2, n), rng.uniform(0.1, 0.7), rng.uniform(0.5, 1.0))
    where = rng.randint(2, n)
    width = rng.randint(1, 2)
    depth = rng.uniform(0.05, 0.4)
    return [v * (1 - depth) if where <= c < where + width else v for c, v in enumerate(raw, 1)]


def _plateaus(rng, n):
    count = rng.randint(2, 3)
    edges = sorted(rng.sample(range(2, n + 1), min(n - 1, count)))
    heights = sorted(rng.uniform(0.2, 0.9) for _ in edges[:-1]) + [1.0]
    first = rng.uniform(0.1, heights[0])
    out = []
    for c in range(1, n + 1):
        h = first
        for e, height in zip(edges, heights):
            if c >= e:
                h = height
        out.append(h)
    return out


def _cliff(rng, n):
    edge = rng.randint(2, n)
    low = rng.uniform(0.3, 0.7)
    return [1.0 if c >= edge else low * (0.9 + 0.1 * c / edge) for c in range(1, n + 1)]


def _slow_slope(rng, n):
    slope = rng.uniform(0.01, 0.03)
    return [1.0 - slope * (n - c) for c in range(1, n + 1)]


def _linear(rng, n):
    return [c / n for c in range(1, n + 1)]


def _peak(rng, n):
    top = rng.randint(1, n)
    raw = _rise(rng, n, top, rng.uniform(0.2, 0.9), rng.uniform(0.6, 1.0))
    fall = rng.uniform(0.02, 0.10)
    return [v if c <= top else 1.0 - fall * (c - top) for c, v in enumerate(raw, 1)]


def _flat(rng, n):
    return [1.0 - rng.uniform(0.0, 0.005) for _ in range(n)]


def _mixture(rng, n):
    base = rng.choice((_knee, _slow_slope, _stairs))(rng, n)
    raw = _dip(rng, n, base)
    if rng.random() < 0.5:  # and a pause: hold the level for a few cores, then go on
        at = rng.randint(1, n)
        hold = rng.randint(1, 3)
        raw = [raw[at - 1] if at <= c < at + hold else v for c, v in enumerate(raw, 1)]
    return raw


_MAKERS = {KNEE: _knee, STAIRS: _stairs, DIP: _dip, PLATEAUS: _plateaus, CLIFF: _cliff,
           SLOW_SLOPE: _slow_slope, LINEAR: _linear, PEAK: _peak, FLAT: _flat, MIXTURE: _mixture}


def shape(kind: str, max_cores: int, rng: random.Random) -> tuple[float, ...]:
    """The values of one curve of ``kind`` on 1..max_cores, best 1.0."""
    if kind not in _MAKERS:
        raise ValueError(f"no curve shape {kind!r}; known: {', '.join(CLASSES)}")
    if max_cores < 1:
        raise ValueError(f"max_cores must be >= 1, not {max_cores}")
    return _normalise(_MAKERS[kind](rng, max_cores))


def generate(seed: int, max_cores: int, window_noise: float = 0.0, kind: str | None = None,
             change_after_s: float | None = None) -> GeneratedCurve:
    """Curve number ``seed``: its shape drawn from CLASSES in turn (``kind`` fixes it), its
    jitter from JITTER; with ``change_after_s`` it changes then to another drawn curve of
    another class, 1.25-2x faster or slower at its best (so the change shows at any cores)."""
    rng = random.Random(f"curvegen:{seed}:{max_cores}")
    kind = kind or CLASSES[seed % len(CLASSES)]
    values = shape(kind, max_cores, rng)
    jitter = rng.uniform(*JITTER)
    after = None
    if change_after_s is not None:
        other = rng.choice([k for k in CLASSES if k != kind])
        peak = rng.choice((rng.uniform(0.5, 0.8), rng.uniform(1.25, 2.0)))
        after = GeneratedCurve(f"{kind}-{seed}>{other}", other, shape(other, max_cores, rng), window_noise, jitter,
                               peak)
    return GeneratedCurve(f"{kind}-{seed}", kind, values, window_noise, jitter, after=after,
                          change_after_s=change_after_s)


def family(count: int, max_cores: int, window_noise: float = 0.0, first_seed: int = 0) -> list[GeneratedCurve]:
    """``count`` curves in seed order, every class in turn."""
    return [generate(seed, max_cores, window_noise) for seed in range(first_seed, first_seed + count)]
