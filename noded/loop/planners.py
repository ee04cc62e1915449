"""One plan per knob, merged from every controller's proposals (noded.knobs.controller says
the precedence): what the actuators write this tick, each knob by its one writer."""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable

from noded.actuators.plan import CAPPED
from noded.knobs.controller import CpuWishes, MemoryWishes, Plans, Proposals


def plan_places(proposed: Iterable[Proposals]) -> tuple[dict[str, int], dict]:
    """Where each CPU job goes: contention's level, or its cap's own group (a cap over a
    level); and the caps in force."""
    levels: dict[str, int] = {}
    capped: dict = {}
    for p in proposed:
        levels.update(p.levels or {})
        capped.update(p.capped or {})
    return {**levels, **{j: CAPPED for j in capped}}, capped


def plan_cpus(proposed: Iterable[Proposals]) -> CpuWishes | None:
    """Every planned job's CPUs (None: no controller planned CPUs this tick)."""
    plans = [p.cpus for p in proposed if p.cpus is not None]
    if not plans:
        return None
    cpus: dict[str, tuple[int, ...]] = {}
    granted: dict[str, tuple[int, ...]] = {}
    for plan in plans:
        cpus.update(plan.cpus)
        granted.update(plan.granted)
    return CpuWishes(MappingProxyType(cpus), MappingProxyType(granted))


def plan_memory(proposed: Iterable[Proposals]) -> MemoryWishes | None:
    """Memory soft limits: the last proposal made (one controller sizes memory)."""
    found = [p.memory for p in proposed if p.memory is not None]
    return found[-1] if found else None


def plan_knobs(proposed: tuple[Proposals, ...]) -> Plans:
    places, capped = plan_places(proposed)
    return Plans(MappingProxyType(places), MappingProxyType(capped), plan_cpus(proposed),
                 tuple(p.fewer_cores for p in proposed if p.fewer_cores is not None), plan_memory(proposed))

