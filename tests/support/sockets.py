"""Talking to noded's sockets as a client would: raw bytes over a Unix stream socket, and
the datagram socket systemd would give noded (NOTIFY_SOCKET)."""

from __future__ import annotations

import socket


def unix_exchange(path, payload: bytes, timeout=5.0) -> bytes:
    """Send raw bytes to a Unix stream socket; what comes back up to a newline or the close."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(payload)
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return buf


class NotifySocket:
    """The datagram socket systemd would give noded (NOTIFY_SOCKET)."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(30)

    def recv(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines())

    def until(self, key, value=None) -> dict[str, str]:
        """The next message with ``key`` (equal to ``value``, if given)."""
        while True:
            message = self.recv()
            if key in message and (value is None or message[key] == value):
                return message

    def ready(self) -> dict[str, str]:
        """The READY message (before it: STATUS=starting, as the handlers are installed)."""
        while True:
            message = self.recv()
            if "READY" in message:
                return message
            assert message == {"STATUS": "starting"}, message

    def close(self):
        self.sock.close()
