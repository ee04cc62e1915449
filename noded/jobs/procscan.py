"""A job's processes as the kernel lists them in ``/proc/PID/cgroup``, where its cgroup
subtree cannot be read whole.

Whoever owns a delegated subtree may shut its directories to noded (``chmod 000``: the
unit keeps no CAP_DAC_OVERRIDE nor CAP_DAC_READ_SEARCH), the job's own included, or make
more cgroups than a tick reads (``jobs.max_polled_per_source``). Neither hides a process
from ``/proc/PID/cgroup``: the kernel writes every process's cgroup there, readable
whatever the cgroup directory's mode, and what it costs grows with the processes on the
host (bounded by ``pid_max`` and the tenants' own pids limits), never with the cgroups a
tenant makes. So where a job's walk read only part of it, the rest of its processes are
found here:

* ``ProcRotation``, every tick while some job needs it: ``/proc`` listed, then at most
  ``most`` files read, first those of processes never read (a new process is found at
  the next tick, up to ``most`` of them), then in turn the oldest readings again (a
  process moved without an ``exec``, or a pid reused, is read again within a round of
  ``processes / most`` ticks). A process is the job's from its last reading; a process
  not read yet is unknown, never "none of the job's";
* ``pids_below``, once and whole (restoring a job's CPUs: every process of it, however
  many cgroups it has).

A /proc/PID/cgroup that is not the kernel's grammar (a forged record in a cgroup name) is
refused as everywhere (``noded.jobs.proccgroup``): that process is no job's.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, NamedTuple

from noded.jobs.cgroups import proc_cgroups, v1_hierarchy_key
from noded.jobs.proccgroup import ProcCgroupError

#: a process's cgroup paths (controller, '' for v2 -> path) -> the job directories it lies in
Placer = Callable[[Mapping[str, str]], tuple[str, ...]]


def mount_of(path: str) -> str:
    """The mount a path lies in (itself where it is one)."""
    path = os.path.normpath(path)
    while not os.path.ismount(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def hierarchy_key(mount: str) -> str:
    """How /proc/PID/cgroup names the cgroup hierarchy mounted at ``mount`` ('' for v2,
    the first controller of a v1 mount named for them, ``name=systemd``)."""
    if os.path.exists(os.path.join(mount, "cgroup.controllers")):
        return ""
    return v1_hierarchy_key(mount)


class CgroupPlace(NamedTuple):
    """A cgroup directory as /proc/PID/cgroup shows it: its hierarchy and its path there."""

    key: str
    path: str  # '/' joined names below the mount, '/' for the mount itself

    @classmethod
    def of(cls, cgroup_dir: str) -> "CgroupPlace":
        mount = mount_of(cgroup_dir)
        rel = os.path.relpath(os.path.normpath(cgroup_dir), mount)
        return cls(hierarchy_key(mount), "/" if rel == "." else "/" + rel)

    def holds(self, path: str | None) -> bool:
        """Whether a process's path in this hierarchy lies in this cgroup or below it."""
        if path is None:
            return False
        return path == self.path or path.startswith(self.path.rstrip("/") + "/")


def _listed(proc: str) -> list[int]:
    """The processes under ``proc``, by pid (as the kernel lists them)."""
    return sorted(int(n) for n in os.listdir(proc) if n.isdigit())


def pids_below(cgroup_dir: str, proc: str = "/proc") -> set[int]:
    """Every process in ``cgroup_dir`` or below it, from each process's /proc/PID/cgroup
    (one pass over /proc: its cost is the host's processes, not the job's cgroups).
    Raises OSError where /proc cannot be listed; a process whose file is refused is left
    out (no job's)."""
    place = CgroupPlace.of(cgroup_dir)
    reader = proc_cgroups(proc)
    out = set()
    for pid in _listed(proc):
        try:
            if place.holds(reader.of(pid).get(place.key)):
                out.add(pid)
        except ProcCgroupError:
            continue
    return out


class ProcRotation:
    """Processes' job directories read from /proc in turn, at most ``most`` a tick (see the
    module's docstring). ``placer``: which job directories a process's cgroups put it in."""

    def __init__(self, placer: Placer, most: int, proc: str = "/proc"):
        if most < 1:
            raise ValueError(f"most must be at least 1, not {most}")
        self.placer = placer
        self.most = most
        self.proc = proc
        self._dirs: dict[int, tuple[str, ...]] = {}  # pid -> its job directories, as last read
        self._by_dir: dict[str, set[int]] = {}
        self._cursor = -1  # the last pid read again in turn
        self._listed: set[int] = set()  # the processes listed at the last step
        self.unread = 0  # processes listed but not read yet (after the last step)
        self.refused = 0  # files refused (not the kernel's grammar, unreadable), since the last reset
        self.read_last = 0  # files read in the last step

    @property
    def active(self) -> bool:
        return bool(self._dirs)

    def reset(self) -> None:
        """No job needs it: what it read is forgotten (a later need starts afresh: no pid
        read long ago, and reused since, is taken for what it was)."""
        self._dirs.clear()
        self._by_dir.clear()
        self._cursor = -1
        self._listed = set()
        self.unread = self.refused = self.read_last = 0

    def step(self) -> None:
        """One tick's reading: /proc listed (processes gone are dropped), then at most
        ``most`` files read. Raises OSError where /proc cannot be listed."""
        listed = _listed(self.proc)
        present = self._listed = set(listed)
        for pid in [p for p in self._dirs if p not in present]:
            self._forget(pid)
        new = [p for p in listed if p not in self._dirs]
        take = new[: self.most]
        room = self.most - len(take)
        if room > 0:
            known = sorted(self._dirs)
            at = next((i for i, p in enumerate(known) if p > self._cursor), 0) if known else 0
            again = (known[at:] + known[:at])[:room]
            if again:
                self._cursor = again[-1]
            take += again
        reader = proc_cgroups(self.proc)
        for pid in take:
            try:
                paths = reader.of(pid)
            except ProcCgroupError:
                self.refused += 1
                self._set(pid, ())  # read, and no job's
                continue
            if not paths:
                self._forget(pid)  # gone since the listing
                continue
            self._set(pid, self.placer(paths))
        self.read_last = len(take)
        self.unread = max(0, len(new) - len(take))

    def _set(self, pid: int, dirs: tuple[str, ...]) -> None:
        old = self._dirs.get(pid)
        if old is not None and old != dirs:
            self._drop(pid, old)
        self._dirs[pid] = dirs
        for d in dirs:
            self._by_dir.setdefault(d, set()).add(pid)

    def _forget(self, pid: int) -> None:
        self._drop(pid, self._dirs.pop(pid, ()))

    def _drop(self, pid: int, dirs: tuple[str, ...]) -> None:
        for d in dirs:
            held = self._by_dir.get(d)
            if held is not None:
                held.discard(pid)
                if not held:
                    del self._by_dir[d]

    def pids_in(self, job_dir: str) -> frozenset[int]:
        """The processes whose last reading puts them in ``job_dir`` (or below it)."""
        return frozenset(self._by_dir.get(job_dir, ()))

    def not_read_yet(self, pid: int) -> bool:
        """Whether the process was there at the last step but its cgroups not read yet
        (since the last reset): where it is, is unknown."""
        return pid in self._listed and pid not in self._dirs

    def describe(self) -> str:
        """How far it read: for a message."""
        return (f"the host's processes' /proc/PID/cgroup read, {self.most} a tick in turn"
                + (f", {self.unread} not read yet" if self.unread else ""))
