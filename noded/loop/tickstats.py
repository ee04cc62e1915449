"""What the loop counts over its whole life, for the metrics: how long ticks and
samplers took (histograms), failed writes, failed samplers, jobs held by an error of
their own, and ticks that raised.

``TickStats`` is kept by the loop's thread alone (no lock); each tick publishes
``snapshot()``, an immutable ``Totals``, in its ``TickResult``. A scrape reads that
snapshot and never these counters.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

#: Upper bounds (seconds) of the duration histograms' buckets: suited to a 1 s tick,
#: and to see a 100 ms one.
BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Histogram:
    """Observations so far: ``buckets[i]`` of them were <= ``BUCKETS[i]`` (cumulative, as
    Prometheus counts them); ``count`` is all of them (the +Inf bucket), ``sum`` their total."""

    buckets: tuple[int, ...] = (0,) * len(BUCKETS)
    count: int = 0
    sum: float = 0.0


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(frozen=True)
class Totals:
    """Everything counted since the daemon started, as of one tick."""

    tick_durations: Mapping[str, Histogram] = field(default_factory=_empty)  # stage -> seconds
    sampler_durations: Mapping[str, Histogram] = field(default_factory=_empty)  # sampler -> seconds
    sampler_errors: Mapping[str, int] = field(default_factory=_empty)  # sampler -> runs that failed
    actuator_errors: Mapping[tuple[str, str], int] = field(default_factory=_empty)  # (actuator, operation) -> failed
    tick_failures: int = 0  # ticks that raised (the loop went on)
    sampler_cpu: Mapping[str, float] = field(default_factory=_empty)  # sampler -> CPU seconds, in all
    job_errors: Mapping[str, int] = field(default_factory=_empty)  # stage -> a job's part failed (the job held)


class _Observations:
    __slots__ = ("per_bucket", "count", "sum")

    def __init__(self) -> None:
        self.per_bucket = [0] * len(BUCKETS)  # not cumulative: one observation lands in one bucket at most
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        if math.isnan(value):
            return  # a clock that failed is no duration
        value = max(0.0, value)  # a clock stepping back is not a negative time spent
        i = bisect.bisect_left(BUCKETS, value)
        if i < len(BUCKETS):
            self.per_bucket[i] += 1
        self.count += 1
        self.sum += value

    def frozen(self) -> Histogram:
        running, cumulative = 0, []
        for n in self.per_bucket:
            running += n
            cumulative.append(running)
        return Histogram(tuple(cumulative), self.count, self.sum)


class TickStats:
    """The loop's own counters (its thread only)."""

    def __init__(self) -> None:
        self._ticks: dict[str, _Observations] = {}
        self._samplers: dict[str, _Observations] = {}
        self._sampler_errors: dict[str, int] = {}
        self._actuator_errors: dict[tuple[str, str], int] = {}
        self._tick_failures = 0
        self._sampler_cpu: dict[str, float] = {}
        self._job_errors: dict[str, int] = {}
        self._failing: dict[str, frozenset[str]] = {}  # stage -> the jobs that failed there last tick

    def tick(self, durations: Mapping[str, float], samplers: Iterable[tuple[str, bool, float, float]]) -> None:
        """One tick done: its stages' durations, and each sampler's (name, ok, seconds,
        CPU seconds)."""
        for stage, seconds in durations.items():
            self._ticks.setdefault(stage, _Observations()).observe(seconds)
        for name, ok, seconds, cpu_s in samplers:
            self._samplers.setdefault(name, _Observations()).observe(seconds)
            if cpu_s > 0:  # a CPU clock read as going back (or NaN) adds nothing
                self._sampler_cpu[name] = self._sampler_cpu.get(name, 0.0) + cpu_s
            if not ok:
                self._sampler_errors[name] = self._sampler_errors.get(name, 0) + 1

    def actuator_error(self, actuator: str, operation: str) -> None:
        key = (actuator, operation)
        self._actuator_errors[key] = self._actuator_errors.get(key, 0) + 1

    def tick_failed(self) -> None:
        self._tick_failures += 1

    def job_errors(self, stage: str, jobs: Iterable[str]) -> set[str]:
        """This tick's jobs whose part of ``stage`` failed (each held as it was): each is
        counted; returns those that did not fail there last tick (to be said once)."""
        failing = frozenset(jobs)
        if failing:
            self._job_errors[stage] = self._job_errors.get(stage, 0) + len(failing)
        began = set(failing - self._failing.get(stage, frozenset()))
        self._failing[stage] = failing
        return began

    def snapshot(self) -> Totals:
        return Totals(MappingProxyType({k: o.frozen() for k, o in self._ticks.items()}),
                      MappingProxyType({k: o.frozen() for k, o in self._samplers.items()}),
                      MappingProxyType(dict(self._sampler_errors)),
                      MappingProxyType(dict(self._actuator_errors)),
                      self._tick_failures, MappingProxyType(dict(self._sampler_cpu)),
                      MappingProxyType(dict(self._job_errors)))
