"""One noded per host: an exclusive flock on a pid file in the runtime directory."""

from __future__ import annotations

import fcntl
import os


class AlreadyRunning(RuntimeError):
    pass


class InstanceLock:
    def __init__(self, runtime_dir: str, name: str = "noded.pid"):
        self.path = os.path.join(runtime_dir, name)
        self.runtime_dir = runtime_dir
        self._fd: int | None = None

    def acquire(self) -> "InstanceLock":
        os.makedirs(self.runtime_dir, mode=0o755, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(f"noded is already running on this host (pid {other}; lock {self.path})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "InstanceLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
