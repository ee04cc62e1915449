"""Each GPU job's memory cgroup, as the kernel shows it this tick: where it is (the job's
own cgroup's path in the memory hierarchy: the same directory on v2, where ``memory.high``
exists there; the same path below the v1 memory mount otherwise), the soft limit in force
and what ``memory.stat`` counts. It must hold the job's processes, as ``/proc/PID/cgroup``
says; a job without a cgroup, or whose processes are elsewhere, has none (the reason says
why). Right-sizing's memory plans from this reading (``noded.actuators.memsoft`` writes).

Cgroup files only: every file is opened without following a link, without blocking (a
FIFO never hangs a tick) and without truncating, then taken only if it is a regular file
of a cgroup filesystem the mounts file lists (its device is a ``cgroup``/``cgroup2``
mount's): whatever a job's cgroup path or a link on the way names, noded reads nothing else.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Protocol

from resctrl.mounts import parse_mounts

from noded.jobs.cgroups import read_process_cgroups
from noded.jobs.proccgroup import ProcCgroupError
from noded.util import paths

#: the key of a memory cgroup's record in originals.json
KEY = "memory:"
V1_FILE = "memory.soft_limit_in_bytes"
V2_FILE = "memory.high"
_MAX_STAT = 1 << 16  # memory.stat is a few hundred bytes; never read more
CGROUP_FSTYPES = ("cgroup", "cgroup2")


class JobPlace(Protocol):
    """What of a job its memory cgroup is found from (a JobSample has it)."""

    cgroup: str | None
    pids: frozenset[int]


class NotACgroupFile(OSError):
    """The path names something other than a regular file of a cgroup filesystem."""


class MemoryCgroupError(Exception):
    """A job's memory cgroup cannot be found or read (the message says where and why)."""


@dataclass(frozen=True)
class MemoryCgroup:
    """A job's memory cgroup as the kernel showed it this tick."""

    path: str
    version: int
    limit: str  # the soft limit's file as read, e.g. "max" (v2) or "9223372036854771712" (v1)
    anon_bytes: int  # anonymous memory: the job's process memory, which a cache share comes on top of
    file_bytes: int  # page cache: the data cache a soft limit reclaims first

    @property
    def limit_file(self) -> str:
        return os.path.join(self.path, V2_FILE if self.version == 2 else V1_FILE)

    @property
    def key(self) -> str:
        return KEY + self.path


@dataclass(frozen=True)
class MemoryReading:
    """The memory cgroups of the jobs right-sizing's memory is for, read this tick."""

    cgroups: Mapping[str, MemoryCgroup] = field(default_factory=lambda: MappingProxyType({}))
    unplaced: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # job -> why it has none


def cgroup_devices(mounts: str = "/proc/mounts") -> frozenset[int]:
    """The devices of the cgroup filesystems ``mounts`` lists (each v1 hierarchy and the v2
    tree is a filesystem of its own). Raises OSError when the file cannot be read."""
    with open(mounts, encoding="utf-8", errors="surrogateescape") as f:
        listed = [m.target for m in parse_mounts(f.read(1 << 22)) if m.fstype in CGROUP_FSTYPES]
    devices = set()
    for target in listed:
        try:
            devices.add(os.stat(target).st_dev)
        except OSError:
            continue  # listed but not reachable from here: nothing of it can be opened either
    return frozenset(devices)


