"""systemd's notify protocol, written out (a datagram to $NOTIFY_SOCKET), so no
libsystemd build is needed: READY=1 after the loop's first round, STATUS= lines,
WATCHDOG=1 from the loop, RELOADING=1 / STOPPING=1 around reloads and stops."""

from __future__ import annotations

import os
import socket
import time
from typing import Mapping

from noded.util.journal import printable


class SystemdNotifier:
    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        path = env.get("NOTIFY_SOCKET", "")
        # An abstract socket is written with a leading '@'.
        self.address = ("\0" + path[1:]) if path.startswith("@") else path
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        ours = not pid or pid == str(os.getpid())
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and ours else None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, **fields: str) -> bool:
        """Send KEY=value lines; False where there is no socket (not under systemd)."""
        if not self.address:
            return False
        # One assignment a line: a newline in a value (a STATUS naming a job, a config
        # key) would be a line of its own, READY=1 or MAINPID= say, and a NUL or an escape
        # sequence would reach `systemctl status`; each is written out as its escape.
        message = "\n".join(f"{k}={printable(str(v))}" for k, v in fields.items()).encode("utf-8", "replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.connect(self.address)
                # never waits: a datagram socket whose reader lags (its queue full) would
                # block a plain send, and with it the loop that sends WATCHDOG=1
                s.send(message, socket.MSG_DONTWAIT)
        except OSError:
            return False  # systemd gone or its queue full: telling it must never stop noded
        return True

    def ready(self, status: str) -> bool:
        return self.notify(READY="1", STATUS=status)

    def status(self, status: str) -> bool:
        return self.notify(STATUS=status)

    def watchdog(self) -> bool:
        return self.watchdog_s is not None and self.notify(WATCHDOG="1")

    def reloading(self) -> bool:
        """RELOADING=1 with the time it began (CLOCK_MONOTONIC, µs), as Type=notify-reload
        wants it; READY=1 says the reload is over."""
        return self.notify(RELOADING="1", MONOTONIC_USEC=str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000))

    def stopping(self) -> bool:
        return self.notify(STOPPING="1")
