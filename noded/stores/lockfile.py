"""One noded per host: locks on what noded shares with every other noded.

``HostLock`` guards the shared things themselves: the resctrl mount and each cgroup
hierarchy noded acts on, one lock file per filesystem in a lock directory
(``/run/noded-locks``), whatever runtime directory each noded was given. It holds no descriptor inside
resctrl (an operator must be able to ``umount`` it while noded runs) and does not
lock resctrl's root directory (the kernel's documentation has tools flock it briefly
around changes; a lifelong lock there would block them).

``InstanceLock`` is the pid file in the runtime directory, for tools that look there.

Both are ``flock(LOCK_EX|LOCK_NB)`` on a file opened through a checked directory with
``O_NOFOLLOW``, holding the holder's pid (a subtree of a filesystem also takes the
filesystem's lock shared: ``HostLock.for_filesystems``); the kernel drops the lock when
the holder dies, however it dies.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat

from noded.stores.securedir import SecureDir, SecureDirError

#: Under /run, which only root may write: no other user can plant a file there before
#: noded first starts (in the world-writable /run/lock anyone could, and keep noded out).
DEFAULT_LOCK_DIR = "/run/noded-locks"
_RETRIES = 5


class AlreadyRunning(RuntimeError):
    pass


class LockFileRefused(RuntimeError):
    """The lock file is not one noded could have made (a link, another user's file, ...)."""


def _holder(fd: int) -> str:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"


def _lock_file(d: SecureDir, name: str, *, shared: bool = False) -> int | str:
    """flock a file in ``d``: its descriptor, or the holder's pid (as text) when another holds it.
    ``shared``: a shared lock, which many hold at once and none writes its pid into.

    The file is ours only if it is a regular file owned by our euid with one link: in a
    sticky shared directory another user may have planted a file, a link or a hard link
    to something of root's, and truncating that would destroy it.
    """
    path = d.file_path(name)
    for _ in range(_RETRIES):
        try:
            fd = d.open(name, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LockFileRefused(f"lock file {path} is a symbolic link; refusing to follow it") from None
            raise LockFileRefused(f"cannot open lock file {path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            why = None
            if not stat.S_ISREG(st.st_mode):
                why = "is not a regular file"
            elif st.st_uid != os.geteuid():
                why = f"is owned by uid {st.st_uid}, not by noded's uid {os.geteuid()} (remove it if no noded runs)"
            elif st.st_nlink != 1:
                why = f"has {st.st_nlink} links, so it is also some other file"
            if why:
                raise LockFileRefused(f"lock file {path} {why}")
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                return holder
            # A holder that released meanwhile may have unlinked the file we opened: the
            # lock is real only on the inode the name still names.
            now = d.lstat(name)
            if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                os.fchmod(fd, 0o644)  # readable for tools, whatever the umask
                if not shared:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise LockFileRefused(f"lock file {path} keeps being replaced while it is locked")


def _subtree_holders(d: SecureDir, name: str) -> str | None:
    """The pids in the subtree locks of filesystem lock ``name`` (``noded-dev-M-m-*.lock``)
    that are held now."""
    prefix = name.removesuffix(".lock") + "-"
    pids = []
    try:
        names = sorted(n for n in os.listdir(d.path) if n.startswith(prefix) and n.endswith(".lock"))
    except OSError:
        return None
    for sub in names:
        try:
            fd = d.open(sub, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            try:  # a file no one holds (its holder gone, even killed) names no one
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                continue
            except BlockingIOError:
                holder = _holder(fd)
        finally:
            os.close(fd)
        if holder != "unknown":
            pids.append(holder)
    return ", ".join(pids) or None


def lock_name(resource: str) -> str:
    """The lock file for a path, escaped as systemd escapes paths into unit names:
    ``/sys/fs/resctrl`` -> ``noded-sys-fs-resctrl.lock``."""
    return f"noded-{_escape(resource)}.lock"


def _escape(resource: str) -> str:
    path = os.path.normpath(os.path.abspath(resource)).strip("/")
    out = []
    for i, ch in enumerate(path):
        if ch == "/":
            out.append("-")
        elif ch.isascii() and (ch.isalnum() or ch in ":_" or (ch == "." and i > 0)):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    escaped = "".join(out) or "-"
    if len(escaped) > 200:  # a file name has at most 255 bytes
        escaped = f"{escaped[:150]}-{hashlib.sha256(path.encode()).hexdigest()[:16]}"
    return escaped


class HostLock:
    """Exclusive, for the daemon's life, on each shared resource (paths, e.g. the resctrl
    mount point and each cgroup root). Raises AlreadyRunning naming the resource and the
    holder's pid; LockFileRefused or SecureDirError when the lock directory or a lock
    file is not safe to use. Lock files are left in place at release: in a sticky,
    world-writable directory a removed name could be taken by another user before the
    next start (and removing it races with a starter that has it open).
    """

    def __init__(self, resources: list[str], lock_dir: str | SecureDir = DEFAULT_LOCK_DIR, *,
                 names: dict[str, tuple[tuple[str, bool], ...]] | None = None):
        # Symbolic links resolved (only by name: nothing inside resctrl is opened), so two
        # spellings of one mount take one lock. ``names``: resource -> the locks it takes,
        # (name, shared), where they are not the resource's path (see for_filesystems).
        self.resources = sorted({os.path.realpath(r) for r in resources})
        self._names = {os.path.realpath(r): n for r, n in (names or {}).items()}
        self.lock_dir = lock_dir
        self._dir: SecureDir | None = None
        self._fds: dict[str, tuple[int, bool]] = {}  # lock file name -> (descriptor, shared)

    @classmethod
    def for_filesystems(cls, paths: list[str], lock_dir: str | SecureDir = DEFAULT_LOCK_DIR) -> "HostLock":
        """Locks per filesystem these paths are on (its device), not per path: a bind mount
        of resctrl, or two cgroup roots in one hierarchy, are one thing to guard. A path at
        its filesystem's root takes the filesystem's lock; a path below takes that lock
        shared and one of its own top directory there: two nodeds on disjoint subtrees of
        one hierarchy (simulated nodes, each with a cgroup of its own) run side by side,
        while one on the whole hierarchy keeps out every other. A path that does not exist
        (resctrl not mounted yet) is locked by its name."""
        names = {}
        for path in paths:
            try:
                dev = os.stat(path).st_dev
            except OSError:
                continue
            fs = f"dev-{os.major(dev)}-{os.minor(dev)}"
            real = os.path.realpath(path)
            mount = real
            while not os.path.ismount(mount) and mount != os.path.dirname(mount):
                mount = os.path.dirname(mount)
            below = os.path.relpath(real, mount)
            names[path] = ((fs, False),) if below == "." else (
                (fs, True), (f"{fs}-{_escape('/' + below.split('/')[0])}", False))
        return cls(paths, lock_dir, names=names)

    def _locks(self, resource: str) -> tuple[tuple[str, bool], ...]:
        """The lock files (name, shared) ``resource`` takes."""
        names = self._names.get(resource)
        return ((lock_name(resource), False),) if names is None else tuple(
            (f"noded-{n}.lock", shared) for n, shared in names)

    def paths(self) -> dict[str, str]:
        """Each resource's own (exclusive) lock file."""
        base = self.lock_dir.path if isinstance(self.lock_dir, SecureDir) else os.path.abspath(self.lock_dir)
        return {r: os.path.join(base, next(n for n, shared in self._locks(r) if not shared)) for r in self.resources}

    def acquire(self) -> "HostLock":
        # Made root's and 0755 where missing; a shared sticky one (/run/lock) is accepted too,
        # its lock files then checked one by one (_lock_file).
        d = self.lock_dir if isinstance(self.lock_dir, SecureDir) else SecureDir(
            self.lock_dir, mode=0o755, create=True, shared=True, what="lock directory")
        wanted: dict[str, bool] = {}  # lock file -> shared (exclusive where any resource wants it so)
        owner: dict[str, str] = {}
        for resource in self.resources:
            for name, shared in self._locks(resource):
                wanted[name] = wanted.get(name, True) and shared
                owner.setdefault(name, resource)
        try:
            for name in sorted(wanted):  # sorted: two starters contend on the same first one
                got = _lock_file(d, name, shared=wanted[name])
                if got == "unknown":  # held shared: by nodeds on subtrees, whose own locks name them
                    got = _subtree_holders(d, name) or got
                if isinstance(got, str):
                    resource = owner[name]
                    what = "" if resource not in self._names else " (the filesystem it is on)"
                    raise AlreadyRunning(f"another noded (pid {got}) holds {resource}{what} (lock {d.file_path(name)})")
                self._fds[name] = (got, wanted[name])
        except BaseException:
            self._close_all()
            if d is not self.lock_dir:
                d.close()
            raise
        self._dir = d
        return self

    def _close_all(self) -> None:
        for fd, shared in self._fds.values():
            if not shared:  # a shared one holds no pid, and others may hold it still
                try:
                    os.ftruncate(fd, 0)  # no stale pid for the next one to report
                except OSError:
                    pass
            os.close(fd)
        self._fds.clear()

    def release(self) -> None:
        self._close_all()
        if self._dir is not None and self._dir is not self.lock_dir:
            self._dir.close()
        self._dir = None

    def __enter__(self) -> "HostLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class InstanceLock:
    """The pid file ``noded.pid`` in the runtime directory (a path, or an open SecureDir;
    a path is created 0755 and checked like any SecureDir). Raises AlreadyRunning."""

    def __init__(self, runtime_dir: str | SecureDir, name: str = "noded.pid"):
        self.runtime_dir = runtime_dir
        base = runtime_dir.path if isinstance(runtime_dir, SecureDir) else os.path.abspath(runtime_dir)
        self.path = os.path.join(base, name)
        self.name = name
        self._dir: SecureDir | None = None
        self._fd: int | None = None

    def acquire(self) -> "InstanceLock":
        d = self.runtime_dir if isinstance(self.runtime_dir, SecureDir) else SecureDir(
            self.runtime_dir, mode=0o755, what="runtime directory")
        try:
            got = _lock_file(d, self.name)
        except BaseException:
            if d is not self.runtime_dir:
                d.close()
            raise
        if isinstance(got, str):
            if d is not self.runtime_dir:
                d.close()
            raise AlreadyRunning(f"noded is already running on this host (pid {got}; lock {self.path})")
        self._dir, self._fd = d, got
        return self

    def release(self) -> None:
        if self._fd is not None and self._dir is not None:
            # Unlinked while still locked: a starter that opened this inode meanwhile sees,
            # after its flock, that the name no longer names it, and starts over.
            try:
                self._dir.unlink(self.name)
            except (OSError, ValueError):  # gone, or its directory already closed by its owner
                pass
            os.close(self._fd)
            self._fd = None
            if self._dir is not self.runtime_dir:
                self._dir.close()
            self._dir = None

    def __enter__(self) -> "InstanceLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def instance_holder(runtime_dir: str, name: str = "noded.pid", locks: str = "/proc/locks") -> str | None:
    """The pid (as text; "unknown" where the file holds none) of the noded that holds the
    pid file in ``runtime_dir`` now; None where none does, or there is no such file or
    directory. Read from the kernel's table of locks: asking takes no lock, so a noded
    starting meanwhile is never told that one runs (``noded check-config`` asks)."""
    try:
        d = SecureDir(runtime_dir, create=False, what="runtime directory")
    except SecureDirError:
        return None
    with d:
        st = d.lstat(name)
        if st is None or not stat.S_ISREG(st.st_mode):
            return None
        # /proc/locks: "1: FLOCK  ADVISORY  WRITE 7450 fe:00:1482757 0 EOF" (major:minor in hex)
        wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        try:
            with open(locks) as f:
                held = any(fields[1] == "FLOCK" and fields[5] == wanted
                           for fields in (line.split() for line in f) if len(fields) > 5)
        except OSError:
            return None
        if not held:
            return None
        try:
            fd = d.open(name, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return "unknown"
        try:
            return _holder(fd)
        finally:
            os.close(fd)


__all__ = ["AlreadyRunning", "DEFAULT_LOCK_DIR", "HostLock", "InstanceLock", "LockFileRefused", "SecureDirError",
           "instance_holder", "lock_name"]
