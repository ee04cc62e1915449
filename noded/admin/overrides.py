"""Operator overrides: persisted atomically, expiring by TTL, winning over the policy.

Expiry times are wall-clock (seconds since the epoch) because they must survive a
restart; everything else in the control loop runs on the monotonic clock.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import asdict, dataclass
from typing import Callable

from ..state import read_json_object, write_json_atomically

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Override:
    job: str
    level: int  # 0 = exempt (never throttled), else the throttle level to hold
    set_by_uid: int
    reason: str
    created: float  # wall clock
    expires: float | None  # wall clock, None = until released

    @property
    def kind(self) -> str:
        return "exempt" if self.level == 0 else "throttle"


class OverrideStore:
    def __init__(self, state_dir: str, wall_clock: Callable[[], float]):
        self.path = os.path.join(state_dir, "overrides.json")
        self.wall_clock = wall_clock
        self._lock = threading.Lock()
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self._items: dict[str, Override] = self._load()

    def _load(self) -> dict[str, Override]:
        data = read_json_object(self.path, "overrides")
        try:
            return {job: Override(**v) for job, v in data.items()}
        except (TypeError, AttributeError) as e:
            raise ValueError(f"{self.path}: not a valid overrides file ({e})") from None

    def _save(self) -> None:
        write_json_atomically(self.path, {j: asdict(o) for j, o in self._items.items()})

    def set(self, override: Override) -> None:
        with self._lock:
            self._items[override.job] = override
            self._save()
        log.warning("override=set job=%s %s level=%d uid=%d ttl=%s reason=%r", override.job, override.kind,
                    override.level, override.set_by_uid,
                    "none" if override.expires is None else f"{override.expires - override.created:.0f}s",
                    override.reason)

    def clear(self, job: str, uid: int) -> bool:
        with self._lock:
            gone = self._items.pop(job, None)
            if gone is not None:
                self._save()
        if gone is not None:
            log.warning("override=cleared job=%s uid=%d", job, uid)
        return gone is not None

    def current(self) -> dict[str, Override]:
        """Overrides not yet expired, without touching the file (for scrapes)."""
        now = self.wall_clock()
        with self._lock:
            return {j: o for j, o in self._items.items() if o.expires is None or o.expires > now}

    def active(self) -> dict[str, Override]:
        """Overrides in force now; expired ones are dropped (and that is logged)."""
        now = self.wall_clock()
        with self._lock:
            expired = [j for j, o in self._items.items() if o.expires is not None and o.expires <= now]
            for job in expired:
                del self._items[job]
            if expired:
                self._save()
            items = dict(self._items)
        for job in expired:
            log.warning("override=expired job=%s", job)
        return items