def open_cgroup_file(path: str, flags: int, devices: frozenset[int]) -> int:
    """A descriptor of ``path`` only if it is a regular file of a cgroup filesystem: no link
    followed, no blocking open (a FIFO), no truncation before it is known what it is.
    Raises OSError (NotACgroupFile for anything else)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_dev not in devices:
            raise NotACgroupFile(errno.EXDEV, "not a file of a cgroup filesystem the mounts file lists", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_cgroup_file(path: str, devices: frozenset[int]) -> str:
    """At most 64 KiB of a cgroup file (see ``open_cgroup_file``); OSError as the kernel says."""
    fd = open_cgroup_file(path, os.O_RDONLY, devices)
    try:
        return os.read(fd, _MAX_STAT).decode("ascii", "replace")
    finally:
        os.close(fd)


def parse_memory_stat(text: str, version: int) -> tuple[int, int]:
    """(anonymous, page cache) bytes from memory.stat; v1 counts the hierarchy below (total_*).
    Raises ValueError naming the field that is missing or not a number."""
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        fields[name] = value
    names = ("anon", "file") if version == 2 else ("total_rss", "total_cache")
    out = []
    for name in names:
        try:
            out.append(int(fields[name]))
        except (KeyError, ValueError):
            raise ValueError(f"memory.stat has no number for {name!r}") from None
    return out[0], out[1]


def _mount_of(path: str) -> str:
    while not os.path.ismount(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def _filesystem(mounts: str, path: str) -> str | None:
    """The type of the filesystem ``path`` is on, as ``mounts`` lists its mount (None: not
    listed, or ``mounts`` unreadable)."""
    top = _mount_of(path)
    try:
        with open(mounts, encoding="utf-8", errors="surrogateescape") as f:
            types = [m.fstype for m in parse_mounts(f.read()) if m.target == top]
    except OSError:
        return None
    return types[-1] if types else None


def _in_cgroup(proc: str, pid: int, controller: str, mount_rel: str) -> bool:
    """Whether the process's cgroup in ``controller``'s hierarchy is ``mount_rel`` or below
    it. A /proc/PID/cgroup the parser refuses (a forged record in a cgroup name) is not."""
    try:
        where = read_process_cgroups(proc, pid).get(controller)
    except ProcCgroupError:
        return False
    return where is not None and (where + "/").startswith(mount_rel.rstrip("/") + "/")


def find_memory_cgroup(js: JobPlace, *, proc: str = "/proc", mounts: str = "/proc/mounts",
                       devices: frozenset[int] | None = None) -> MemoryCgroup:
    """The job's memory cgroup and what it holds now (``devices``: the cgroup filesystems',
    read from ``mounts`` when not given). Raises MemoryCgroupError."""
    if js.cgroup is None:
        raise MemoryCgroupError("the job has no cgroup of its own (a registered process tree)")
    try:
        v2 = paths.exists(os.path.join(js.cgroup, V2_FILE))
    except OSError as e:
        # Its directory shut to noded (EACCES): not a cgroup without memory.high. On a v1
        # hierarchy none has it (its memory is the memory hierarchy's, read there); on v2
        # which it is cannot be told, and the error is the answer.
        if _filesystem(mounts, js.cgroup) != "cgroup":
            raise MemoryCgroupError(f"{e.filename or js.cgroup}: {e.strerror or e}") from None
        v2 = False
    if v2:
        version, path, controller = 2, js.cgroup, ""
    else:
        try:
            with open(mounts, encoding="utf-8", errors="surrogateescape") as f:
                memory = [m for m in parse_mounts(f.read()) if m.fstype == "cgroup" and "memory" in m.options]
        except OSError as e:
            raise MemoryCgroupError(f"{mounts}: {e.strerror}") from None
        if not memory:
            raise MemoryCgroupError(f"no memory cgroup: {V2_FILE} is not in {js.cgroup} and {mounts} lists no v1 "
                                    "memory hierarchy")
        rel = os.path.relpath(js.cgroup, _mount_of(js.cgroup))
        version, path, controller = 1, os.path.normpath(os.path.join(memory[-1].target, rel)), "memory"
    mount_rel = "/" + os.path.relpath(path, _mount_of(path)).removeprefix(".")
    inside = [pid for pid in sorted(js.pids) if _in_cgroup(proc, pid, controller, mount_rel)]
    if js.pids and not inside:
        raise MemoryCgroupError(f"none of the job's processes is in the memory cgroup {path}")
    try:
        if devices is None:
            devices = cgroup_devices(mounts)
    except OSError as e:
        raise MemoryCgroupError(f"{mounts}: {e.strerror or e}") from None
    try:
        limit = read_cgroup_file(os.path.join(path, V2_FILE if version == 2 else V1_FILE), devices).strip()
        anon, cached = parse_memory_stat(read_cgroup_file(os.path.join(path, "memory.stat"), devices), version)
    except OSError as e:
        raise MemoryCgroupError(f"{e.filename or path}: {e.strerror or e}") from None
    except ValueError as e:
        raise MemoryCgroupError(f"{path}: {e}") from None
    return MemoryCgroup(path, version, limit, anon, cached)


class MemoryCgroupSampler:
    """Each given job's memory cgroup now, and why a job has none."""

    name = "memory"

    def __init__(self, *, proc: str = "/proc", mounts: str = "/proc/mounts"):
        self.proc, self.mounts = proc, mounts

    def sample(self, jobs: Mapping[str, JobPlace]) -> MemoryReading:
        found, unplaced = {}, {}
        try:  # the cgroup filesystems now (observe, don't believe)
            devices = cgroup_devices(self.mounts) if jobs else frozenset()
        except OSError as e:
            return MemoryReading(MappingProxyType({}), MappingProxyType(
                {job: f"{self.mounts}: {e.strerror or e}" for job in jobs}))
        for job, js in sorted(jobs.items()):
            try:
                found[job] = find_memory_cgroup(js, proc=self.proc, mounts=self.mounts, devices=devices)
            except MemoryCgroupError as e:
                unplaced[job] = str(e)
        return MemoryReading(MappingProxyType(found), MappingProxyType(unplaced))
