"""What can go wrong managing MPS, and the one way a call into a driver that may hang is bounded."""

from __future__ import annotations

import threading
from typing import Any, Callable


class MpsError(RuntimeError):
    pass


class NvmlTimeout(MpsError):
    """NVML did not answer within a deadline (a hung driver); the call is left to it."""


def call_within(deadline_s: float, what: str, fn: Callable[[threading.Event], Any]) -> Any:
    """``fn(cancelled)``'s value (or its exception), made in a thread of its own and waited
    for at most ``deadline_s``: a driver that hangs must not hold whoever waits (a start, a
    stop). Past the deadline ``cancelled`` is set, so ``fn`` changes nothing more once its
    call returns, and NvmlTimeout says ``what`` was not done; the thread, a daemon one, is
    left to the driver."""
    box: dict[str, Any] = {}
    cancelled = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn(cancelled)
        except BaseException as e:  # handed to the caller, whatever it is
            box["error"] = e

    worker = threading.Thread(target=run, name="nvml-call", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        cancelled.set()
        raise NvmlTimeout(f"NVML did not answer within {deadline_s:g} s {what}")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class MpsUnreachable(MpsError):
    """The client exited 1: no control daemon answered."""


class MpsTimeout(MpsError):
    """The control daemon (or the control binary) did not answer in time."""


class MpsStopping(MpsError):
    """Refused: this control is being stopped, and starts nothing more."""
