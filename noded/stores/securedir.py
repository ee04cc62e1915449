"""A directory noded keeps files in, that no other local user can turn against it.

The state directory (``/var/lib/noded``) and the runtime directory (``/run/noded``) are
paths an operator chooses. Like OpenSSH's StrictModes, a directory is accepted only if
nobody but root and noded's own uid can change what its path names: every ancestor is
owned by root or the euid and not writable by group or others unless sticky, a symbolic
link on the way is followed only where such a user could have made it, and the directory
itself is owned by the euid and not writable by group or others. It is then opened
once (``O_DIRECTORY|O_NOFOLLOW``) and every file operation goes through that descriptor
with ``O_NOFOLLOW``: a link planted inside is never followed, a temp file is created
``O_EXCL``, reads are bounded and take regular files only.

A lock directory such as ``/run/lock`` is shared on purpose (world-writable, sticky):
``SecureDir(..., shared=True)`` accepts that, and the files in it are then checked one
by one by their users (``noded.stores.lockfile``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
from typing import Any, Callable, TypeVar

log = logging.getLogger(__name__)

#: The largest state file noded reads; a bigger one is corrupt, not a reason to run out of memory.
MAX_FILE_BYTES = 16 * 1024 * 1024
_MAX_SYMLINKS = 40  # as the kernel's path walk
_PROBE = ".noded-probe"

T = TypeVar("T")


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: What ``read_json`` returns for a file that does not exist (``null`` is a JSON value).
ABSENT: Any = _Absent()


class SecureDirError(Exception):
    """The directory could not be opened as asked; ``reason`` says exactly why."""

    def __init__(self, what: str, path: str, reason: str):
        super().__init__(f"{what} {path}: {reason}")
        self.what, self.path, self.reason = what, path, reason


class UnsafeDirectory(SecureDirError):
    """Refused: another user could change what the path names, or the files in it."""


class DirectoryMissing(SecureDirError):
    pass


class StateFileError(ValueError):
    """A file's content cannot be trusted: not a regular file, too large, not JSON, wrong shape."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


class StateReadError(Exception):
    """The file could not be read (an I/O error, not its content): nothing is assumed about it."""

    def __init__(self, path: str, error: OSError):
        super().__init__(f"could not read {path}: {error.strerror or error}")
        self.path, self.errno, self.strerror = path, error.errno, error.strerror


class StateWriteError(Exception):
    """A write did not happen; the file keeps its old content. Carries the OS's message."""

    def __init__(self, path: str, step: str, error: OSError):
        super().__init__(f"could not write {path} ({step}): {error.strerror or error}")
        self.path, self.step, self.errno, self.strerror = path, step, error.errno, error.strerror


def _mode(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}"


def _writable_by_others(st: os.stat_result) -> str | None:
    """Who besides the owner may create, rename and remove entries, or None."""
    who = [w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if st.st_mode & bit]
    return " and ".join(who) or None


