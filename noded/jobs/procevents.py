"""New processes as they happen, through the kernel's process-events connector.

pyroute2's ``ProcEventSocket`` subscribes to fork/exec/exit multicast messages.
It needs the initial network namespace and CAP_NET_ADMIN; without them noded
polls instead, and says so once.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from typing import Callable

from ..ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

NewProcess = Callable[[int], None]  # the pid of a process that just exec'd


class ProcessEvents:
    """A thread that calls ``on_new(pid)`` for every exec on the host."""

    def __init__(self, on_new: NewProcess):
        self.on_new = on_new
        self._stop = threading.Event()
        # written to by stop(): the listening thread wakes at once, not at a poll timeout
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread: threading.Thread | None = None
        self._sock = None
        self.unavailable: str | None = None
        self.events = 0
        self._errors = RateLimitedLog(log, interval_s=60.0)

    def start(self, timeout: float = 5.0) -> bool:
        """Subscribe; False (with ``unavailable`` set) where the connector cannot be used."""
        # pyroute2's sockets are bound to the thread (event loop) that made them, so
        # the listening thread creates its own and reports back.
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="noded-procevents", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.unavailable = f"connector did not answer within {timeout}s"
        if self.unavailable:
            log.warning("process_events=unavailable reason=%r; new processes are found by polling only",
                        self.unavailable)
            self._stop.set()
            if not self._thread.is_alive():
                self._close_wake()
            return False
        return True

    def _subscribe(self):
        from pyroute2 import ProcEventSocket

        sock = ProcEventSocket()
        try:
            sock.bind()
            sock.control(listen=True)
        except BaseException:
            sock.close()
            raise
        return sock

    def _run(self) -> None:
        try:
            sock = self._subscribe()
        except Exception as e:  # EPERM outside the initial netns, ECONNREFUSED, missing module…
            self.unavailable = f"{type(e).__name__}: {e}"
            self._ready.set()
            return
        self._sock = sock
        self._ready.set()
        try:
            self._listen(sock)
        finally:
            try:
                sock.close()
            except Exception:
                pass
            self._sock = None

    def _listen(self, sock) -> None:
        # Read datagrams from the socket ourselves and parse them with pyroute2's
        # marshal: its get() buffers messages internally, so select() on the fd
        # would not wake for events already read into that buffer.
        from pyroute2.netlink.connector.cn_proc import ProcEventMarshal

        marshal = ProcEventMarshal()
        fd = sock.fileno()
        if self._stop.is_set():
            return
        poller = select.poll()  # poll, not select: any descriptor number (select stops at 1024)
        poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            ready = {f for f, _ in poller.poll()}
            if fd not in ready:
                continue  # woken by stop()
            try:
                data = os.read(fd, 1 << 16)
            except OSError as e:  # ENOBUFS when the kernel dropped events: polling catches up
                log.debug("process_events read error: %r", e)
                continue
            for msg in marshal.parse(data):
                event = msg.get("event")
                try:
                    # Exec only: a forked child inherits its parent's resctrl group in
                    # the kernel; what needs placing is a process put into a job's
                    # cgroup from outside (a Slurm step, a container) and then exec'd.
                    if event == "PROC_EVENT_EXEC":
                        self.events += 1
                        self.on_new(msg["process_tgid"])
                except Exception:
                    # An exec storm must not become a log storm: once a minute, with a count.
                    self._errors.log(logging.ERROR, "handler", "process_events handler failed", exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # already woken (the pipe is full), or closed by an earlier stop
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._thread is None or not self._thread.is_alive():
            self._close_wake()

    def _close_wake(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
