"""``/proc/PID/cgroup`` parsed as bytes, by the kernel's grammar.

The kernel writes one record per cgroup hierarchy (``proc_cgroup_show`` in
kernel/cgroup/cgroup.c)::

    <hierarchy id>:<controller>[,<controller>...][,name=<name>]:<path>\\n

``0::<path>`` for the v2 (unified) hierarchy; every hierarchy the kernel has appears
exactly once, in every process's file alike (the loop runs over all hierarchies, not
over the reader's). The path is printed raw: a cgroup's name is any bytes but ``/`` and
NUL (kernels before 5.2 allowed ``\\n`` too; later ones refuse it at mkdir and rename
with EINVAL), and whoever owns a delegated subtree names its cgroups. So:

* Lines are split on ``\\n`` only (``\\r``, ``\\v``, ``\\x1c``-``\\x1e``, U+2028 are
  part of a name: ``str.splitlines`` would take them for line ends, and a name holding
  ``\\r3:cpuset:/<another job's path>`` would be read as that job's record).
* A line is a record only where it begins with the prefix (``<id>:<controllers>:``) of
  a hierarchy the kernel has, as read from a process whose cgroups no tenant names
  (noded's own, else PID 1's). Any other line continues the path before it (a name
  holding ``\\n`` on an older kernel).
* A hierarchy's prefix seen twice means a name carries a forged record: which one is
  the kernel's cannot be told, so the file is refused (``AmbiguousProcCgroup``) and the
  process is attributed to no job. A hierarchy missing, a path not starting with ``/``,
  a file not ending with ``\\n`` or larger than any the kernel writes are refused too.
  Nothing is ever guessed: a forged line is never taken as real.
* Paths are decoded as ``os.fsdecode`` does (surrogateescape), so that they compare
  equal to the directory names ``os.scandir`` gives for the same cgroups.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from dataclasses import dataclass
from typing import Mapping

#: No /proc/PID/cgroup the kernel writes comes near this: each path is at most PATH_MAX
#: (longer ones fail the read with ENAMETOOLONG), and there are a few dozen hierarchies.
MAX_BYTES = 1 << 20

# A record's prefix as the kernel prints it: a decimal hierarchy id, the controllers'
# names (subsystems are [a-z0-9_]; a named hierarchy's name is [A-Za-z0-9_.-], checked
# at mount by cgroup1_parse_param), comma-separated; empty for v2.
_CONTROLLER = rb"(?:[a-z0-9_]+|name=[A-Za-z0-9_.-]+)"
_PREFIX = re.compile(rb"(?:0|[1-9][0-9]{0,9}):(?:%s(?:,%s)*)?:" % (_CONTROLLER, _CONTROLLER))

#: errors that mean the process is gone (or was never there): it belongs to no job
_GONE = frozenset({errno.ENOENT, errno.ESRCH})


class ProcCgroupError(Exception):
    """A /proc/PID/cgroup that cannot be read or is not the kernel's grammar: the
    process is attributed to no job. ``path`` is the file; ``reason`` says why (the
    kernel's own message where a read failed)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class AmbiguousProcCgroup(ProcCgroupError):
    """A hierarchy's record appears twice: a cgroup name carries a forged record."""


class MissingHierarchy(ProcCgroupError):
    """A hierarchy the kernel has (as last read) has no record in the file."""


@dataclass(frozen=True)
class ProcCgroup:
    """One parsed file: controller ('' for v2, ``name=<name>`` for a named hierarchy)
    -> the process's cgroup path there, relative to the hierarchy's root."""

    paths: Mapping[str, str]
    #: a continuation line that reads like the record of a hierarchy not in the list the
    #: file was parsed against: a name holding one, or a hierarchy mounted since the list
    #: was read (the reader reads the list again and parses once more)
    unknown_record: bool = False


def _prefix_of(line: bytes) -> bytes | None:
    m = _PREFIX.match(line)
    return m.group() if m else None


def parse_hierarchies(data: bytes, where: str) -> frozenset[bytes]:
    """The record prefixes (``b"3:cpuset:"``, ``b"0::"``) of a /proc/PID/cgroup whose
    paths no tenant names (noded's own, or PID 1's). Raises ProcCgroupError where a
    hierarchy id or controller appears twice or there is no record at all."""
    _check_frame(data, where)
    prefixes: set[bytes] = set()
    ids: set[bytes] = set()
    controllers: set[bytes] = set()
    for line in data[:-1].split(b"\n"):
        prefix = _prefix_of(line)
        if prefix is None or line[len(prefix):len(prefix) + 1] != b"/":
            continue  # the path before it holds a newline: a name's, not a record
        hid, names = prefix[:-1].split(b":")
        listed = names.split(b",") if names else [b""]
        if hid in ids or controllers.intersection(listed):
            raise AmbiguousProcCgroup(where, f"hierarchy {hid.decode()} or one of its controllers is listed twice")
        ids.add(hid)
        controllers.update(listed)
        prefixes.add(prefix)
    if not prefixes:
        raise ProcCgroupError(where, "no hierarchy's record in it")
    return frozenset(prefixes)


def _check_frame(data: bytes, where: str) -> None:
    if len(data) > MAX_BYTES:
        raise ProcCgroupError(where, f"larger than {MAX_BYTES} bytes, more than the kernel writes")
    if not data.endswith(b"\n"):
        raise ProcCgroupError(where, "does not end with a newline (not the kernel's output)")


def parse_proc_cgroup(data: bytes, hierarchies: frozenset[bytes], where: str) -> ProcCgroup:
    """A process's cgroups from its /proc/PID/cgroup (``data``), against the hierarchies
    the kernel has (``parse_hierarchies``). Raises ProcCgroupError (see the module)."""
    _check_frame(data, where)
    records: dict[bytes, list[bytes]] = {}
    current: list[bytes] | None = None
    unknown = False
    for line in data[:-1].split(b"\n"):
        prefix = _prefix_of(line)
        if prefix is None or prefix not in hierarchies:
            if current is None:
                raise ProcCgroupError(where, "does not begin with a hierarchy's record")
            current.append(line)  # the path before it holds a newline
            unknown |= prefix is not None and line[len(prefix):len(prefix) + 1] == b"/"
            continue
        if prefix in records:
            raise AmbiguousProcCgroup(where, f"the record of hierarchy {prefix[:-1].decode()!r} appears twice (a "
                                      "cgroup name holds a forged one); attributed to no job")
        current = records[prefix] = [line[len(prefix):]]
    missing = hierarchies - records.keys()
    if missing:
        raise MissingHierarchy(where, f"no record of hierarchy {sorted(missing)[0][:-1].decode()!r}")
    paths: dict[str, str] = {}
    for prefix, parts in records.items():
        path = b"\n".join(parts)
        if not path.startswith(b"/"):
            raise ProcCgroupError(where, f"the path of hierarchy {prefix[:-1].decode()!r} does not begin with '/'")
        names = prefix[:-1].split(b":")[1]
        for controller in names.split(b",") if names else [b""]:
            paths[controller.decode("ascii")] = os.fsdecode(path)
    return ProcCgroup(paths, unknown)


def read_bounded(path: str, limit: int = MAX_BYTES) -> bytes:
    """A /proc file whole, up to ``limit`` + 1 bytes (a longer one is refused by the
    parser). The first read takes the kernel's whole output at once (seq_file renders it
    in one go), so the record is one moment's."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class ProcCgroups:
    """Reads processes' /proc/PID/cgroup under ``proc``, each checked against the
    hierarchies the kernel has, read once from noded's own file (``self``, else PID 1's
    where ``proc`` is another PID namespace's) and again when a file says they changed
    (a hierarchy mounted or gone). Thread-safe."""

    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self._lock = threading.Lock()
        self._hierarchies: frozenset[bytes] | None = None

    def hierarchies(self, *, again: bool = False) -> frozenset[bytes]:
        with self._lock:
            if self._hierarchies is None or again:
                self._hierarchies = self._read_hierarchies()
            return self._hierarchies

    def _read_hierarchies(self) -> frozenset[bytes]:
        for who in ("self", "1"):
            path = f"{self.proc}/{who}/cgroup"
            try:
                return parse_hierarchies(read_bounded(path), path)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise ProcCgroupError(path, e.strerror or str(e)) from None
        raise ProcCgroupError(f"{self.proc}/self/cgroup", "neither noded's own nor PID 1's cgroups can be read")

    def of(self, pid: int) -> dict[str, str]:
        """Controller ('' for v2) -> the process's cgroup path; {} where the process is
        gone. Raises ProcCgroupError where its file is unreadable or not the kernel's."""
        path = f"{self.proc}/{pid}/cgroup"
        try:
            data = read_bounded(path)
        except OSError as e:
            if e.errno in _GONE:
                return {}
            raise ProcCgroupError(path, e.strerror or str(e)) from None
        known = self.hierarchies()
        try:
            parsed = parse_proc_cgroup(data, known, path)
        except MissingHierarchy:
            parsed = None  # a hierarchy may be gone since the list was read
        if parsed is not None and not parsed.unknown_record:
            return dict(parsed.paths)
        # The list of hierarchies may be stale: read it again, and parse against it once
        # more. Whatever still does not fit is refused (missing) or is a name's (unknown).
        again = self.hierarchies(again=True)
        if parsed is not None and again == known:
            return dict(parsed.paths)
        return dict(parse_proc_cgroup(data, again, path).paths)