def _split(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


class SecureDir:
    """An open, checked directory; file names given to its methods are single components.

    ``mode`` is given to a directory noded creates (0700 for state, 0755 for the runtime
    directory whose report socket jobs reach); an existing one keeps its mode if safe.
    """

    def __init__(self, path: str, *, mode: int = 0o700, create: bool = True, what: str = "state directory",
                 shared: bool = False, wall_clock: Callable[[], float] = time.time):
        self.fd: int | None = None
        if not path:
            raise SecureDirError(what, repr(path), "the path is empty")
        self.path = os.path.abspath(path)
        self.what = what
        self.shared = shared
        self.wall_clock = wall_clock
        self._euid = os.geteuid()
        self._probing = threading.Lock()  # one probe file: one probe at a time
        #: writes that failed here so far (whoever made them): a reader of whether the
        #: directory is writable learns of a failure at once, not at its next probe
        self.failed_writes = 0
        real, st = self._resolve(create, mode)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise SecureDirError(what, self.path, f"cannot open {real}: {e.strerror}") from None
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            raise UnsafeDirectory(what, self.path, f"{real} changed while it was checked")
        self.real_path = real
        self.fd = fd

    # -- opening: the path walk
    def _refuse(self, reason: str) -> UnsafeDirectory:
        return UnsafeDirectory(self.what, self.path, f"refused: {reason}")

    def _check_owner(self, where: str, st: os.stat_result) -> None:
        if st.st_uid not in (0, self._euid):
            raise self._refuse(f"{where} is owned by uid {st.st_uid}, not by root or noded's uid {self._euid}")

    def _check_ancestor(self, where: str, st: os.stat_result) -> None:
        self._check_owner(where, st)
        others = _writable_by_others(st)
        if others and not st.st_mode & stat.S_ISVTX:
            raise self._refuse(f"{where} is writable by {others} ({_mode(st)}) and not sticky, "
                               f"so another user could replace what is inside it")

    def _check_final(self, where: str, st: os.stat_result) -> None:
        if not stat.S_ISDIR(st.st_mode):
            raise self._refuse(f"{where} is not a directory")
        if self.shared:
            self._check_ancestor(where, st)
            return
        if st.st_uid != self._euid:
            raise self._refuse(f"{where} is owned by uid {st.st_uid}, not by noded's uid {self._euid}")
        others = _writable_by_others(st)
        if others:
            raise self._refuse(f"{where} is writable by {others} ({_mode(st)})")

    def _mkdir(self, where: str, mode: int) -> os.stat_result:
        try:
            os.mkdir(where, mode)
        except FileExistsError:
            pass  # made meanwhile: checked below like any other
        except OSError as e:
            raise SecureDirError(self.what, self.path, f"cannot create {where}: {e.strerror}") from None
        else:
            # mkdir's mode passes through the umask; the mode asked for is the one wanted.
            try:
                fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    if os.fstat(fd).st_uid == self._euid:
                        os.fchmod(fd, mode)
                finally:
                    os.close(fd)
            except OSError as e:
                raise SecureDirError(self.what, self.path, f"cannot set the mode of {where}: {e.strerror}") from None
        try:
            return os.lstat(where)
        except OSError as e:
            raise SecureDirError(self.what, self.path, f"cannot examine {where}: {e.strerror}") from None

    def _resolve(self, create: bool, mode: int) -> tuple[str, os.stat_result]:
        """Walk the path from /, checking each step as the kernel will take it."""
        current = "/"
        st = os.lstat(current)
        self._check_ancestor(current, st)
        todo = _split(self.path)
        links = 0
        while todo:
            name = todo.pop(0)
            if name == "..":
                current = os.path.dirname(current)
                st = os.lstat(current)
                continue
            where = os.path.join(current, name)
            try:
                st = os.lstat(where)
            except FileNotFoundError:
                if not create:
                    raise DirectoryMissing(self.what, self.path, f"{where} does not exist") from None
                st = self._mkdir(where, mode if not todo else 0o755)
            except OSError as e:
                raise SecureDirError(self.what, self.path, f"cannot examine {where}: {e.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                # Followed only if root or noded made it: its directory passed the checks,
                # but in a sticky one any user may create a link.
                self._check_owner(f"{where} (a symbolic link)", st)
                links += 1
                if links > _MAX_SYMLINKS:
                    raise SecureDirError(self.what, self.path, f"too many symbolic links at {where}")
                try:
                    target = os.readlink(where)
                except OSError as e:
                    raise SecureDirError(self.what, self.path, f"cannot read the link {where}: {e.strerror}") from None
                if target.startswith("/"):
                    current = "/"
                todo = _split(target) + todo
                continue
            if todo:
                if not stat.S_ISDIR(st.st_mode):
                    raise SecureDirError(self.what, self.path, f"{where} is not a directory")
                self._check_ancestor(where, st)
            current = where
        self._check_final(current, st)
        return current, st

    # -- lifetime
    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> "SecureDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SecureDir({self.path!r})"

    # -- files
    def file_path(self, name: str) -> str:
        """The path of a file in the directory, for messages (operations use the descriptor)."""
        return os.path.join(self.path, name)

    def _dirfd(self, name: str) -> int:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a file name in {self.path}")
        if self.fd is None:
            raise ValueError(f"{self.path} is closed")
        return self.fd

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        """``os.open`` of a file in the directory, never following a link (for lock files)."""
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self._dirfd(name))

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self._dirfd(name), follow_symlinks=False)
        except FileNotFoundError:
            return None

    def unlink(self, name: str) -> bool:
        """Remove a name (a link is removed, never followed); False when there was none."""
        try:
            os.unlink(name, dir_fd=self._dirfd(name))
        except FileNotFoundError:
            return False
        return True

    def read_bytes(self, name: str, limit: int = MAX_FILE_BYTES) -> bytes | None:
        """A regular file's bytes; None when there is no such file.

        Raises StateFileError when the name is not a regular file or holds more than
        ``limit`` bytes, StateReadError when reading fails.
        """
        path = self.file_path(name)
        dirfd = self._dirfd(name)
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateReadError(path, e) from None
        if stat.S_ISLNK(st.st_mode):
            try:
                to = f" (to {os.readlink(name, dir_fd=dirfd)!r})"
            except OSError:
                to = ""
            raise StateFileError(path, f"a symbolic link{to}, not a regular file")
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError(path, "not a regular file")
        if st.st_size > limit:
            raise StateFileError(path, f"too large ({st.st_size} bytes; at most {limit} are read)")
        try:
            # O_NONBLOCK: should it have become a FIFO since the stat, the open does not hang.
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise StateFileError(path, "a symbolic link, not a regular file") from None
            raise StateReadError(path, e) from None
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise StateFileError(path, "replaced while it was read")
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as e:
            raise StateReadError(path, e) from None
        finally:
            os.close(fd)
        if size > limit:
            raise StateFileError(path, f"too large (more than {limit} bytes)")
        return b"".join(chunks)

    def read_json(self, name: str, limit: int = MAX_FILE_BYTES) -> Any:
        """The JSON value in a file; ABSENT when there is no such file. StateFileError if not JSON."""
        data = self.read_bytes(name, limit)
        if data is None:
            return ABSENT
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise StateFileError(self.file_path(name), f"not valid JSON ({str(e)[:200]})") from None

    def write_bytes(self, name: str, data: bytes, mode: int = 0o600) -> None:
        """Replace a file atomically and durably: a temp file created O_EXCL, written, fsync'd,
        renamed over the name, the directory fsync'd. A crash leaves the old or the new file.

        Raises StateWriteError (with the OS's message) and leaves the old file as it was.
        """
        try:
            self._write_bytes(name, data, mode)
        except StateWriteError:
            self.failed_writes += 1
            raise

    def _write_bytes(self, name: str, data: bytes, mode: int) -> None:
        path = self.file_path(name)
        dirfd = self._dirfd(name)
        tmp = f"{name}.tmp"
        step = f"removing a stale {tmp}"
        try:
            self.unlink(tmp)  # an earlier crash's, or a link someone planted: unlink does not follow it
            step = f"creating {tmp}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dirfd)
            try:
                step = f"writing {tmp}"
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                step = f"fsync of {tmp}"
                os.fsync(fd)
            finally:
                os.close(fd)
            step = f"renaming {tmp} over {name}"
            os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except OSError as e:
            if not step.startswith(("removing", "creating")):
                try:
                    self.unlink(tmp)
                except OSError:
                    pass
            raise StateWriteError(path, step, e) from None
        try:
            os.fsync(dirfd)
        except OSError as e:
            raise StateWriteError(path, "fsync of the directory after the rename", e) from None

    def write_json(self, name: str, data: Any, mode: int = 0o600) -> None:
        """``write_bytes`` of ``data`` as JSON; raises StateWriteError."""
        self.write_bytes(name, json.dumps(data, indent=1, sort_keys=True).encode() + b"\n", mode)

    def move_aside(self, name: str) -> str:
        """Rename a file to ``<name>.corrupt-<UTC time>``; returns the new name. Raises OSError."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.wall_clock()))
        dirfd = self._dirfd(name)
        for n in range(100):
            aside = f"{name}.corrupt-{stamp}" + (f"-{n}" if n else "")
            if self.lstat(aside) is None:
                os.rename(name, aside, src_dir_fd=dirfd, dst_dir_fd=dirfd)
                os.fsync(dirfd)
                return aside
        raise FileExistsError(errno.EEXIST, f"{name}.corrupt-{stamp}-0..99 all exist")

    def load_json(self, name: str, what: str, parse: Callable[[Any], T]) -> tuple[T | None, str | None]:
        """A state file through ``parse`` (which raises ValueError on a wrong shape).

        Returns (value, None); (None, None) when there is no file; and when the file
        cannot be trusted, moves it aside, logs at ERROR and returns (None, note) with
        what was wrong and where the file went. Raises StateReadError on an I/O error:
        a file that could not be read is not assumed corrupt (nor empty, to be overwritten).
        """
        try:
            raw = self.read_json(name)
            if raw is ABSENT:
                return None, None
            return parse(raw), None
        except StateFileError as e:
            problem = e.problem
        except (ValueError, TypeError, RecursionError) as e:
            problem = f"not {what} ({str(e)[:300]})"
        try:
            aside = self.move_aside(name)
            where = f"moved aside to {self.file_path(aside)}"
        except OSError as e:
            where = f"could not be moved aside ({e.strerror or e}), left in place"
        note = f"{self.file_path(name)} is corrupt: {problem}; {where}; noded starts without {what}"
        log.error("%s", note)
        return None, note

    def probe(self) -> str | None:
        """Whether a file can be written and made durable here now: None, or the reason not."""
        with self._probing:
            try:
                self.write_bytes(_PROBE, b"noded\n")
            except StateWriteError as e:
                return str(e)
            try:
                self.unlink(_PROBE)
            except OSError as e:
                return f"could not remove {self.file_path(_PROBE)}: {e.strerror}"
        return None
