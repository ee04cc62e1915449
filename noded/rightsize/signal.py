"""A GPU job's throughput at one core count, measured for just as long as it takes to be sure.

CODA (Sec. VI-F) samples GPU utilisation for a fixed 90 s at every profiling step; Synergy
(Sec. 3.1) trains about 50 iterations (about a minute) per point. Both are longer than a
steady job needs and shorter than a noisy one does. A ``Window`` instead ends as soon as
the mean is known well enough: at least ``min_samples`` samples and a confidence interval
on the mean whose half-width is at most ``tolerance`` of the mean. A job that never gets
that steady is cut off at ``max_window_s`` with the mean it has (marked not steady).

Two inputs give the same answer (CODA V-B: "a DNN training job's GPU utilization rate and
running speed change in a similar trend, and they reach the optimal value at the same CPU
number"):

* ``ITERATION_TIME``: seconds per iteration, from the job's own reports; the window's mean
  is the throughput, iterations/s (1 / the mean iteration time; the relative half-width of
  the two is the same to first order);
* ``GPU_UTILISATION``: the job's GPU utilisation samples (%) from NVML; the mean is the
  utilisation itself.

After a change of cores the first samples describe the old allocation and a restarting
input pipeline (data-loader workers are re-spawned or re-balanced), so a window skips
everything before ``warmup_s`` and the first ``warmup_samples`` after it.

Utilisation samples taken every tick are correlated from one tick to the next, so their
interval is narrower than the truth; ``min_samples`` and a tolerance of a few percent keep
that honest enough to rank neighbouring core counts, which is all the allocator asks.

Everything here is pure: samples come with their time ``t`` and the caller's ``now``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

ITERATION_TIME = "iteration_time"
GPU_UTILISATION = "gpu_utilisation"
KINDS = (ITERATION_TIME, GPU_UTILISATION)


class BadSample(ValueError):
    """A sample that is not a value of its kind (an iteration time must be positive and
    finite, a utilisation within 0..100 %)."""


@dataclass(frozen=True)
class SignalConfig:
    tolerance: float = 0.02  # steady once the interval's half-width is this share of the mean
    confidence: float = 0.95
    min_samples: int = 10
    max_window_s: float = 90.0  # CODA VI-F's profiling step: never measure one point longer
    warmup_s: float = 5.0  # after a change of cores
    warmup_samples: int = 2  # and these many samples after that

    def __post_init__(self):
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), not {self.tolerance}")
        if not 0.5 <= self.confidence <= 0.99:
            raise ValueError(f"confidence must be in [0.5, 0.99], not {self.confidence}")
        # the t quantile below is an expansion that is accurate from 4 degrees of freedom
        if self.min_samples < 5:
            raise ValueError(f"min_samples must be >= 5, not {self.min_samples}")
        if not (self.max_window_s > 0 and self.warmup_s >= 0 and self.warmup_samples >= 0):
            raise ValueError("max_window_s must be > 0, warmup_s and warmup_samples >= 0")
        if self.warmup_s >= self.max_window_s:
            raise ValueError(f"warmup_s ({self.warmup_s}) must be shorter than max_window_s ({self.max_window_s})")


@functools.lru_cache(maxsize=16)
def _normal_quantile(p: float) -> float:
    return NormalDist().inv_cdf(p)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion in 1/df around the normal
    quantile (Abramowitz & Stegun 26.7.5); within 0.5 % of the exact value from df = 4 up to
    p = 0.995 (a two-sided 99 % interval)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, not {df}")
    z = _normal_quantile(p)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


@dataclass(frozen=True)
class Measurement:
    """What a window measured at ``cores``. ``mean``: iterations/s or utilisation %, None when
    no sample arrived; ``steady``: False when it was cut off at the maximum window."""

    cores: int
    mean: float | None
    rel_half_width: float  # inf with fewer than 2 samples
    samples: int
    elapsed_s: float
    steady: bool


@dataclass(frozen=True)
class Window:
    """One measurement at one core count; ``add`` and ``result`` return, never change.

    Running moments (Welford) keep it small and serialisable however long it runs.
    """

    kind: str
    cores: int
    opened_at: float
    skipped: int = 0  # warm-up samples skipped after warmup_s
    n: int = 0
    mean: float = 0.0  # of the raw values (iteration times or utilisations)
    m2: float = 0.0  # sum of squared deviations from the mean
    last_t: float | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, not {self.cores}")

    def add(self, t: float, value: float, config: SignalConfig) -> "Window":
        """The window with the sample (t, value) taken in; warm-up and out-of-order samples
        are dropped. Raises BadSample for a value that is not of the window's kind."""
        _check(self.kind, value)
        if t < self.opened_at + config.warmup_s or (self.last_t is not None and t < self.last_t):
            return self
        # the constructor, not dataclasses.replace: this runs for every report of every job,
        # and replace costs five times as much
        if self.skipped < config.warmup_samples:
            return Window(self.kind, self.cores, self.opened_at, self.skipped + 1, self.n, self.mean, self.m2, t)
        n = self.n + 1
        delta = value - self.mean
        mean = self.mean + delta / n
        return Window(self.kind, self.cores, self.opened_at, self.skipped, n, mean, self.m2 + delta * (value - mean), t)

    def rel_half_width(self, config: SignalConfig) -> float:
        """The confidence interval's half-width as a share of the mean (inf below 2 samples)."""
        if self.n < 2 or self.mean <= 0:
            return math.inf
        sd = math.sqrt(self.m2 / (self.n - 1))
        t = t_quantile(0.5 + config.confidence / 2, self.n - 1)
        return t * sd / math.sqrt(self.n) / self.mean

    def result(self, now: float, config: SignalConfig) -> Measurement | None:
        """The measurement once the window has ended (steady, or at max_window_s), else None."""
        elapsed = now - self.opened_at
        hw = self.rel_half_width(config)
        steady = self.n >= config.min_samples and hw <= config.tolerance
        if not steady and elapsed < config.max_window_s:
            return None
        return Measurement(self.cores, self.value(), hw, self.n, elapsed, steady)

    def value(self) -> float | None:
        """The mean as a throughput: iterations/s or utilisation %; None without samples."""
        if self.n == 0:
            return None
        if self.kind == ITERATION_TIME:
            return 1.0 / self.mean
        return self.mean

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cores": self.cores, "opened_at": self.opened_at, "skipped": self.skipped,
                "n": self.n, "mean": self.mean, "m2": self.m2, "last_t": self.last_t}

    @classmethod
    def from_dict(cls, data: Any) -> "Window":
        """Raises ValueError on any other shape."""
        if not isinstance(data, dict) or set(data) != {"kind", "cores", "opened_at", "skipped", "n", "mean", "m2",
                                                        "last_t"}:
            raise ValueError("a window: expected kind, cores, opened_at, skipped, n, mean, m2, last_t")
        for key in ("cores", "skipped", "n"):
            if type(data[key]) is not int or data[key] < 0:
                raise ValueError(f"window {key}: not a count: {data[key]!r:.40}")
        for key in ("opened_at", "mean", "m2"):
            if not _is_number(data[key]):
                raise ValueError(f"window {key}: not a number: {data[key]!r:.40}")
        if data["last_t"] is not None and not _is_number(data["last_t"]):
            raise ValueError(f"window last_t: not a number: {data['last_t']!r:.40}")
        if data["m2"] < 0:
            raise ValueError("window m2: negative")
        return cls(**data)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check(kind: str, value: Any) -> None:
    if not _is_number(value):
        raise BadSample(f"{kind}: not a finite number: {value!r:.40}")
    if kind == ITERATION_TIME and not value > 0:
        raise BadSample(f"iteration time must be > 0 s, not {value}")
    if kind == GPU_UTILISATION and not 0 <= value <= 100:
        raise BadSample(f"GPU utilisation must be within 0..100 %, not {value}")
