"""Waiting on a condition with a deadline, never a fixed sleep. The one ``wait_for`` of the
repository: the tests (tests/support/waiting), the Slurm harness (tests/slurm) and the
benchmarks import it from here, the package they all may import."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.01, what: str = "condition"):
    """``predicate()``'s first truthy value, polled every ``interval`` until ``timeout``
    seconds have passed; past it, AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)  # polling, against the deadline above
