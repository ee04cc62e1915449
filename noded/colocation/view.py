"""What one tick saw of co-location (a light module: the daemon imports it without
loading numba or MPS code)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class ColocationView:
    """For the metrics and the admin socket: read from the service once a tick."""

    decisions: Mapping[str, int]  # admit | refuse -> count since start
    jobs_per_gpu: Mapping[str, int]  # GPU UUID -> jobs admitted there by noded
    mps_state: str
    decided_by: str
    mps_restarts: int = 0  # MPS control daemons that failed (died, faulted, stopped answering) and were restarted
    mps_start_failures: int = 0  # starts of the MPS control daemon that failed
