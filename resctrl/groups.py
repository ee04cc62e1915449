"""Control (CTRL_MON) and monitoring (MON) groups, and the tasks in them.

Every call here is explicit I/O against the resctrl filesystem under ``root``;
nothing is cached except the capabilities read at ``Resctrl.open``. Groups noded
creates carry the owner prefix; groups without it are read but never changed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from resctrl.errors import (
    ForeignGroupError,
    NoSuchTaskError,
    ResctrlError,
    UnsupportedError,
    classify,
)
from resctrl.info import Capabilities, read_capabilities
from resctrl.mbm import MBM_LOCAL, MBM_TOTAL, MbmSample, read_mbm
from resctrl.mounts import find_resctrl_mount
from resctrl.schemata import MB, MbFlavour, Schemata, changed_values, format_schemata, normalize_mb, parse_schemata

DEFAULT_ROOT = "/sys/fs/resctrl"
DEFAULT_PREFIX = "noded-"
_GROUP_DIRS = ("info", "mon_data", "mon_groups")


@dataclass
class TaskMoveResult:
    moved: list[int] = field(default_factory=list)
    vanished: list[int] = field(default_factory=list)  # exited before they could be moved (ESRCH)


class Resctrl:
    """The resctrl filesystem at ``root``.

    ``Resctrl.open(root)`` checks the mount and reads the capabilities once.
    Multi-step operations take ``lock()``: an exclusive flock on the root, as the
    kernel documentation advises for tools sharing resctrl, plus a thread lock.
    """

    def __init__(self, root: str, caps: Capabilities, *, prefix: str = DEFAULT_PREFIX, proc: str = "/proc"):
        if not prefix:
            raise ValueError("an owner prefix is required so foreign groups are never touched")
        self.root = root
        self.caps = caps
        self.prefix = prefix
        self.proc = proc
        self._tlock = threading.RLock()
        self._flock_fd: int | None = None
        self._depth = 0

    @classmethod
    def open(cls, root: str = DEFAULT_ROOT, *, mounts: str = "/proc/mounts", prefix: str = DEFAULT_PREFIX,
             proc: str = "/proc", mb_flavour: MbFlavour | None = None) -> "Resctrl":
        mount = find_resctrl_mount(mounts, root)
        caps = read_capabilities(root, mba_mbps=mount.mba_mbps, mb_flavour=mb_flavour)
        return cls(root, caps, prefix=prefix, proc=proc)

    # ------------------------------------------------------------------ basics
    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        with self._tlock:
            if self._depth == 0:
                fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except OSError:
                    os.close(fd)
                    raise
                self._flock_fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._flock_fd is not None:
                    fcntl.flock(self._flock_fd, fcntl.LOCK_UN)
                    os.close(self._flock_fd)
                    self._flock_fd = None

    def read_last_cmd_status(self) -> str:
        with open(os.path.join(self.root, "info", "last_cmd_status")) as f:
            return f.read().strip()

    def _error(self, op: str, path: str, e: OSError) -> ResctrlError:
        try:
            status = self.read_last_cmd_status()
        except OSError:
            status = ""
        return classify(op, path, e.errno or 0, "" if status == "ok" else status)

    def _write(self, path: str, data: str) -> None:
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as e:
            raise self._error("open", path, e) from None
        try:
            os.write(fd, data.encode())
        except OSError as e:
            raise self._error("write", path, e) from None
        finally:
            os.close(fd)

    def owns(self, name: str) -> bool:
        return name.startswith(self.prefix)

    def _check_owned(self, op: str, path: str, name: str) -> None:
        if not name or "/" in name or "\n" in name or name in (".", ".."):
            raise ValueError(f"invalid resctrl group name {name!r} for {op} {path}: "
                             "one path component without newlines")
        if not self.owns(name):
            raise ForeignGroupError(op, path, status=f"group {name!r} lacks the owner prefix {self.prefix!r}")

    # ------------------------------------------------------------------ groups
    def root_group(self) -> "CtrlGroup":
        return CtrlGroup(self, "", self.root)

    def list_ctrl_groups(self) -> list["CtrlGroup"]:
        """Every CTRL_MON group besides the root, ours or not."""
        if not self.caps.alloc_capable:
            return []
        return [CtrlGroup(self, n, os.path.join(self.root, n)) for n in sorted(os.listdir(self.root))
                if n not in _GROUP_DIRS and os.path.isdir(os.path.join(self.root, n))]

    def ctrl_group(self, name: str) -> "CtrlGroup":
        """Adopt an existing CTRL_MON group by name."""
        path = os.path.join(self.root, name)
        if not name or name in _GROUP_DIRS or not os.path.isdir(path):
            raise ResctrlError("adopt", path, errno.ENOENT, "no such control group")
        return CtrlGroup(self, name, path)

    def create_ctrl_group(self, name: str) -> "CtrlGroup":
        path = os.path.join(self.root, name)
        self._check_owned("mkdir", path, name)
        if not self.caps.alloc_capable:
            raise UnsupportedError("mkdir", path, errno.EPERM, "monitoring-only host: no control groups")
        with self.lock():
            try:
                os.mkdir(path)
            except OSError as e:
                raise self._error("mkdir", path, e) from None
        return CtrlGroup(self, name, path)

    def ensure_ctrl_group(self, name: str) -> "CtrlGroup":
        with self.lock():
            if os.path.isdir(os.path.join(self.root, name)):
                return self.ctrl_group(name)
            return self.create_ctrl_group(name)

    def owned_groups(self) -> list["Group"]:
        """Our groups, MON groups before the CTRL_MON groups that hold them."""
        out: list[Group] = []
        ctrls = [self.root_group()] + self.list_ctrl_groups()
        for ctrl in ctrls:
            out += [m for m in ctrl.list_mon_groups() if self.owns(m.name)]
        out += [c for c in ctrls if c.name and self.owns(c.name)]
        return out

    def remove_orphans(self, keep: Iterable[str] = ()) -> list[str]:
        """Remove our groups whose paths are not in ``keep`` (after a crash); returns removed paths.

        Control groups go first: the kernel frees the monitoring groups inside one and
        moves its tasks to the root with a single rmdir.
        """
        keep_set = set(keep)
        removed = []
        with self.lock():
            for ctrl in [c for c in self.list_ctrl_groups() if self.owns(c.name)]:
                if ctrl.path in keep_set or any(p.startswith(ctrl.path + os.sep) for p in keep_set):
                    mons = [m for m in ctrl.list_mon_groups() if self.owns(m.name) and m.path not in keep_set]
                    for m in mons:
                        m.remove()
                    removed += [m.path for m in mons]
                    continue
                ctrl.remove()
                removed.append(ctrl.path)
            for m in self.root_group().list_mon_groups():
                if self.owns(m.name) and m.path not in keep_set:
                    m.remove()
                    removed.append(m.path)
        return removed


class Group:
    kind = "group"

    def __init__(self, rc: Resctrl, name: str, path: str):
        self.rc = rc
        self.name = name
        self.path = path

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Group) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    # -- tasks
    def read_tasks(self) -> list[int]:
        """Thread ids in this group (for a CTRL_MON group: its MON groups' too)."""
        with open(os.path.join(self.path, "tasks")) as f:
            return [int(line) for line in f.read().split()]

    def add_tasks(self, tids: Iterable[int]) -> TaskMoveResult:
        """Move threads here, one write per id (every kernel accepts that).

        A thread that exited meanwhile (ESRCH) is reported in ``vanished``; any
        other refusal raises with the kernel's reason.
        """
        result = TaskMoveResult()
        path = os.path.join(self.path, "tasks")
        tids = list(tids)
        bad = [t for t in tids if not isinstance(t, int) or t <= 0]
        if bad:
            # 0 would move the writer (noded itself); negatives are never task ids.
            raise ValueError(f"invalid task ids {bad} for {path}: must be positive integers")
        with self.rc.lock():
            try:
                fd = os.open(path, os.O_WRONLY)
            except OSError as e:
                raise self.rc._error("open", path, e) from None
            try:
                for tid in tids:
                    try:
                        os.write(fd, b"%d\n" % tid)
                        result.moved.append(tid)
                    except OSError as e:
                        err = self.rc._error("write", path, e)
                        if isinstance(err, NoSuchTaskError):
                            result.vanished.append(tid)
                            continue
                        raise err from None
            finally:
                os.close(fd)
        return result

    def add_process(self, pid: int) -> TaskMoveResult:
        """Move every thread of a process, including threads started while moving."""
        result = TaskMoveResult()
        done: set[int] = set()
        with self.rc.lock():
            for _ in range(5):
                try:
                    tids = {int(t) for t in os.listdir(f"{self.rc.proc}/{pid}/task")}
                except FileNotFoundError:
                    tids = set()
                if not tids and not done:
                    result.vanished.append(pid)
                    return result
                new = sorted(tids - done)
                if not new:
                    break
                r = self.add_tasks(new)
                result.moved += r.moved
                result.vanished += r.vanished
                done |= tids
        return result

    # -- monitoring
    def read_mbm(self, events: tuple[str, ...] = (MBM_TOTAL, MBM_LOCAL)) -> MbmSample:
        if self.rc.caps.mon is None:
            raise UnsupportedError("read", self.path, status="host has no L3 monitoring")
        return read_mbm(self.path, events)

    def remove(self) -> None:
        self.rc._check_owned("rmdir", self.path, self.name)
        with self.rc.lock():
            try:
                os.rmdir(self.path)
            except OSError as e:
                raise self.rc._error("rmdir", self.path, e) from None


class CtrlGroup(Group):
    kind = "ctrl_mon"

    @property
    def is_root(self) -> bool:
        return self.name == ""

    def read_schemata(self) -> Schemata:
        with open(os.path.join(self.path, "schemata")) as f:
            return parse_schemata(f.read())

    def write_schemata(self, desired: Mapping[str, Mapping[int, int]]) -> Schemata:
        """Apply ``desired`` values, writing only lines that change; returns what was written."""
        self.rc._check_owned("write schemata", self.path, self.name)
        path = os.path.join(self.path, "schemata")
        with self.rc.lock():
            diff = changed_values(self.read_schemata(), desired)
            if diff:
                # One write: the kernel parses every line before applying any.
                self.rc._write(path, format_schemata(diff))
        return diff

    def set_mb(self, value: int | Mapping[int, int]) -> Schemata:
        """Throttle memory bandwidth: one value for every domain, or per domain.

        Values are normalised to what the kernel applies (range, granularity).
        """
        mb = self.rc.caps.mb
        if mb is None:
            raise UnsupportedError("set MB", self.path, status="host has no memory bandwidth allocation")
        domains = self.read_schemata().get(MB, {})
        wanted = value if isinstance(value, Mapping) else {d: value for d in domains}
        return self.write_schemata({MB: {d: normalize_mb(v, mb.limits) for d, v in wanted.items()}})

    def list_mon_groups(self) -> list["MonGroup"]:
        if self.rc.caps.mon is None:
            return []
        base = os.path.join(self.path, "mon_groups")
        return [MonGroup(self.rc, n, os.path.join(base, n), self) for n in sorted(os.listdir(base))]

    def mon_group(self, name: str) -> "MonGroup":
        path = os.path.join(self.path, "mon_groups", name)
        if not os.path.isdir(path):
            raise ResctrlError("adopt", path, errno.ENOENT, "no such monitoring group")
        return MonGroup(self.rc, name, path, self)

    def create_mon_group(self, name: str) -> "MonGroup":
        path = os.path.join(self.path, "mon_groups", name)
        self.rc._check_owned("mkdir", path, name)
        if self.rc.caps.mon is None:
            raise UnsupportedError("mkdir", path, errno.EPERM, "host has no L3 monitoring")
        with self.rc.lock():
            try:
                os.mkdir(path)
            except OSError as e:
                raise self.rc._error("mkdir", path, e) from None
        return MonGroup(self.rc, name, path, self)


class MonGroup(Group):
    kind = "mon"

    def __init__(self, rc: Resctrl, name: str, path: str, parent: CtrlGroup):
        super().__init__(rc, name, path)
        self.parent = parent

    def move_to(self, ctrl: CtrlGroup) -> "MonGroup":
        """Move this MON group (and its tasks) under another control group."""
        self.rc._check_owned("rename", self.path, self.name)
        new_path = os.path.join(ctrl.path, "mon_groups", self.name)
        with self.rc.lock():
            try:
                os.rename(self.path, new_path)
            except OSError as e:
                raise self.rc._error("rename", self.path, e) from None
        return MonGroup(self.rc, self.name, new_path, ctrl)
