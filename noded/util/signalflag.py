"""A flag a signal handler may raise: ``threading.Event`` without its lock.

Python runs a signal handler in the main thread between two bytecodes, wherever that
thread is, ``Event.set`` and ``Event.clear`` included. ``Event`` guards itself with a lock
that is not re-entrant, so a handler calling ``set()`` while the main thread is inside one
of its methods (a second SIGTERM or Ctrl-C during the first's ``set``; a SIGHUP during the
loop's ``clear``) waits on a lock its own thread holds, forever: ``noded run --sim`` hung
so at a third SIGTERM. ``set`` here takes no lock: a plain attribute and one byte into a
non-blocking pipe, which is what ``wait`` sleeps on (the pipe stays readable once set, so
every waiter, in any thread, wakes).
"""

from __future__ import annotations

import os
import select


class SignalFlag:
    def __init__(self):
        self._raised = False
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self) -> None:
        self._raised = True
        try:
            os.write(self._w, b"x")
        except (BlockingIOError, OSError):
            pass  # full: a wake-up is pending already (or closed: nothing waits any more)

    def is_set(self) -> bool:
        return self._raised

    def clear(self) -> None:
        self._raised = False  # first: a set() from here on is kept, flag and byte
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False when ``timeout`` seconds passed first (None: no limit)."""
        if not self._raised:
            poll = select.poll()  # not select(): a descriptor numbered past 1023 is fine
            poll.register(self._r, select.POLLIN)
            poll.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999)))
        return self._raised

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
