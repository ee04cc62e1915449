"""Each small job subtree's cgroups held open from one tick to the next.

Every tick reads every job's processes. Reached by path, each cgroup costs a path walk, an
open, reads and a close, and its parent a listing; most jobs' subtrees are small and stay
as they are for the job's life (one cgroup; a Slurm job's job, step and task cgroups; a
pod's containers). So a job whose whole subtree is at most ``HOLD_CGROUPS`` cgroups has its
directories held open, and a tick reads each of its cgroups' ``cgroup.procs`` from its
directory's descriptor, with no path walk, and checks it with an ``fstat``.

On cgroup v2 each ``cgroup.procs`` is held open too and read with a ``pread`` from offset 0:
v2 lists a cgroup's processes afresh for each read from 0 (a css task iterator restarted).
Not on v1: there a ``cgroup.procs`` (or ``tasks``) descriptor reads the process list its
first read loaded, kept by the kernel for a second after each read (v1's "pidlists",
``CGROUP_PIDLIST_DESTROY_DELAY``), so a descriptor read every tick would never see a process
arrive (seen on this host's v1 cpuset hierarchy); v1's are opened afresh each read.

That the held cgroups are still the job's whole subtree is observed each tick, never
assumed; where it may not be, the job is read by the walk (``noded.jobs.cgroupwalk``), as
any job is the first time, and held again from what is there then:

* on cgroupfs (kernfs, v1 and v2, refreshed at each stat; tmpfs too) a directory's link
  count is 2 + its subdirectories: a held directory whose count is not 2 + the children
  held under it gained or lost one. The counts are taken after the reads, so a cgroup made
  while they ran is seen, and a process moved into it was read where it was before;
* a held cgroup that was removed fails its read (ENODEV), as one made threaded does
  (EOPNOTSUPP); one removed and another made in its place thus fails too;
* a held directory or ``cgroup.procs`` whose mode or owner changed (its owner shut it to
  noded, say) is read by the walk, which reads only what the kernel lets noded open now:
  a descriptor opened before must not see more than a path would;
* a cgroup renamed keeps its processes, and so the set still reads them;
* on v1 the job's own directory is checked against its path (by inode) at each read, with
  one ``stat`` of the path: v1 renames a cgroup in its parent, and one renamed away and
  another renamed to its name is not the job, while those two renames move neither the
  parent's link count nor its times (seen on this host), so its source is not listed again
  for a while; a path noded may no longer reach (an ancestor shut to it) fails the ``stat``
  too. v2 refuses to rename a cgroup (EPERM) and a removed one fails its held
  ``cgroup.procs``' read, so there the path is checked only when the source is listed again
  (``verify``: a listed directory's mode or owner changed moves its ctime, and lists it again).

The descriptors are bounded: at most ``HOLD_CGROUPS`` a job (2 each), and all of them at
most a quarter of the process's descriptor limit; beyond, jobs are read by the walk. What a
hold would take is known before it opens anything (the walk just counted the subtree's
cgroups), so a job it would put over the budget opens nothing, and is held at its first
read once the room is there (a job's that ended, say); a subtree grown since the walk stops
its hold at the budget's edge. So is
the cost: a job whose subtree changed before it gave one read held (its owner making and
removing a cgroup every tick) is walked ``RETRY_AFTER_READS`` reads before it is held again
(held again after each walk, a read cost the held reads, the walk and the hold: about 2.5
walks).
"""

from __future__ import annotations

import errno
import os
import resource
import weakref
from collections.abc import Iterable

from noded.jobs.cgroups import SubtreeProcs, read_subtree_procs
from noded.jobs.cgroupwalk import read_whole

#: a job's subtree is held open only where it has at most this many cgroups
HOLD_CGROUPS = 8

#: a job whose subtree could not be held, or changed before its first read held, is walked
#: this many reads before it is held again
RETRY_AFTER_READS = 30

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


