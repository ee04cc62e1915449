"""What the emulator needs to know about real tasks, read from /proc.

The kernel keeps CLOSID/RMID in each task_struct; the emulator keeps them in a
table keyed by thread id, and uses /proc to tell whether a thread exists, who
owns it, and whether a thread id has been reused (start time changed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskInfo:
    tid: int
    tgid: int
    ppid: int
    uids: tuple[int, int, int]  # real, effective, saved
    start: int  # clock ticks after boot; tells a reused id from the old task


def read_task(proc: str, tid: int) -> TaskInfo | None:
    """The task's identity, or None when no such task exists (any more)."""
    try:
        with open(f"{proc}/{tid}/stat", "rb") as f:
            stat = f.read().decode()
        with open(f"{proc}/{tid}/status", "rb") as f:
            status = f.read().decode()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    ppid = int(fields[1])
    start = int(fields[19])
    tgid = tid
    uids = (0, 0, 0)
    for line in status.splitlines():
        if line.startswith("Tgid:"):
            tgid = int(line.split()[1])
        elif line.startswith("Uid:"):
            parts = line.split()
            uids = (int(parts[1]), int(parts[2]), int(parts[3]))
    return TaskInfo(tid, tgid, ppid, uids, start)


def all_thread_ids(proc: str) -> list[int]:
    """Every thread id in the PID namespace /proc belongs to."""
    tids: list[int] = []
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            tids.extend(int(t) for t in os.listdir(f"{proc}/{entry.name}/task"))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return tids


def threads_of(proc: str, pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"{proc}/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return []


def children_of(proc: str, tid: int) -> list[int]:
    """Direct children of a thread (needs CONFIG_PROC_CHILDREN; empty otherwise).
    /proc/TID works for any thread id, so TID/task/TID is the thread's own entry."""
    try:
        with open(f"{proc}/{tid}/task/{tid}/children") as f:
            return [int(c) for c in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []
