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

from noded.jobs.cgroupwalk import NODED_SHORT_OF, Node, read_at, walk_cgroups
from noded.jobs.polling import DEFAULT_MAX_POLLED
from noded.jobs.model import Job
from noded.util.journal import printable
from noded.util.procstat import STARTTIME, stat_fields

log = logging.getLogger(__name__)

PATH_MAX = 4096  # Linux's, the terminating NUL included


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


def _read_at(dir_fd: int | None, path: str, node: Node) -> str:
    """A small kernel file as text: ``path`` relative to ``dir_fd`` (None: as it is)."""
    return read_at(dir_fd, path, node).decode("ascii", "replace").strip()


def has_cpuset(cgroup: str | None) -> bool:
    """Whether a job's cgroup is a cpuset's. Raises OSError where that cannot be told (its
    directory shut to noded: EACCES), rather than take it for a job without a cpuset and
    plan its CPUs by its processes' affinities."""
    if not cgroup:
        return False
    try:
        os.stat(os.path.join(cgroup, "cpuset.cpus"))
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


@dataclass(frozen=True)
class CpusetTree:
    """A job's cpuset tree as one walk read it: (directory, its cpuset.cpus), parents
    first, breadth first; ``partial``: why only part of the tree was read (None: all)."""

    cpusets: tuple[tuple[str, frozenset[int]], ...]
    partial: str | None = None


def read_cpuset_tree(top: str, most: int | None = None) -> CpusetTree:
    """The cpuset tree of a job, breadth first by directory descriptors, at most ``most``
    cgroups; a cgroup removed meanwhile is left out, a part noded may not read, beyond
    ``most`` or deeper than PATH_MAX (noded writes cpusets by path) is left out and said
    (``noded.jobs.cgroupwalk``). Raises OSError where the job's own directory cannot be read."""
    out = []

    def visit(dir_fd: int | None, base: str, node: Node) -> bool:
        if node.length + len("/cpuset.cpus.effective") >= PATH_MAX:
            # the cpusets noded writes it writes by path, and the Sample and the records keep
            # their paths: a cgroup deeper than that is left out, and said (a part unread)
            raise OSError(errno.ENAMETOOLONG, "deeper than PATH_MAX, by which noded writes cpusets: left out",
                          node.short())
        try:
            value = _read_at(dir_fd, base + "cpuset.cpus", node)
        except FileNotFoundError:
            return True  # no cpuset here (v2 without the controller below): its children may have one
        if not value:  # v2: empty inherits the parent's
            try:
                value = _read_at(dir_fd, base + "cpuset.cpus.effective", node)
            except FileNotFoundError:
                pass
        out.append((node.path, frozenset(parse_cpu_list(value))))
        return True

    walk = walk_cgroups(top, visit, most)
    return CpusetTree(tuple(out), walk.partial)


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
    once: one tenant's cgroups must not blind noded to every job's CPUs. A tree read only in
    part (more than ``most`` cgroups, a directory below the job's shut to noded) gives what
    that part holds, the job's own cpuset first, and is said in ``partial``. What says noded
    itself is short (descriptors, memory) fails the sampler: every job would fail alike."""

    name = "cpus"

    def __init__(self, proc: str = "/proc", wanted: Callable[[Mapping[str, Job]], Iterable[str]] | None = None,
                 most: int = DEFAULT_MAX_POLLED):
        self.proc = proc
        self.most = most  # cgroups read per job's tree at most (jobs.max_polled_per_source)
        # Which jobs' CPUs this tick's plan may read (None: every job's). Where only caps change
        # CPUs (an MBA host without right-sizing), that is the capped jobs and those whose
        # CPUs noded recorded: reading every job's cpuset tree was most of a tick's own CPU.
        self.wanted = wanted
        self.unreadable: dict[str, str] = {}  # job id -> why its CPUs could not be read, last sample
        self.partial: dict[str, str] = {}  # job id -> why only part of its cpuset tree was read, last sample

    def sample(self, jobs: Mapping[str, Job]) -> dict[str, CpuPlacement]:
        out, unreadable, partial = {}, {}, {}
        if self.wanted is not None:
            names = set(self.wanted(jobs))
            jobs = {j: job for j, job in jobs.items() if j in names}
        for job_id, job in jobs.items():
            try:
                if has_cpuset(job.cgroup):
                    tree = read_cpuset_tree(job.cgroup, self.most)
                    out[job_id] = CpuPlacement(cpusets=tree.cpusets)
                    if tree.partial is not None:
                        partial[job_id] = f"{job.cgroup}: {tree.partial}"
                else:
                    out[job_id] = CpuPlacement(affinities=read_affinities(self.proc, job.pids))
            except OSError as e:
                if e.errno in NODED_SHORT_OF:
                    raise
                unreadable[job_id] = f"{e.filename or job.cgroup}: {e.strerror or e}"
        for job_id in unreadable.keys() - self.unreadable.keys():
            log.warning("job=%s CPUs unreadable, unknown until they can be read (said once): %s", job_id,
                        unreadable[job_id])
        for job_id in partial.keys() - self.partial.keys():
            log.warning("job=%s cpuset tree partly read, the part read used (said once): %s", job_id,
                        printable(partial[job_id]))
        self.unreadable = unreadable
        self.partial = partial
        return out
