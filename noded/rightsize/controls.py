"""Operators' pins and stops of right-sizing, kept across restarts (as throttle overrides are).

``size_controls.json`` in the state directory: job id -> {kind: pin | stop, cores, uid,
reason}. A control is in force once the file says so: ``set`` raises StateWriteError and
nothing changes otherwise. A reprobe, or the job's end, drops it; dropping only ever frees
a job to be sized again, so it takes effect even when the file cannot be written, and the
file is brought in line by the next write that works (until then a restart would bring the
control back, which the log says). A file that cannot be trusted is moved aside at load
(``notes`` says so) and noded starts without controls.
"""

from __future__ import annotations

import errno
import threading
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from noded.stores.securedir import SecureDir
from noded.stores.originals import StateWriteError

FILE = "size_controls.json"
KINDS = ("pin", "stop")
MAX_CONTROLS = 4096
_MAX_TEXT = 1024


@dataclass(frozen=True)
class StoredControl:
    kind: str  # pin | stop
    cores: int  # a pin's cores, or what a stop kept
    uid: int | None
    reason: str


def parse_controls(data: Any) -> dict[str, StoredControl]:
    """The file's content, checked; raises ValueError naming the record that is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    if len(data) > MAX_CONTROLS:
        raise ValueError(f"{len(data)} controls; at most {MAX_CONTROLS}")
    out = {}
    for job, value in data.items():
        if not job or len(job) > _MAX_TEXT or not isinstance(value, dict) or set(value) != {"kind", "cores", "uid",
                                                                                             "reason"}:
            raise ValueError(f"{job[:200]!r}: expected {{kind, cores, uid, reason}}")
        kind, cores, uid, reason = value["kind"], value["cores"], value["uid"], value["reason"]
        if kind not in KINDS or type(cores) is not int or not 1 <= cores <= 1 << 16 \
                or not (uid is None or (type(uid) is int and uid >= 0)) \
                or not isinstance(reason, str) or len(reason) > _MAX_TEXT:
            raise ValueError(f"{job[:200]!r}: not a pin or a stop of 1 to 65536 cores")
        out[job] = StoredControl(kind, cores, uid, reason)
    return out


class SizeControls:
    def __init__(self, state: SecureDir, *, persist: bool = True):
        self.dir, self.persist = state, persist  # persist False (dry run): in memory only
        self._lock = threading.Lock()
        loaded, note = state.load_json(FILE, "right-sizing controls", parse_controls)
        self._items: dict[str, StoredControl] = loaded or {}
        self.notes: list[str] = [note] if note else []

    def _save(self, items: Mapping[str, StoredControl]) -> None:
        if self.persist:
            self.dir.write_json(FILE, {j: asdict(c) for j, c in items.items()})

    def get(self, job: str) -> StoredControl | None:
        with self._lock:
            return self._items.get(job)

    def set(self, job: str, control: StoredControl) -> None:
        """Raises StateWriteError (nothing changes) where it cannot be kept."""
        with self._lock:
            if len(self._items) >= MAX_CONTROLS and job not in self._items:
                # refused as any write that cannot be kept is: the caller's one error to handle
                raise StateWriteError(self.dir.file_path(FILE), f"keeping control {MAX_CONTROLS + 1}", OSError(
                    errno.ENOSPC, f"{MAX_CONTROLS} controls are kept already; reprobe some jobs first"))
            items = {**self._items, job: control}
            self._save(items)
            self._items = items

    def drop(self, jobs: set[str] | frozenset[str]) -> str | None:
        """Forget these jobs' controls (in memory at once); why the file could not say so, if so."""
        with self._lock:
            if not jobs & self._items.keys():
                return None
            self._items = {j: c for j, c in self._items.items() if j not in jobs}
            try:
                self._save(self._items)
            except StateWriteError as e:
                return str(e)
            return None

    def jobs(self) -> set[str]:
        with self._lock:
            return set(self._items)
