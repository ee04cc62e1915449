"""Lasting states an alert can see, logged once when each begins and once when it ends.

A state that holds for minutes (noded watching no job source, no GPU, no resctrl;
contention with no CPU job left to throttle) is one line at its start and one at its
end, never one a tick: the journal tells the same story as the alert, and the time it
began, without flooding. A state that lapses for less than ``grace_s`` (contention
flickering around its threshold, a GPU job's utilisation around its margin) has not
ended: its end is logged once it has stayed away that long, with the time it ended.
"""

from __future__ import annotations

from typing import Mapping

from noded.util.journal import log_state


class LastingStates:
    """The states in force (name -> why), as of the last ``update``."""

    def __init__(self) -> None:
        self.now: dict[str, str] = {}
        self._lapsed: dict[str, float] = {}  # state -> when it was last in force, while it is away

    def update(self, states: Mapping[str, str], t: float, grace_s: float = 0.0) -> None:
        """``states``: each state in force at ``t``, with why. Logs those that began (at
        WARNING) and those away for ``grace_s`` or more (at NOTICE, with their reason)."""
        for name in sorted(states.keys() - self.now.keys()):
            log_state(name, True, states[name])
        for name in states:
            self._lapsed.pop(name, None)
        for name in sorted(self.now.keys() - states.keys()):
            since = self._lapsed.setdefault(name, t)
            if t - since >= grace_s:
                log_state(name, False, f"no longer ({grace_s:g}s without it): {self.now[name]}" if grace_s
                          else f"no longer: {self.now[name]}")
                del self._lapsed[name]
        self.now = {**{n: self.now[n] for n in self._lapsed}, **states}
