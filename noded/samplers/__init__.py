"""Samplers read one part of the world each tick and return a frozen value.

A sampler that fails raises; ``run_sampler`` turns that into a missing part and a
``SamplerStatus`` (success, duration, error) so the tick goes on and the metrics say so.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

T = TypeVar("T", covariant=True)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplerStatus:
    name: str
    ok: bool
    duration_s: float
    error: str | None = None
    cpu_s: float = 0.0  # CPU time it took: the calling thread's, plus any worker thread's it waited on


def run_sampler(name: str, read: Callable[[], T], clock: Callable[[], float] = time.monotonic,
                cpu_clock: Callable[[], float] = time.thread_time) -> tuple[T | None, SamplerStatus]:
    """``read()`` timed, in wall time (``clock``) and in this thread's CPU time
    (``cpu_clock``); an exception becomes a missing part and a failed status."""
    t0, c0 = clock(), cpu_clock()
    try:
        value = read()
    except Exception as e:  # a sampler's failure must never stop the tick
        # said once when it begins and once when it ends (noded.samplers.missing), not a line a tick
        log.debug("sampler=%s error=%r", name, e, exc_info=True)
        return None, SamplerStatus(name, False, clock() - t0, f"{type(e).__name__}: {e}", cpu_clock() - c0)
    return value, SamplerStatus(name, True, clock() - t0, None, cpu_clock() - c0)
