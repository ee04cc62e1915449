"""A control group's memory bandwidth as a test measures it on a mounted resctrl: from its
counters, with the times taken on either side of each read. The emulator counts on
CLOCK_MONOTONIC, the test's clock too, so what it counted lies between those times: a test
starved around a read gets a wider range of rates, never a wrong rate (a window of one wall
second read as one number was off by what the reads lost: 10 % at 100 ms)."""

from __future__ import annotations

import os
import time
from typing import NamedTuple


class CounterReading(NamedTuple):
    bytes: int  # mbm_total_bytes, summed over the group's domains
    before: float  # CLOCK_MONOTONIC just before the first read
    after: float  # and just after the last


def counters(rc, group: str) -> CounterReading:
    """The group's total bytes as any reader sees them, and between which times."""
    mon = f"{rc.root}/{group}/mon_data"
    before = time.monotonic()
    total = 0
    for domain in sorted(os.listdir(mon)):
        with open(f"{mon}/{domain}/mbm_total_bytes") as f:
            total += int(f.read())
    return CounterReading(total, before, time.monotonic())


def rate_bounds(first: CounterReading, last: CounterReading) -> tuple[float, float]:
    """The least and the most bytes/s the group can have moved at between two readings."""
    moved = last.bytes - first.bytes
    return moved / (last.after - first.before), moved / max(1e-9, last.before - first.after)


def rate_bounds_over(rc, group: str, seconds: float) -> tuple[float, float]:
    """``rate_bounds`` over a window of at least ``seconds``."""
    first = counters(rc, group)
    time.sleep(seconds)  # a measurement window, not a synchronisation
    return rate_bounds(first, counters(rc, group))


def within(bounds: tuple[float, float], target: float, share: float) -> bool:
    """Whether every rate the bounds allow is within ``share`` of ``target``."""
    low, high = bounds
    return (1 - share) * target <= low and high <= (1 + share) * target


def show(bounds: tuple[float, float], unit: float = 1e9) -> str:
    return f"{bounds[0] / unit:.2f}..{bounds[1] / unit:.2f}"
