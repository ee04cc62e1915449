"""The client side of noded's Unix sockets: one line out, one line back, all within
one deadline (not per read). Imports only the standard library: training scripts
import it through noded.colocation.client."""

from __future__ import annotations

import socket
import struct
import time


class ReplyTooLarge(ValueError):
    pass


class NotThePeer(PermissionError):
    """The process listening on the socket is not the user expected."""


_UCRED = struct.Struct("3i")  # pid, uid, gid


def request_line(path: str, line: bytes, timeout: float, max_reply: int, *, peer_uid: int | None = None) -> bytes:
    """Send ``line`` (newline-terminated) to the stream socket at ``path`` and return what
    comes back up to the first newline (or up to the server's close).

    The connect blocks, bounded by SO_SNDTIMEO, so a full listen backlog is waited for
    within the deadline (a socket with a Python timeout fails at once with EAGAIN there).
    With ``peer_uid``, nothing is sent unless the listening process runs as that user
    (SO_PEERCRED): a socket another user put at the path gets no request (NotThePeer).
    Raises TimeoutError when the deadline passes, ReplyTooLarge, or the OSError of the
    connect (FileNotFoundError, PermissionError, ConnectionRefusedError, …).
    """
    deadline = time.monotonic() + timeout

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    buf = b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        left = remaining()
        seconds, micros = int(left), int((left - int(left)) * 1e6)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, micros or not seconds))
        try:
            s.connect(path)
        except BlockingIOError:
            raise TimeoutError from None
        if peer_uid is not None:
            _pid, uid, _gid = _UCRED.unpack(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            if uid != peer_uid:
                raise NotThePeer(f"{path} is served by a process of uid {uid}")
        payload = memoryview(line)
        while payload:
            s.settimeout(remaining())
            payload = payload[s.send(payload):]
        while not buf.endswith(b"\n"):
            s.settimeout(remaining())
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > max_reply:
                raise ReplyTooLarge(f"{path}: a reply larger than {max_reply} bytes")
    return buf
