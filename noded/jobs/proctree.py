"""A process tree's processes: a registered job (``JobDiscovery.register``) is a root pid and
every process below it, by parent.

Read each tick for every registered job, the tree is read from the kernel's lists of each
task's children (``/proc/PID/task/TID/children``, ``CONFIG_PROC_CHILDREN``, on in the
distributions' kernels): what it costs follows the tree's processes and threads (one
listing of a process's tasks, one small read per task), not the host's processes. The whole
``/proc/*/stat`` scan (``read_ppids``, each process's parent from its ``stat``) cost a read
for every process of the host each tick (2156 processes: 66 ms of CPU a tick on a busy
2-core VM, ``bench.registered_trees``), where registered jobs are a handful of processes.

The two say the same: a child is listed by the thread that forked it (its ``real_parent``,
whose process ``stat`` names as the parent), a thread's children go to another thread of its
process when it exits, and a process whose parent exits leaves the tree (it is reparented
to init or a subreaper, as ``stat`` then says too). Both read one process after another, so
a process forked while they read may be seen at the next read, not this one.

A root that is a thread's id, not a process's (its status's ``Tgid`` another), is no tree,
as the scan, which lists processes only, said. Bounded: at most ``most`` files a read (the listings and children files of every tree read
together); past that, or where the kernel has no children files, the trees are read from the
whole scan, as before: what it costs is then at most the scan's.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from noded.util.procstat import PPID, stat_fields

#: the files read for all registered trees in one read, before the whole /proc scan is cheaper
TREE_READS = 4096


def read_ppids(proc: str) -> dict[int, int]:
    """pid -> parent pid for every process now (a read of every process's stat)."""
    out = {}
    for name in os.listdir(proc):
        if name.isdigit() and (fields := stat_fields(proc, int(name))) is not None:
            out[int(name)] = int(fields[PPID])
    return out


def descendants(root: int, ppids: dict[int, int]) -> set[int]:
    """``root`` and every process below it, from a ``read_ppids`` (none where it is gone)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = set(), [root] if root in ppids else []
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.add(pid)
            stack.extend(children.get(pid, ()))
    return out


class TreeOverBound(Exception):
    """A tree needs more files than were left to read, or the kernel lists no children
    (no ``CONFIG_PROC_CHILDREN``): read it from the whole scan. ``reads``: the files read
    before that was known."""

    def __init__(self, why: str, reads: int):
        super().__init__(why)
        self.reads = reads


class Tree(NamedTuple):
    pids: set[int]
    reads: int  # the files read: task listings and children files


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        out = b""
        while chunk := os.read(fd, 65536):
            out += chunk
        return out
    finally:
        os.close(fd)


def tree_of(root: int, proc: str = "/proc", most: int = TREE_READS) -> Tree:
    """``root`` and every process below it (none where it is gone), as ``descendants(root,
    read_ppids(proc))`` gives them, from the children files. Raises TreeOverBound past
    ``most`` files, or where the kernel has no children files; OSError where /proc cannot
    be read (never an empty tree)."""
    # a thread's id is no tree: /proc/TID is there (not listed) and lists its process's
    # tasks, where the scan never listed it (only a process's children are processes)
    try:
        status = _read(f"{proc}/{root}/status")
    except (FileNotFoundError, ProcessLookupError):
        return Tree(set(), 1)
    tgid = next((line[5:].strip() for line in status.split(b"\n") if line.startswith(b"Tgid:")), b"")
    if tgid != str(root).encode():
        return Tree(set(), 1)
    pids: set[int] = set()
    stack = [root]
    reads = 1
    while stack:
        pid = stack.pop()
        if pid in pids:
            continue
        if reads >= most:
            raise TreeOverBound(f"more than {most} files", reads)
        reads += 1
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone (or exiting) since its parent listed it: as its stat would be
        pids.add(pid)
        for tid in tids:
            if reads >= most:
                raise TreeOverBound(f"more than {most} files", reads)
            reads += 1
            path = f"{proc}/{pid}/task/{tid}/children"
            try:
                data = _read(path)
            except (FileNotFoundError, ProcessLookupError):
                if os.path.isdir(f"{proc}/{pid}/task/{tid}"):
                    raise TreeOverBound("the kernel lists no task's children (CONFIG_PROC_CHILDREN)", reads) from None
                continue  # the thread exited: its children went to another of its process
            stack.extend(int(c) for c in data.split())
    return Tree(pids, reads)
