"""One job's CPUs as noded sees them: the kernel's values now (from the Sample, or read
at a restore) beside noded's durable records of them (``noded.actuators.cpurecords``), and
whether a value is still one noded wrote: what the owner of every job's CPUs
(``noded.actuators.cpusets``) plans from and what a restore (``noded.actuators.cpurestore``)
puts back."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from noded.actuators.cpurecords import WrittenValues
from noded.samplers.sample import JobSample
from noded.util.cputree import CpuSet
from noded.util.halving import halvings
from noded.util.procstat import STARTTIME
from noded.util.procstat import stat_fields


@dataclass(frozen=True)
class CpuNode:
    """A cgroup of the job (``where``: its directory) or a process (``where``: pid)."""

    key: str
    where: str | int
    now: CpuSet
    recorded: CpuSet | None  # the original noded recorded, if any
    parent: int | None = None  # cgroups: index of the nearest cgroup above it in the job

    @property
    def original(self) -> CpuSet:
        return self.recorded if self.recorded is not None else self.now


@dataclass(frozen=True)
class JobCpus:
    """One job's cgroups (parents first) or processes; a restore's has no job or Sample."""

    job: str
    js: JobSample | None
    cpusets: bool
    nodes: tuple[CpuNode, ...]
    original: CpuSet  # the job's: its directory's, else the processes' as recorded for the job

    @property
    def now(self) -> CpuSet:
        """The job's CPUs now: its directory's, else every process's together."""
        if self.cpusets:
            return self.nodes[0].now
        return frozenset().union(*(n.now for n in self.nodes))

    @property
    def recorded(self) -> list[CpuNode]:
        return [n for n in self.nodes if n.recorded is not None]


def parent_of(nodes: Sequence[CpuNode], directory: str) -> int | None:
    """The index of the nearest cgroup above ``directory`` among ``nodes`` (parents first)."""
    return next((i for i in range(len(nodes) - 1, -1, -1) if directory.startswith(str(nodes[i].where) + os.sep)),
                None)


def ours(written: WrittenValues, v: JobCpus, n: CpuNode) -> bool:
    """A recorded value still the original or one noded wrote (records made before
    cpus_written.json existed: one that core halving writes)."""
    if n.now == n.recorded:
        return True
    values = written.get(n.key)
    if values is not None:
        return n.now in values
    if not v.cpusets:
        return n.now in halvings(n.recorded)
    return any(n.now == ((n.original & kept) or kept) for kept in halvings(v.original))


def alive(proc: str, pid: int, start: str) -> bool:
    """Whether process ``pid`` is the one that started at ``start`` (not a reused pid)."""
    fields = stat_fields(proc, pid)
    return fields is not None and fields[STARTTIME].decode() == start