def default_budget() -> int:
    """A quarter of the process's descriptor limit (its soft limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 4096 if soft == resource.RLIM_INFINITY else max(0, soft // 4)


class _Held:
    """One job's subtree held open: its directories breadth first (the job's own first),
    each one's cgroup.procs, and what each of those descriptors' fstat must say (link
    count, mode, owner, group): a directory's count is 2 + its children held."""

    __slots__ = ("dirs", "procs", "checks", "ino", "raw", "pids", "reads")  # procs: empty where opened each read (v1)

    def __init__(self, dirs: list[int], procs: list[int], expected: list[tuple[int, int, int, int]], ino: int):
        self.dirs = dirs
        self.procs = procs
        self.checks = tuple(zip(dirs + procs, expected))  # (descriptor, what its fstat must say)
        self.ino = ino
        self.raw: list[bytes] | None = None  # what the last read read, and the processes it gave
        self.pids: frozenset[int] = frozenset()
        self.reads = 0  # reads it gave since it was held

    def fds(self) -> list[int]:
        return self.dirs + self.procs


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass  # released anyway


def _close_all(held: dict[str, _Held]) -> None:
    for h in held.values():
        _close(h.fds())
    held.clear()


def _read_at(dir_fd: int) -> bytes:
    """A directory's cgroup.procs, whole, opened from its descriptor."""
    fd = os.open("cgroup.procs", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return read_whole(fd)
    finally:
        os.close(fd)


class HeldSubtrees:
    """Reads jobs' processes (as ``read_subtree_procs``), holding small subtrees open
    between reads. ``budget``: the descriptors all held subtrees may take (None: a quarter
    of the process's limit)."""

    def __init__(self, budget: int | None = None):
        self.budget = default_budget() if budget is None else budget
        self._held: dict[str, _Held] = {}
        self._fds = 0
        self._skip: dict[str, int] = {}  # job directory -> reads left before holding it is tried again
        self.walked = 0  # reads that walked the subtree (for tests and the curious)
        self.opened = 0  # descriptors opened to hold subtrees (likewise)
        self._finalizer = weakref.finalize(self, _close_all, self._held)

    @property
    def held(self) -> int:
        """Jobs held open now."""
        return len(self._held)

    @property
    def descriptors(self) -> int:
        return self._fds

    def read(self, path: str, most: int | None = None, *, hold_procs: bool = False) -> SubtreeProcs:
        """Every process in the job directory ``path`` and below it, as
        ``read_subtree_procs(path, most)`` reads them. ``hold_procs``: its cgroup.procs are
        held open too (cgroup v2 only: see the module's doc)."""
        held = self._held.get(path)
        if held is not None:
            # v1 only, the path's stat: v2 refuses to rename a cgroup (EPERM), and one of its
            # removed fails its held cgroup.procs' read (ENODEV)
            pids = self._read_held(held, None if held.procs else path)
            if pids is not None:
                held.reads += 1
                return SubtreeProcs(pids)
            self._drop(path)
            if held.reads == 0:  # changed before it gave one read: a subtree that churns is walked a while
                self._skip[path] = RETRY_AFTER_READS
        got = read_subtree_procs(path, most)
        self.walked += 1
        if (got.partial is None and got.cgroups <= HOLD_CGROUPS and (most is None or got.cgroups <= most)
                and self._fds + got.cgroups * (2 if hold_procs else 1) <= self.budget):
            # over the budget: nothing opened, and it costs nothing to ask again at the next read
            left = self._skip.get(path, 0)
            if left > 0:
                self._skip[path] = left - 1
            elif not self._hold(path, hold_procs):
                self._skip[path] = RETRY_AFTER_READS
        return got

    def _read_held(self, held: _Held, path: str | None) -> frozenset[int] | None:
        """The processes in the held cgroups, None where they may no longer be the job's
        whole subtree (or one could not be read: the walk says why). The same set as the
        last read's where the files read the same (every job, every tick: nothing parsed).
        ``path``: the job's directory, whose stat (its inode the held one's) stands for its
        descriptor's fstat (v1: see the module's doc)."""
        try:
            if held.procs:
                raw = [read_whole(fd, 0) for fd in held.procs]
            else:
                raw = [_read_at(fd) for fd in held.dirs]
            # after the reads: a cgroup made while they ran is seen (a process moved into it
            # was read where it was before)
            fstat = os.fstat
            for fd, expected in held.checks:
                if path is None:
                    st = fstat(fd)
                else:  # the job's own directory, first, through its path
                    st, path = os.stat(path), None
                    if st.st_ino != held.ino:
                        return None
                if (st.st_nlink, st.st_mode, st.st_uid, st.st_gid) != expected:
                    return None
        except OSError:
            return None
        if raw != held.raw:
            try:
                held.pids = frozenset(int(p) for data in raw for p in data.split())
            except ValueError:
                return None
            held.raw = raw
        return held.pids

    def _hold(self, path: str, hold_procs: bool) -> bool:
        """Opens the job's subtree and holds it, where it is small, within the budget and
        consistent (each directory's link count says the children found); False where not."""
        dirs: list[int] = []
        procs: list[int] = []
        children: list[int] = []
        per_dir = 2 if hold_procs else 1
        room = self.budget - self._fds  # the caller checked the walk's count against it; the
        # subtree may have grown since: each directory's descriptors are counted before they open

        def opened(fd: int) -> int:
            self.opened += 1
            return fd

        try:
            if room < per_dir:
                raise OSError(errno.EMFILE, "over the held subtrees' budget")
            dirs.append(opened(os.open(path, _DIR_FLAGS)))
            ino = os.fstat(dirs[0]).st_ino
            i = 0
            while i < len(dirs):
                fd = dirs[i]
                if hold_procs:
                    procs.append(opened(os.open("cgroup.procs", os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)))
                with os.scandir(fd) as entries:
                    names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
                if len(dirs) + len(names) > HOLD_CGROUPS:
                    raise OSError(errno.E2BIG, "subtree too large to hold")
                if (len(dirs) + len(names)) * per_dir > room:
                    raise OSError(errno.EMFILE, "over the held subtrees' budget")
                for name in names:
                    dirs.append(opened(os.open(name, _DIR_FLAGS, dir_fd=fd)))
                children.append(len(names))
                i += 1
            expected = []
            for fd in dirs + procs:
                st = os.fstat(fd)
                expected.append((st.st_nlink, st.st_mode, st.st_uid, st.st_gid))
            for i, n in enumerate(children):
                expected[i] = (2 + n,) + expected[i][1:]
            held = _Held(dirs, procs, expected, ino)
            if self._read_held(held, None) is None:  # a threaded cgroup, one gone meanwhile, a count moved
                raise OSError(errno.EAGAIN, "subtree changed while held")
        except OSError:
            _close(dirs + procs)
            return False
        self._held[path] = held
        self._fds += len(dirs) + len(procs)
        self._skip.pop(path, None)
        return True

    def _drop(self, path: str) -> None:
        held = self._held.pop(path, None)
        if held is not None:
            self._fds -= len(held.dirs) + len(held.procs)
            _close(held.fds())

    def verify(self, paths: Iterable[str]) -> None:
        """Lets go of each held job among ``paths`` whose directory is no longer the one at
        its path (renamed away, another put there): its source was listed again."""
        for path in paths:
            held = self._held.get(path)
            if held is None:
                continue
            try:
                same = os.stat(path).st_ino == held.ino
            except OSError:
                same = False
            if not same:
                self._drop(path)

    def retain(self, paths: set[str]) -> None:
        """Lets go of every held job whose directory is not among ``paths`` (its source's
        listing no longer has it: the job ended)."""
        for path in [p for p in self._held if p not in paths]:
            self._drop(path)
        for path in [p for p in self._skip if p not in paths]:
            del self._skip[path]

    def close(self) -> None:
        self._finalizer()
        self._fds = 0
