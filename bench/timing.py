"""Timing helpers the benchmarks share."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Callable


def median_time(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls of ``fn``, in seconds."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def first_call_s(code: str, cache_dir: str) -> float:
    """What a fresh process pays for its first call into numba kernels: ``code`` runs in a
    new interpreter with ``cache_dir`` as numba's cache (empty: compile; warm: load) and
    prints the seconds it measured."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout)
