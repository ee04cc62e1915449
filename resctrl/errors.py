"""Typed errors. Each carries the errno, the path, and the kernel's own words
from ``info/last_cmd_status`` (empty when the kernel left none)."""

from __future__ import annotations

import errno as errnos
import os


class ResctrlError(Exception):
    def __init__(self, op: str, path: str, err: int | None = None, status: str = ""):
        self.op = op
        self.path = path
        self.errno = err
        self.status = status
        reason = os.strerror(err) if err else "failed"
        detail = f": {status}" if status else ""
        super().__init__(f"{op} {path}: {reason}{detail}")


class NotMountedError(ResctrlError):
    """No resctrl filesystem where one was expected."""


class UnsupportedError(ResctrlError):
    """The host lacks the feature (no MBA, monitoring only, …)."""


class ForeignGroupError(ResctrlError):
    """A group without our name prefix: not ours to create, change or remove."""


class OutOfClosidsError(ResctrlError):
    """ENOSPC "Out of CLOSIDs": every control group slot is taken."""


class OutOfRmidsError(ResctrlError):
    """ENOSPC "Out of RMIDs": every monitoring id is taken."""


class RmidsInLimboError(OutOfRmidsError):
    """EBUSY: the only free RMIDs still wait for their cache occupancy to drain."""


class SchemataError(ResctrlError):
    """The kernel refused a schemata write (EINVAL), nothing was applied."""


class GroupNotFoundError(ResctrlError):
    """ENOENT: the group (or a file in it) is gone, e.g. removed by someone else."""


class TaskMoveError(ResctrlError):
    """A task could not be moved (EPERM, or EINVAL across control groups)."""


class NoSuchTaskError(TaskMoveError):
    """ESRCH: the task exited before it could be moved."""


def classify(op: str, path: str, err: int, status: str) -> ResctrlError:
    """The typed error for a failed syscall on a resctrl path."""
    name = os.path.basename(path)
    if op == "mkdir" and err == errnos.ENOSPC and "CLOSID" in status:
        return OutOfClosidsError(op, path, err, status)
    if op == "mkdir" and err == errnos.EBUSY:
        return RmidsInLimboError(op, path, err, status)
    if op == "mkdir" and err == errnos.ENOSPC:
        return OutOfRmidsError(op, path, err, status)
    if err == errnos.ENOENT and op in ("open", "rmdir", "rename"):
        return GroupNotFoundError(op, path, err, status)
    if name == "schemata" and err == errnos.EINVAL:
        return SchemataError(op, path, err, status)
    if name == "tasks" and err == errnos.ESRCH:
        return NoSuchTaskError(op, path, err, status)
    if name == "tasks":
        return TaskMoveError(op, path, err, status)
    return ResctrlError(op, path, err, status)
