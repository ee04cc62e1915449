"""The admin socket: a Unix stream socket in the runtime directory, mode 0660,
owned by root and the admin group. Every peer is checked with SO_PEERCRED (root,
or a member of the admin group) and refused otherwise. One JSON request line, one
JSON reply line, then the connection closes.

With ``reports_only`` it is the report socket training jobs use (mode 0666): it
takes only ``report``, and only from a process of the job reported on, within a
budget per uid and per job (``ReportBudget``): beyond it a report is dropped and
counted, and a uid over its budget has its connections answered late and unread.

The transport is noded.server.stream's bounded server: one thread, a deadline for
the whole request and reply, a size limit, and caps on connections per endpoint and
per uid, so garbage, a silent client or a flood can neither crash, hang nor starve
the daemon. What the commands do is noded.admin.commands.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import socket
import stat
import time
from dataclasses import replace
from typing import Callable

from noded.loop.daemon import Daemon
from noded.server.budget import ADMIN, REPORTS
from noded.util.ratelimit import RateLimitedLog, TokenBuckets
from noded.server.stream import Limits, Peer, Protocol, StreamServer, unix_peer
from noded.admin.commands import AdminCommands
from noded.admin.protocol import RequestError, parse_request, reply_error, reply_ok

log = logging.getLogger(__name__)


def peer_groups(pid: int) -> set[int]:
    """The supplementary groups of a process, from /proc/PID/status read as bytes: its
    Name: line is the process's own choice (prctl PR_SET_NAME), any bytes but NUL, and need
    not be UTF-8 (the kernel escapes only its newlines and backslashes there)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except (FileNotFoundError, ProcessLookupError):
        pass
    return set()


class SocketPathError(OSError):
    """The socket's path holds something noded may not remove; ``strerror`` says what."""

    def __init__(self, reason: str):
        super().__init__(errno.EEXIST, reason)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO")):
        if test(mode):
            return name
    return "a device"


