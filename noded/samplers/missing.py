"""Inputs that could not be measured, logged once when each goes missing and once when it is back.

``noded_inputs_missing`` and a failing sampler fire NodedBlind after five minutes, and the
alert sends the operator to the journal; there a failing sampler said itself every tick,
and a GPU or an L3 domain that could not be read said nothing at all. Here each input
missing from the Sample (``Sample.missing``: "gpu 0: …", "sampler nvml: …", "node bandwidth
on L3 domain 1") is one line when it goes missing, with why, and one when it has been back
for ``grace_s``, never a line a tick; one missing for less than ``grace_s`` is not said
at all (a counter's first reading has no rate yet; a resctrl remount costs one). An input is known by what its entry names before its first ": ", so a reason that changes
while it stays missing is not a new episode.

NVML and resctrl as a whole being unavailable are said by the watching states
(noded.loop.watching: ``not_watching_gpus``, ``not_watching_resctrl``), not again here.
"""

from __future__ import annotations

from typing import Iterable

from noded.util.journal import log_state

#: what this says as the state's name (NODED_STATE in the journal)
STATE = "input_missing"
#: an input missing this long has gone, and back this long has come back
GRACE_S = 10.0
#: inputs said by the watching states already (noded.loop.watching)
SAID_ELSEWHERE = frozenset({"resctrl", "nvml"})


def input_of(entry: str) -> str:
    """The input a ``Sample.missing`` entry is about: what it names before its first ": "."""
    return entry.partition(": ")[0]


class MissingInputs:
    """The inputs said missing (input -> why), as of the last ``update``."""

    def __init__(self, grace_s: float = GRACE_S):
        self.grace_s = grace_s
        self.now: dict[str, str] = {}
        self._missing_since: dict[str, float] = {}  # input -> when it went, until it is said missing
        self._back_since: dict[str, float] = {}  # input -> when it came back, until it is said back

    def update(self, missing: Iterable[str], t: float) -> None:
        """``missing``: this tick's ``Sample.missing`` (and failed samplers) at time ``t``."""
        seen: dict[str, str] = {}
        for entry in missing:
            name = input_of(entry)
            if name not in SAID_ELSEWHERE:
                seen.setdefault(name, entry)
        for name in seen.keys() - self.now.keys():
            self._missing_since.setdefault(name, t)
        for name in sorted(self._missing_since):
            if name not in seen:
                del self._missing_since[name]  # back within the grace period: it never went
            elif t - self._missing_since[name] >= self.grace_s:
                log_state(STATE, True, f"{seen[name]} (for {t - self._missing_since.pop(name):.0f}s)")
                self.now[name] = seen[name]
        for name in seen.keys() & self.now.keys():
            self._back_since.pop(name, None)
            self.now[name] = seen[name]
        for name in sorted(self.now.keys() - seen.keys()):
            since = self._back_since.setdefault(name, t)
            if t - since >= self.grace_s:
                log_state(STATE, False, f"{name} measured again ({self.grace_s:g}s since it came back); it was: "
                          f"{self.now.pop(name)}")
                del self._back_since[name]
