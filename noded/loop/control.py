"""What operators set and what the loop decided, beside the loop: overrides, pause,
each job's recent decisions and the decision counts.

One object with its own lock. The loop reads it once a tick, records its actions and
puts a ``ControlSnapshot`` of it in the tick's result: the metrics read only that; the
admin socket reads this object and the last ``TickResult``, never the daemon's
internals, so no client can see a half-made tick or hold the loop up.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Iterable, Mapping

from noded.loop.overrides import Override, OverrideStore
from noded.policy.contention import Action

#: decisions kept per job for `nodectl explain`
HISTORY = 10


@dataclass(frozen=True)
class ControlSnapshot:
    """The control state as a tick left it (immutable): what the metrics read."""

    paused: str | None = None  # why the eliminator is paused, or None
    overrides: tuple[Override, ...] = ()  # not expired, by job
    actions: Mapping[tuple[str, str], int] = field(default_factory=lambda: MappingProxyType({}))  # (kind, cause)


class ControlState:
    def __init__(self, overrides: OverrideStore | None = None, registered_labels=None):
        self.overrides = overrides  # set once at start, before the loop; the store locks itself
        # a jobs.RegisteredLabels (job managers' hooks: nodectl label/forget), set once at start,
        # shared with job discovery; it locks itself
        self.registered_labels = registered_labels
        self._lock = threading.Lock()
        self._paused: str | None = None
        self._history: dict[str, deque[tuple[float, Action]]] = {}
        self._actions: Counter[tuple[str, str]] = Counter()  # (throttle|release, cause)

    @property
    def paused(self) -> str | None:
        """Why the eliminator is paused, or None."""
        with self._lock:
            return self._paused

    def pause(self, reason: str) -> None:
        with self._lock:
            self._paused = reason

    def resume(self) -> None:
        with self._lock:
            self._paused = None

    def record(self, t: float, actions: Iterable[Action], jobs_now: Iterable[str] | None) -> None:
        """The loop's actions of one tick; ``jobs_now`` (None: not known this tick) ends
        the history of jobs that are gone."""
        with self._lock:
            for a in actions:
                self._actions[(a.kind, a.cause)] += 1
                self._history.setdefault(a.job, deque(maxlen=HISTORY)).append((t, a))
            if jobs_now is not None:
                keep = set(jobs_now)
                for job in [j for j in self._history if j not in keep]:
                    del self._history[job]

    def history(self, job: str) -> list[tuple[float, Action]]:
        with self._lock:
            return list(self._history.get(job, ()))

    def snapshot(self) -> ControlSnapshot:
        store = self.overrides
        overrides = tuple(sorted(store.current().values(), key=lambda o: o.job)) if store else ()
        with self._lock:
            return ControlSnapshot(self._paused, overrides, MappingProxyType(dict(self._actions)))

    def read(self) -> ControlSnapshot:
        """What operators set, read once at the start of a tick: every part of the tick sees
        this one reading (a pause or an override arriving meanwhile counts from the next
        tick). Expired overrides are dropped now (OverrideStore.active)."""
        store = self.overrides
        overrides = tuple(sorted(store.active().values(), key=lambda o: o.job)) if store else ()
        with self._lock:
            return ControlSnapshot(self._paused, overrides, MappingProxyType(dict(self._actions)))

    def after(self, reading: ControlSnapshot) -> ControlSnapshot:
        """The tick's ``reading`` with the decision counts as they are now (its actions recorded)."""
        with self._lock:
            return replace(reading, actions=MappingProxyType(dict(self._actions)))
