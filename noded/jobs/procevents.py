"""New processes as they happen, through the kernel's process-events connector.

pyroute2's ``ProcEventSocket`` subscribes to fork/exec/exit multicast messages.
It needs the initial network namespace and CAP_NET_ADMIN; without them noded
polls instead, and says so once.

Every exec on the host is an event, and any user can exec thousands a second. So an
event costs as little as it can before anyone's budget is spent (issue #22): a socket
filter keeps all but exec events in the kernel, an event is parsed with one unpack,
and each uid (the owner of /proc/PID) may have ``per_uid`` new processes a second
looked up and placed at once; the rest are dropped, counted, and left to the next
tick's discovery, which is the source of truth (the exec path only makes a job's new
process monitored a tick sooner). Events are taken in batches, each pid once.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import socket
import struct
import threading
import time
from typing import Callable

from noded.util.ratelimit import RateLimitedLog, TokenBuckets

log = logging.getLogger(__name__)

NewProcess = Callable[[int], None]  # the pid of a process that just exec'd

#: where an event's fields are in a datagram: nlmsghdr (16 bytes), cn_msg (20), then
#: proc_event's what (u32), cpu (u32), timestamp (u64) and, for an exec, pid and tgid
_WHAT_AT = 36
_EXEC_TGID = struct.Struct("=I")
_EXEC_TGID_AT = 56
_NLMSG_LEN = struct.Struct("=I")
PROC_EVENT_EXEC = 0x00000002
#: events a batch takes at most before handling them (then the socket is read again)
BATCH = 1024
#: after a batch, events are left to gather this long before the socket is read again: a
#: storm then costs a wake-up per window, not per event (a new process is placed this
#: much later at most, well within a tick)
WINDOW_S = 0.05
#: new processes per uid and second placed at once by default (config: jobs.exec_events_per_uid)
DEFAULT_PER_UID = 100

# A classic BPF program that keeps only exec events: the kernel drops fork, exit, comm
# and the rest before they wake noded. BPF_ABS loads are big-endian; the event's `what`
# is in host order.
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06
_EXEC_AS_LOADED = int.from_bytes(PROC_EVENT_EXEC.to_bytes(4, "little" if struct.pack("=I", 1)[0] else "big"), "big")
_FILTER = ((_BPF_LD_W_ABS, 0, 0, _WHAT_AT), (_BPF_JEQ_K, 0, 1, _EXEC_AS_LOADED),
           (_BPF_RET_K, 0, 0, 0xFFFFFFFF), (_BPF_RET_K, 0, 0, 0))
_SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)


def keep_only_exec_events(fd: int) -> None:
    """Attach the socket filter (OSError where the kernel refuses it: events are then
    filtered here instead)."""
    insns = (ctypes.c_uint8 * (8 * len(_FILTER)))()
    for i, (code, jt, jf, k) in enumerate(_FILTER):
        struct.pack_into("=HBBI", insns, 8 * i, code, jt, jf, k)
    prog = struct.pack("=HxxxxxxQ" if struct.calcsize("P") == 8 else "=HxxI", len(_FILTER), ctypes.addressof(insns))
    sock = socket.socket(fileno=os.dup(fd))
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, prog)
    finally:
        sock.close()


def exec_pids(data: bytes) -> list[int]:
    """The tgids of the exec events in one datagram (other events and short messages skipped)."""
    out, at, end = [], 0, len(data)
    while at + _EXEC_TGID_AT + 4 <= end:
        (length,) = _NLMSG_LEN.unpack_from(data, at)
        if length < 16 or at + length > end:
            break
        if length >= _EXEC_TGID_AT + 4 and _NLMSG_LEN.unpack_from(data, at + _WHAT_AT)[0] == PROC_EVENT_EXEC:
            out.append(_EXEC_TGID.unpack_from(data, at + _EXEC_TGID_AT)[0])
        at += (length + 3) & ~3
    return out


class ProcessEvents:
    """A thread that calls ``on_new(pid)`` for every exec on the host."""

    def __init__(self, on_new: NewProcess, *, per_uid: float = DEFAULT_PER_UID, proc: str = "/proc",
                 clock: Callable[[], float] = time.monotonic):
        self.on_new = on_new
        self.proc = proc
        self.budget = TokenBuckets(per_uid, clock)  # per uid
        self.dropped = 0  # exec events over their uid's budget: left to the next tick's discovery
        self.filtered_in_kernel = False
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
        try:
            keep_only_exec_events(sock.fileno())
            self.filtered_in_kernel = True
        except OSError as e:
            log.info("process_events: no socket filter (%s): every event is read and skipped here", e)
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
        # Read datagrams from the socket ourselves and parse them here: pyroute2's get()
        # buffers messages internally, so poll() on the fd would not wake for events
        # already read into that buffer, and its parser costs more than a storm allows.
        fd = sock.fileno()
        if self._stop.is_set():
            return
        os.set_blocking(fd, False)
        poller = select.poll()  # poll, not select: any descriptor number (select stops at 1024)
        poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            ready = {f for f, _ in poller.poll()}
            if fd not in ready:
                continue  # woken by stop()
            self._handle(self._batch(fd))
            self._stop.wait(WINDOW_S)

    def _batch(self, fd: int) -> list[int]:
        """The pids that exec'd, read until the socket is empty or BATCH events are in,
        each pid once, and only those within their uid's budget."""
        pids: dict[int, None] = {}
        events = 0
        read, parse, tgid = os.read, exec_pids, _EXEC_TGID.unpack_from
        one_exec_each = self.filtered_in_kernel  # the kernel passed exec events alone, one per datagram
        while events < BATCH:
            try:
                data = read(fd, 1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:  # ENOBUFS when the kernel dropped events: polling catches up
                log.debug("process_events read error: %r", e)
                break
            if one_exec_each and len(data) >= _EXEC_TGID_AT + 4:
                events += 1
                pids[tgid(data, _EXEC_TGID_AT)[0]] = None
            else:
                for pid in parse(data):
                    events += 1
                    pids[pid] = None
        self.events += events
        admitted = []
        take, stat, proc = self.budget.take, os.stat, self.proc
        for pid in pids:
            try:
                uid = stat(f"{proc}/{pid}").st_uid
            except OSError:
                continue  # gone already: nothing to place
            if take(uid):
                admitted.append(pid)
            else:
                self.dropped += 1
        return admitted

    def _handle(self, pids: list[int]) -> None:
        # Exec only: a forked child inherits its parent's resctrl group in the kernel;
        # what needs placing is a process put into a job's cgroup from outside (a Slurm
        # step, a container) and then exec'd.
        for pid in pids:
            try:
                self.on_new(pid)
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
