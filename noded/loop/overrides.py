"""Operator overrides: persisted atomically, expiring by TTL, winning over the policy.

Expiry times are wall-clock (seconds since the epoch) because they must survive a
restart; everything else in the control loop runs on the monotonic clock.

An override is in force only once it is on disk: ``set`` and ``clear`` write the file
first and change memory after, raising ``StateWriteError`` (nothing changed) when the
write fails. A file that cannot be trusted as a whole (bad JSON, one malformed entry)
is moved aside at load, with a note, and noded starts with no overrides.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable

from noded.util.ages import format_age
from noded.capping.units import MAX_BYTES_PER_S
from noded.util.journal import log_change
from noded.stores.securedir import SecureDir, StateWriteError
from noded.stores.originals import open_state_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Override:
    job: str
    level: int  # 0 = exempt (never throttled), else the throttle level to hold
    set_by_uid: int
    reason: str
    created: float  # wall clock
    expires: float | None  # wall clock, None = until released
    # A cap (bytes a second) owns the job's bandwidth: the level throttle leaves it alone
    # (level is 0) and a CapHolder holds it there. None: a level override.
    cap_bps: float | None = None

    @property
    def kind(self) -> str:
        if self.cap_bps is not None:
            return "cap"
        return "exempt" if self.level == 0 else "throttle"


FILE = "overrides.json"
_FIELDS = tuple(f.name for f in fields(Override))
#: fields a file written before caps existed lacks (read as their defaults)
_OPTIONAL = {"cap_bps"}
MAX_LEVEL = 64  # no throttle has more levels than CPUs have halvings


def _number(job: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"override {job[:100]!r}: {name} must be a finite number, got {str(value)[:40]}")
    return float(value)


def parse_override(job: str, v: Any) -> Override:
    """One entry of overrides.json; raises ValueError naming the job and the field."""
    if not isinstance(v, dict) or not set(_FIELDS) - _OPTIONAL <= set(v) <= set(_FIELDS):
        found = sorted(v) if isinstance(v, dict) else type(v).__name__
        raise ValueError(f"override {job[:100]!r}: expected the keys {list(_FIELDS)}, found {str(found)[:200]}")
    if v["job"] != job:
        raise ValueError(f"override {job[:100]!r}: names the job {str(v['job'])[:100]!r}")
    for name, top in (("level", MAX_LEVEL), ("set_by_uid", 2**32 - 1)):
        if type(v[name]) is not int or not 0 <= v[name] <= top:
            raise ValueError(f"override {job[:100]!r}: {name} must be an integer 0..{top}, got {str(v[name])[:40]}")
    if not isinstance(v["reason"], str):
        raise ValueError(f"override {job[:100]!r}: reason must be a string")
    expires = None if v["expires"] is None else _number(job, "expires", v["expires"])
    cap = v.get("cap_bps")
    if cap is not None:
        cap = _number(job, "cap_bps", cap)
        if not 0 < cap <= MAX_BYTES_PER_S or v["level"] != 0:
            raise ValueError(f"override {job[:100]!r}: cap_bps must be in (0, {MAX_BYTES_PER_S:g}] bytes a second, "
                             f"with level 0, got {cap:g} at level {v['level']}")
    return Override(job, v["level"], v["set_by_uid"], v["reason"], _number(job, "created", v["created"]), expires,
                    cap)


def parse_overrides(data: Any) -> dict[str, Override]:
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    return {job: parse_override(job, v) for job, v in data.items()}


class OverrideStore:
    """``state_dir``: a path (opened here as a ``SecureDir``) or an open ``SecureDir``.

    ``notes`` says what was found corrupt at load and where it was moved aside.
    """

    def __init__(self, state_dir: str | SecureDir, wall_clock: Callable[[], float], *, persist: bool = True):
        # persist=False (dry run): overrides work in memory and are never written
        self.persist = persist
        self.dir = open_state_dir(state_dir)
        self.path = self.dir.file_path(FILE)
        self.wall_clock = wall_clock
        self._lock = threading.Lock()
        loaded, note = self.dir.load_json(FILE, "overrides", parse_overrides)
        self._items: dict[str, Override] = loaded or {}
        self._dirty = False  # memory holds a release the file does not have yet
        self.notes: list[str] = [note] if note else []

    def _save(self, items: dict[str, Override]) -> None:
        if self.persist:
            self.dir.write_json(FILE, {j: asdict(o) for j, o in items.items()})

    def set(self, override: Override) -> None:
        """In force once persisted; raises StateWriteError (and nothing changes) otherwise."""
        with self._lock:
            items = {**self._items, override.job: override}
            self._save(items)
            self._items = items
        log_change("override-set", override.job, level_to=override.level,
                   kind=override.kind, uid=override.set_by_uid,
                   cap_bps=None if override.cap_bps is None else round(override.cap_bps),
                   ttl="none" if override.expires is None else format_age(override.expires - override.created),
                   reason=override.reason or None)

    def clear(self, job: str, uid: int) -> tuple[bool, str | None]:
        """(whether there was one, why it could not be saved). Lifting an override only ever
        releases a job, so it takes effect even when the state directory cannot be written
        (a throttle an operator cannot lift would hold a job down); the file is brought in
        line by the next save that works, and until then a restart would bring it back."""
        unsaved = None
        with self._lock:
            gone = self._items.get(job)
            if gone is not None:
                self._items = {j: o for j, o in self._items.items() if j != job}
                try:
                    self._save(self._items)
                    self._dirty = False
                except StateWriteError as e:
                    self._dirty, unsaved = True, str(e)
        if gone is not None:
            log_change("override-cleared", job, kind=gone.kind, uid=uid,
                       reason=f"not saved, in force until a restart: {unsaved}" if unsaved else None)
        return gone is not None, unsaved

    def current(self) -> dict[str, Override]:
        """Overrides not yet expired, without touching the file (for scrapes)."""
        now = self.wall_clock()
        with self._lock:
            return {j: o for j, o in self._items.items() if o.expires is None or o.expires > now}

    def active(self) -> dict[str, Override]:
        """Overrides in force now; expired ones are dropped (and that is logged).

        An expired override is over whether or not the file says so yet (its expiry is in
        the file, and a restart reads it as expired too), so a failed save only warns.
        """
        now = self.wall_clock()
        with self._lock:
            expired = [j for j, o in self._items.items() if o.expires is not None and o.expires <= now]
            if expired or self._dirty:
                self._items = {j: o for j, o in self._items.items() if j not in expired}
                try:
                    self._save(self._items)
                    self._dirty = False
                except StateWriteError as e:
                    if not self._dirty:
                        log.warning("overrides: the file could not be brought in line (tried again every tick): %s",
                                    e)
                    self._dirty = True
            items = dict(self._items)
        for job in expired:
            log_change("override-expired", job)
        return items
