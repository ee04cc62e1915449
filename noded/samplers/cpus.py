"""Where each job's CPUs are set, as the kernel reports them now.

A job with a cpuset cgroup of its own (v1, or v2 with the cpuset controller) is
confined by that cgroup and its descendants' ``cpuset.cpus``; any other job by the
affinity of each of its processes. Core halving plans from these readings against
the originals it recorded, never from what it remembers having written.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from resctrl.cpulist import parse_cpu_list

from noded.jobs.discovery import NODED_SHORT_OF
from noded.jobs.model import Job
from noded.util.procstat import STARTTIME, stat_fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuPlacement:
    # (cgroup directory, its cpuset.cpus): the job's directory first, then every
    # descendant with a cpuset, parents before children; () for a job without one.
    cpusets: tuple[tuple[str, frozenset[int]], ...] = ()
    # (pid, start time, affinity) of each process of a job without a cpuset.
    affinities: tuple[tuple[int, str, frozenset[int]], ...] = ()

    def held(self) -> frozenset[int] | None:
        """The CPUs the job holds: its own cpuset's, else every process's together (None:
        nothing was read)."""
        if self.cpusets:
            return self.cpusets[0][1]
        if self.affinities:
            return frozenset().union(*(a[2] for a in self.affinities))
        return None


def read_cpuset_file(path: str, name: str) -> str:
    """A cgroup's ``cpuset.cpus`` or ``cpuset.mems``, or its ``.effective`` where cgroup v2
    leaves the file empty to inherit the parent's; '' where neither says."""
    for n in (name, f"{name}.effective"):
        try:
            with open(os.path.join(path, n)) as f:
                value = f.read().strip()
        except FileNotFoundError:
            continue
        if value:
            return value
    return ""


def has_cpuset(cgroup: str | None) -> bool:
    return bool(cgroup) and os.path.exists(os.path.join(cgroup, "cpuset.cpus"))


def _gone(e: OSError) -> bool:
    return e.errno in (errno.ENOENT, errno.ENODEV, errno.ESRCH)


def read_cpusets(top: str) -> tuple[tuple[str, frozenset[int]], ...]:
    """The cpuset tree of a job, parents first; a cgroup removed meanwhile is left out."""
    def walk_error(e: OSError) -> None:
        if not _gone(e):
            raise e

    out = []
    for d, _sub, files in os.walk(top, onerror=walk_error):
        if "cpuset.cpus" not in files:
            continue
        try:
            out.append((d, frozenset(parse_cpu_list(read_cpuset_file(d, "cpuset.cpus")))))
        except OSError as e:
            if not _gone(e):
                raise
    return tuple(out)


def read_affinities(proc: str, pids: frozenset[int]) -> tuple[tuple[int, str, frozenset[int]], ...]:
    """(pid, start time, affinity) of each process still there."""
    out = []
    for pid in sorted(pids):
        fields = stat_fields(proc, pid)
        if fields is None:
            continue
        try:
            cpus = frozenset(os.sched_getaffinity(pid))
        except ProcessLookupError:
            continue
        out.append((pid, fields[STARTTIME].decode(), cpus))
    return tuple(out)


class CpuPlacementSampler:
    """Each job's placement; a job whose own tree cannot be read (a delegated subtree its
    owner shut noded out of: EACCES) is left out, its CPUs unknown this tick, and said
    once: one tenant's cgroups must not blind noded to every job's CPUs. What says noded
    itself is short (descriptors, memory) fails the sampler: every job would fail alike."""

    name = "cpus"

    def __init__(self, proc: str = "/proc", wanted: Callable[[Mapping[str, Job]], Iterable[str]] | None = None):
        self.proc = proc
        # Which jobs' CPUs this tick's plan may read (None: every job's). Where only caps change
        # CPUs (an MBA host without right-sizing), that is the capped jobs and those whose
        # CPUs noded recorded: reading every job's cpuset tree was most of a tick's own CPU.
        self.wanted = wanted
        self.unreadable: dict[str, str] = {}  # job id -> why its CPUs could not be read, last sample

    def sample(self, jobs: Mapping[str, Job]) -> dict[str, CpuPlacement]:
        out, unreadable = {}, {}
        if self.wanted is not None:
            names = set(self.wanted(jobs))
            jobs = {j: job for j, job in jobs.items() if j in names}
        for job_id, job in jobs.items():
            try:
                if has_cpuset(job.cgroup):
                    out[job_id] = CpuPlacement(cpusets=read_cpusets(job.cgroup))
                else:
                    out[job_id] = CpuPlacement(affinities=read_affinities(self.proc, job.pids))
            except OSError as e:
                if e.errno in NODED_SHORT_OF:
                    raise
                unreadable[job_id] = f"{e.filename or job.cgroup}: {e.strerror or e}"
        for job_id in unreadable.keys() - self.unreadable.keys():
            log.warning("job=%s CPUs unreadable, unknown until they can be read (said once): %s", job_id,
                        unreadable[job_id])
        self.unreadable = unreadable
        return out
