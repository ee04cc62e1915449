"""The client side of noded's Unix sockets: one line out, one line back, all within
one deadline (not per read). Imports only the standard library: training scripts
import it through noded.colocation.client."""

from __future__ import annotations

import socket
import struct
import time


class ReplyTooLarge(ValueError):
    pass


def request_line(path: str, line: bytes, timeout: float, max_reply: int) -> bytes:
    """Send ``line`` (newline-terminated) to the stream socket at ``path`` and return what
    comes back up to the first newline (or up to the server's close).

    The connect blocks, bounded by SO_SNDTIMEO, so a full listen backlog is waited for
    within the deadline (a socket with a Python timeout fails at once with EAGAIN there).
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
