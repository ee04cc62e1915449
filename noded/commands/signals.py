"""The daemon's signals, handled from its first line.

``noded run`` installs these before it imports anything heavy: until the loop runs,
SIGTERM and SIGINT only ask it to stop and a SIGHUP is remembered as a reload, so no
signal can kill noded half-started (with groups made, cpusets shrunk or an MPS daemon
running) by its default action. This module imports nothing but the standard library and noded.util.signalflag.
"""

from __future__ import annotations

import signal
from typing import Protocol

from noded.util.signalflag import SignalFlag


class Reloadable(Protocol):
    def request_reload(self) -> None: ...


class Signals:
    def __init__(self):
        self.stop = SignalFlag()  # set from a handler: no lock taken (see SignalFlag)
        self._target: Reloadable | None = None
        self._hup_early = False
        self._previous: dict = {}

    def _on_stop(self, *_) -> None:
        self.stop.set()

    def _on_hup(self, *_) -> None:
        if self._target is not None:
            self._target.request_reload()
        else:
            self._hup_early = True

    def install(self) -> "Signals":
        self._previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_stop),
                          signal.SIGINT: signal.signal(signal.SIGINT, self._on_stop),
                          signal.SIGHUP: signal.signal(signal.SIGHUP, self._on_hup)}
        return self

    def attach(self, target: Reloadable) -> None:
        """The daemon exists: a SIGHUP received while starting is a reload now."""
        self._target = target
        if self._hup_early:
            target.request_reload()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