def socket_path_problem(path: str) -> str | None:
    """Why noded may not take ``path`` for a socket (None: nothing is there, or a stale
    socket no process listens on, which noded may remove). Anything else there is not
    noded's to remove: a file, or a socket some process listens on."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot examine {path}: {e.strerror}"
    if not stat.S_ISSOCK(st.st_mode):
        return (f"{path} exists and is {_kind(st.st_mode)}, not a socket: noded removes only a socket no process "
                "listens on, never another file")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return None  # stale: its process is gone
    except OSError as e:
        return f"cannot tell whether a process listens on the socket {path} ({e.strerror or e}): it is left alone"
    finally:
        probe.close()
    return f"a process listens on the socket {path}: it is not noded's to remove"


class ReportBudget:
    """Reports taken per second from one uid (SO_PEERCRED) and for one job; what is over
    either is dropped, and counted by cause. A uid over its budget is told so before
    its request is read: its connections are held unread until its next report would be
    taken (see StreamServer), so a job sending back to back is paced, not served."""

    def __init__(self, per_uid: float = 20, per_job: float = 10, clock: Callable[[], float] = time.monotonic):
        self.per_uid = TokenBuckets(per_uid, clock)
        self.per_job = TokenBuckets(per_job, clock)
        self.dropped = {"uid": 0, "job": 0}  # reports dropped over the uid's budget, over the job's


class AdminServer(Protocol):
    def __init__(self, path: str, daemon: Daemon, *, group: str | None,
                 timeout_s: float = 5.0, wall_clock: Callable[[], float] = time.time,
                 reports_only: bool = False, limits: Limits | None = None, budget: ReportBudget | None = None):
        # reports_only: the socket training jobs use (mode 0666): it takes only `report`,
        # and only from a process of the job reported on.
        self.reports_only = reports_only
        self.budget = (budget or ReportBudget()) if reports_only else None
        self.path = path
        self.timeout_s = timeout_s
        self.wall_clock = wall_clock
        self.limits = limits or replace(REPORTS if reports_only else ADMIN, deadline_s=timeout_s)
        # What commands see of the daemon: its control state, its last result, co-location, right-sizing.
        self.commands = AdminCommands(daemon.control, lambda: daemon.last, daemon.parts.colocation,
                                      wall_clock=wall_clock, rightsize=daemon.parts.rightsize,
                                      registered_labels=daemon.control.registered_labels,
                                      tick_failures=lambda: (daemon.last_failure, daemon.failures_in_a_row))
        self.gid: int | None = None
        if group:
            try:
                self.gid = grp.getgrnam(group).gr_gid
            except KeyError:
                log.warning("admin group %r does not exist: only root may use %s", group, path)
        self.server: StreamServer | None = None
        self._bound: tuple[int, int] | None = None  # (device, inode) of the socket made here: the one stop removes
        self._log = RateLimitedLog(log)

    def start(self) -> "AdminServer":
        """Listen; raises OSError (SocketPathError where the path holds what noded may not
        remove: a file, or a socket a process listens on)."""
        problem = socket_path_problem(self.path)
        if problem:
            raise SocketPathError(problem)
        try:
            os.unlink(self.path)  # a stale socket (or nothing): no process listens on it
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            old = os.umask(0o177)
            try:
                sock.bind(self.path)
            finally:
                os.umask(old)
            made = os.lstat(self.path)
            self._bound = (made.st_dev, made.st_ino)
            if self.reports_only:
                os.chmod(self.path, 0o666)
            elif self.gid is not None:
                os.chown(self.path, 0 if os.geteuid() == 0 else -1, self.gid)
                os.chmod(self.path, 0o660)
            self.server = StreamServer(sock, self, name="report" if self.reports_only else "admin",
                                       limits=self.limits, peer_of=unix_peer).start()
        except BaseException:
            sock.close()
            raise
        return self

    def stop(self) -> None:
        """Stop accepting, answer a request being handled, close every client (bounded: well under a second)."""
        if self.server is not None:
            self.server.stop()
        if self._bound is None:
            return
        try:  # only the socket made here: whatever is at the path now otherwise is not noded's
            now = os.lstat(self.path)
            if stat.S_ISSOCK(now.st_mode) and (now.st_dev, now.st_ino) == self._bound:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._bound = None

    def authorised(self, pid: int, uid: int, gid: int) -> bool:
        if uid == 0:
            return True
        return self.gid is not None and (gid == self.gid or self.gid in peer_groups(pid))

    # ------------------------------------------------------------------ protocol
    def refusal(self, peer: Peer) -> bytes | None:
        if self.reports_only or self.authorised(peer.pid, peer.uid, peer.gid):
            return None
        self._log.log(logging.WARNING, "refused", "admin: refused uid=%d gid=%d pid=%d", peer.uid, peer.gid, peer.pid)
        return reply_error(f"permission denied: uid {peer.uid} is neither root nor in the admin group")

    def framed(self, data: bytearray, new_from: int, eof: bool) -> bytes | None:
        at = data.find(b"\n", new_from)
        if at >= 0:
            return bytes(data[:at])
        return bytes(data) if eof else None  # a client that shut its side down: what it sent is the request

    def respond(self, line: bytes, peer: Peer) -> bytes:
        command = "request"
        try:
            command, args = parse_request(line)
            if self.reports_only and command != "report":
                raise RequestError(f"this socket takes only 'report'; {command!r} goes to the admin socket")
            if self.reports_only and not self.authorised(peer.pid, peer.uid, peer.gid):
                self.commands._check_reporter(args["job"], peer.pid)
            if self.reports_only:  # after the check: no one spends another job's budget
                self._within_job_budget(args["job"])
            return reply_ok(self.commands(command, args, peer))
        except RequestError as e:
            return reply_error(str(e))
        except Exception as e:
            # Whatever failed (an override that could not be saved, a bug), the client is
            # told, and nothing claims it worked.
            log.exception("admin: %s from uid %s failed", command, peer.uid)
            return reply_error(f"{command} failed: {e}")

    def _within_job_budget(self, job: str) -> None:
        if not self.budget.per_job.take(job):
            self.budget.dropped["job"] += 1
            self._log.log(logging.WARNING, "job-budget", "report: dropped a report for job %r: over its %g a second",
                          job, self.budget.per_job.per_s)
            raise RequestError(f"dropped: job {job!r} reports more than {self.budget.per_job.per_s:g} times a second")

    def hold(self, peer: Peer) -> float:
        if self.budget is None:
            return 0.0
        wait = self.budget.per_uid.wait(peer.uid)
        if wait > 0:
            self.budget.dropped["uid"] += 1
            self._log.log(logging.WARNING, "uid-budget", "report: dropped a report from uid %d unread: over its "
                          "%g a second", peer.uid, self.budget.per_uid.per_s)
        return wait

    def dropped(self, peer: Peer) -> bytes:
        return reply_error(f"dropped unread: uid {peer.uid} sends more than {self.budget.per_uid.per_s:g} reports "
                           "a second")

    def too_large(self, limit: int) -> bytes:
        return reply_error(f"request larger than {limit} bytes")

    def timed_out(self, deadline_s: float) -> bytes:
        return reply_error(f"no complete request within {deadline_s:g}s: dropped")

    def evicted(self, peer: Peer, held: int) -> bytes:
        return reply_error(f"dropped: {peer.key} holds the most connections to this socket ({held}), "
                           "and its oldest makes room for a new one")

