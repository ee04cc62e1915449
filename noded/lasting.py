"""Lasting states an alert can see, logged once when each begins and once when it ends.

A state that holds for minutes (noded watching no job source, no GPU, no resctrl;
contention with no CPU job left to throttle) is one line at its start and one at its
end, never one a tick: the journal tells the same story as the alert, and the time it
began, without flooding.
"""

from __future__ import annotations

from typing import Mapping

from .journal import log_state


class LastingStates:
    """The states in force at the last ``update`` (name -> why)."""

    def __init__(self) -> None:
        self.now: dict[str, str] = {}

    def update(self, states: Mapping[str, str]) -> None:
        """``states``: each state in force this tick, with why. Logs those that began
        (at WARNING) and those that ended (at NOTICE, with the reason they had)."""
        for name in sorted(states.keys() - self.now.keys()):
            log_state(name, True, states[name])
        for name in sorted(self.now.keys() - states.keys()):
            log_state(name, False, f"no longer: {self.now[name]}")
        self.now = dict(states)
