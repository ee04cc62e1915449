"""Children of the simulated node that must not outlive whoever started them (a killed test,
a killed benchmark): the kernel signals them when their parent dies (prctl PR_SET_PDEATHSIG).
The one place the simulated node, its emulator, the launcher and the benchmarks take it from."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child between fork and exec (``preexec_fn``): ``sig`` when the parent dies. SIGTERM
    lets the child clean up (the emulator unmounts); SIGKILL is for placeholders with nothing
    to clean."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
