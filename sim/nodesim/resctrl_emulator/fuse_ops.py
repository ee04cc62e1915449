"""The FUSE adapter: turns VFS requests into ResctrlKernel calls.

Kernfs files (which resctrl's are) report size 0 and generate their text when read
at offset 0, and every write() is one command. We reproduce that with direct I/O
(no page cache between the caller and the kernel model).

A reader of resctrl pays for every request FUSE makes on its behalf, in its own
CPU time, where kernfs answers from the kernel's own structures: a monitor that
reads 200 counters a second would spend as much again walking paths. So entries
and attributes may be cached for ENTRY_TIMEOUT_S (longer than any tick, so a
counter's path is walked through FUSE once, not once per read; kernfs keeps them
for good), and close() sends no FLUSH (flush answers ENOSYS once, and the kernel
stops asking: nothing is ever buffered here to flush). mkdir, rmdir and rename pass
through the VFS, which updates its dentry cache at once; a change made behind it
(a domain going offline) shows in directory listings at once, and opening or
reading a vanished file fails with ENOENT, and so does a stat() of it: the control
socket has the kernel drop what vanished from its caches (``invalidate``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import itertools
import stat
import threading
import time
from typing import Callable

import mfusepy

from nodesim.resctrl_emulator.kernel import KernelError, ResctrlKernel

#: how long the kernel may keep the emulator's entries and attributes (see above)
ENTRY_TIMEOUT_S = 10.0


class _FuseContext(ctypes.Structure):
    _fields_ = [("fuse", ctypes.c_void_p)]  # the first member of libfuse3's struct fuse_context


# the library mfusepy loaded (dlopen hands back the same one)
_LIBFUSE = ctypes.CDLL(ctypes.util.find_library("fuse3") or "libfuse3.so.3")
_LIBFUSE.fuse_get_context.restype = ctypes.POINTER(_FuseContext)
_LIBFUSE.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_LIBFUSE.fuse_invalidate_path.restype = ctypes.c_int


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


class ResctrlOperations(mfusepy.Operations):
    use_ns = True

    def __init__(self, kernel: ResctrlKernel, on_mounted: Callable[[], None]):
        self.kernel = kernel
        self.on_mounted = on_mounted
        self._handles = itertools.count(1)
        self._buffers: dict[int, bytes] = {}
        self._buffers_lock = threading.Lock()
        self._mount_ns = time.time_ns()
        self._fuse: ctypes.c_void_p | None = None

    # -- lifecycle
    def init(self, path: str) -> None:
        # libfuse's handle of this mount, to tell the kernel what vanished behind its back
        self._fuse = ctypes.c_void_p(_LIBFUSE.fuse_get_context().contents.fuse)
        self.on_mounted()

    def invalidate(self, paths: list[str]) -> None:
        """Drop ``paths`` (vanished behind the VFS: a domain gone offline) from the kernel's
        attribute cache, so a stat() of them or of anything below fails with ENOENT at once,
        as on kernfs. Not from a FUSE request's handler, nor under the kernel model's lock."""
        if self._fuse is None:
            return
        for path in paths:
            # -ENOENT where the kernel never looked the path up: nothing cached to drop
            _LIBFUSE.fuse_invalidate_path(self._fuse, path.encode())

    # -- metadata
    def getattr(self, path: str, fh=None) -> dict:
        with self.kernel.lock:
            node = self.kernel.lookup(_parts(path))
        if node.is_dir:
            mode, nlink = stat.S_IFDIR | 0o755, 2
        else:
            mode, nlink = stat.S_IFREG | (0o644 if node.writable else 0o444), 1
        t = self._mount_ns
        return {"st_mode": mode, "st_nlink": nlink, "st_size": 0, "st_uid": 0, "st_gid": 0,
                "st_atime": t, "st_mtime": t, "st_ctime": t}

    def readdir(self, path: str, fh) -> list[str]:
        with self.kernel.lock:
            return [".", "..", *self.kernel.readdir(_parts(path))]

    def statfs(self, path: str) -> dict:
        return {"f_bsize": 4096, "f_namemax": 255}

    # -- files
    def open(self, path: str, fi) -> int:
        with self.kernel.lock:
            node = self.kernel.lookup(_parts(path))
        if node.is_dir:
            raise KernelError(errno.EISDIR)
        fi.direct_io = 1
        fi.fh = next(self._handles)
        return 0

    def read(self, path: str | None, size: int, offset: int, fi) -> bytes:
        if path is None:
            # libfuse names no path for a file whose directory was removed while it was open;
            # kernfs answers a removed node's open file with ENODEV
            raise KernelError(errno.ENODEV)
        with self._buffers_lock:
            data = self._buffers.get(fi.fh)
        if offset == 0 or data is None:
            # seq_file semantics: reading from the start generates the text anew.
            with self.kernel.lock:
                data = self.kernel.read(_parts(path)).encode()
            with self._buffers_lock:
                self._buffers[fi.fh] = data
        return data[offset : offset + size]

    def write(self, path: str | None, data: bytes, offset: int, fi) -> int:
        if path is None:  # as read: the file's directory was removed while it was open
            raise KernelError(errno.ENODEV)
        uid, _gid, pid = mfusepy.fuse_get_context()
        with self.kernel.lock:
            return self.kernel.write(_parts(path), data, pid, uid)

    def truncate(self, path: str, length: int, fh=None) -> int:
        # O_TRUNC from a shell redirection; kernfs ignores it.
        with self.kernel.lock:
            self.kernel.lookup(_parts(path))
        return 0

    def release(self, path: str, fi) -> int:
        with self._buffers_lock:
            self._buffers.pop(fi.fh, None)
        return 0

    def flush(self, path: str, fi) -> int:
        # Nothing is buffered (direct I/O, every write() is one command): ENOSYS tells
        # the kernel never to send FLUSH again, so close() costs no round trip.
        raise KernelError(errno.ENOSYS)

    # -- directories
    def mkdir(self, path: str, mode: int) -> int:
        with self.kernel.lock:
            self.kernel.mkdir(_parts(path))
        return 0

    def rmdir(self, path: str) -> int:
        with self.kernel.lock:
            self.kernel.rmdir(_parts(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        with self.kernel.lock:
            self.kernel.rename(_parts(old), _parts(new))
        return 0

    # -- what kernfs refuses
    def create(self, path: str, mode: int, fi=None) -> int:
        raise KernelError(errno.EACCES)

    def mknod(self, path: str, mode: int, dev: int) -> int:
        raise KernelError(errno.EACCES)

    def unlink(self, path: str) -> int:
        raise KernelError(errno.EPERM)

    def chmod(self, path: str, mode: int) -> int:
        raise KernelError(errno.EPERM)

    def chown(self, path: str, uid: int, gid: int) -> int:
        raise KernelError(errno.EPERM)

    def utimens(self, path: str, times=None) -> int:
        return 0
