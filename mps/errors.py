"""What can go wrong managing MPS (a call into a driver bounded in time: mps.deadline)."""

from __future__ import annotations


class MpsError(RuntimeError):
    pass


class NvmlTimeout(MpsError):
    """NVML did not answer within a deadline (a hung driver); the call is left to it."""


class MpsUnreachable(MpsError):
    """The client exited 1: no control daemon answered."""


class MpsTimeout(MpsError):
    """The control daemon (or the control binary) did not answer in time."""


class MpsStopping(MpsError):
    """Refused: this control is being stopped, and starts nothing more."""
