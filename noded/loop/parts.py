"""What a Daemon is made of, built whole by the wiring (noded.commands.wiring) and given to
it at construction: nothing is set on a Daemon afterwards.

A part that is None is off on this node (no MBA and no cores to halve, right-sizing or
co-location not enabled, a dry run that records nothing); which ones may be on together
is checked here, once, not in each tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from noded.actuators.plan import ApplyResult
from noded.knobs.controller import Controller, in_reading_order
from noded.policy.contention_controller import Contention
from noded.samplers.sample import Sample

if TYPE_CHECKING:  # annotations only: co-location loads numba and MPS, the others sit above the loop
    from noded.actuators.cpusets import CpuSetOwner
    from noded.actuators.memsoft import MemorySoftLimits
    from noded.admin.server import ReportBudget
    from noded.capping.service import CapService
    from noded.colocation.service import Colocation
    from noded.config import Config
    from noded.jobs.discovery import RegisteredLabels
    from noded.loop.overrides import OverrideStore
    from noded.policy.baselines import BaselineStore
    from noded.rightsize.service import RightSizing
    from noded.samplers.telemetry import Telemetry


class Throttle(Protocol):
    """What throttles CPU jobs' bandwidth: MBA levels (actuators.mba) or halved cores
    (actuators.cores). The tick is its one writer: it applies one plan of levels a tick."""

    kind: str

    def max_levels(self, sample: Sample) -> dict[str, int]: ...

    def levels_in_force(self, sample: Sample) -> dict[str, int | None]: ...

    def level_share(self, level: int) -> float: ...

    def apply(self, levels: Mapping[str, int], sample: Sample) -> ApplyResult: ...

    def release_all(self) -> list[str]: ...

    def use_peak(self, peak_bytes_per_domain: float) -> None: ...


class Notifier(Protocol):
    """systemd's notify protocol, told around each reload (commands.sdnotify.SystemdNotifier)."""

    def reloading(self) -> None: ...

    def ready(self, status: str) -> None: ...


@dataclass(frozen=True)
class Parts:
    telemetry: Telemetry | None  # the samplers behind one Sample a tick
    throttle: Throttle | None = None  # None: nothing can throttle here (method mba on a host without MBA)
    caps: CapService | None = None  # bandwidth caps' holders, where the throttle is MBA's
    baselines: BaselineStore | None = None  # GPU jobs' baselines kept across restarts
    # right-sizing (rightsize.sources names a source): the sizer, and the one owner of every job's CPUs
    rightsize: RightSizing | None = None
    cpu_owner: CpuSetOwner | None = None  # also a cap's fewer cores below MBA's lowest value
    memory: MemorySoftLimits | None = None  # right-sizing's memory (rightsize.memory.cache_gb)
    colocation: Colocation | None = None  # co-location (colocation.enabled, not in a dry run)
    # what operators and job managers set: the overrides and the labels hooks register
    overrides: OverrideStore | None = None
    registered_labels: RegisteredLabels | None = None
    # the state directory (None: a dry run, nothing is recorded): why it cannot be written
    # now, and how many writes into it have failed so far (a new failure is probed at once)
    state_probe: Callable[[], str | None] | None = None
    state_failed_writes: Callable[[], int] | None = None
    # reads the config again (None: refused; raises noded.util.settled.Unsettled: read it again next round)
    reloader: Callable[[], Config | None] | None = None
    notifier: Notifier | None = None  # told RELOADING=1, then READY=1, around each reload
    report_budget: ReportBudget | None = None  # the report socket's, where it listens: its counts are metrics
    # controllers beyond those the parts above are (a new controller is a file of its package
    # and a line in the wiring): they propose after the built-in ones, in this order
    controllers: tuple[Controller, ...] = ()

    def __post_init__(self):
        if self.rightsize is not None and self.cpu_owner is None:
            raise ValueError("right-sizing writes jobs' CPUs through their one owner: give it the owner")
        if self.cpu_owner is not None and self.rightsize is None and self.caps is None:
            raise ValueError("the owner of jobs' CPUs serves right-sizing or caps' fewer cores: give one of them")
        if self.memory is not None and self.rightsize is None:
            raise ValueError("right-sizing's memory needs right-sizing")

    def tick_controllers(self, clock: Callable[[], float]) -> tuple[Contention, tuple[Controller, ...]]:
        """The controllers that are on, made afresh for one Daemon, in the order they propose
        (``in_reading_order``: each after those whose proposals it reads, say the caps before
        contention, which must know which jobs are capped, and contention before right-sizing's
        CPUs, which carry its levels where cores are halved; otherwise as listed here, those
        registered in ``controllers`` last); contention (the policy, always on) is returned
        first as well: the tick's decision is its. Raises ControllerCycle."""
        policy = Contention(self.baselines)
        on: list[Controller] = []
        if self.caps is not None:
            from noded.capping.caps_controller import Caps

            on.append(Caps(self.caps))
        on.append(policy)
        if self.rightsize is not None:
            from noded.rightsize.cpus_controller import CpuSizing

            on.append(CpuSizing(self.rightsize, self.cpu_owner, clock))
        if self.memory is not None:
            from noded.rightsize.memory_controller import MemorySizing

            on.append(MemorySizing(self.rightsize))
        if self.colocation is not None:
            from noded.colocation.colocation_controller import Colocating  # numba and MPS: only where it is on

            on.append(Colocating(self.colocation))
        return policy, in_reading_order((*on, *self.controllers))
