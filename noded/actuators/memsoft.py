"""Soft memory limits on GPU jobs' memory cgroups: right-sizing's memory (issue #13).

The only memory control noded writes is a soft one: ``memory.high`` on cgroup v2,
``memory.soft_limit_in_bytes`` on v1. Never ``memory.max`` / ``memory.limit_in_bytes``:
a hard limit can OOM-kill a job, a soft one only makes the kernel reclaim the job's page
cache (v1: under memory pressure only) or, on v2 above ``memory.high``, slow its
allocations. What the limit is comes from ``noded.rightsize.memsplit``.

* **Where.** A job's memory cgroup as this tick's Sample found it
  (``noded.samplers.memcgroups``: it must hold the job's processes); a job without one is
  not limited, and the reason says why.
* **Record before you touch.** The value in force before noded's first write goes durably
  into ``originals.json`` (``memory:<directory>``) and every value noded is about to write
  into ``memory_written.json``; when either cannot be written nothing is written.
* **Someone else's change is theirs.** A value that is neither the original nor one noded
  wrote (an operator, the job's scheduler) means the limit is theirs now: noded forgets its
  records and leaves it. The file is read again just before each write, so a value written
  since the tick observed it is theirs too.
* **Restored** when the job's wish goes (memory off, the job no longer sized), at stop
  (``release_all``) and at the next start after a crash (``restore_all``), only where the
  value is still one noded wrote. A cgroup gone takes its records with it.
* **Cgroup files only.** Every limit and ``memory.stat`` is opened without following a
  link, without blocking (a FIFO never hangs a tick) and without truncating, then taken
  only if it is a regular file of a cgroup filesystem the mounts file lists (its device is
  a ``cgroup``/``cgroup2`` mount's): whatever a record, a job's cgroup path or a link on
  the way names, noded never reads or writes anything else. A record naming no cgroup file
  is dropped with an error: noded cannot have written there.
* **What noded writes has a shape**: a positive multiple of ``QUANTUM`` bytes, in decimal.
  ``memory_written.json`` keeps, per record, the value in force (when noded's) and the one
  about to be written, so no run of failed writes can push the value in force out of it.
  When that file was found corrupt at start, a recorded cgroup whose value has noded's
  shape is taken as noded's (restored), and the note says so: a limit noded wrote is not
  left behind forever because its list was lost.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from noded.rightsize.memquantum import QUANTUM
from noded.samplers.memcgroups import KEY, V1_FILE, V2_FILE, MemoryCgroup, NotACgroupFile, cgroup_devices
from noded.samplers.memcgroups import open_cgroup_file, read_cgroup_file
from noded.util import paths
from noded.util.journal import log_change
from noded.stores.securedir import SecureDir
from noded.stores.originals import OriginalValues, StateWriteError

log = logging.getLogger(__name__)

WRITTEN_FILE = "memory_written.json"
_MAX_VALUES = 2  # the value in force (when noded's) and the one about to be written
_DECIMAL = re.compile(r"[1-9][0-9]{0,19}")


def noded_shaped(value: str) -> bool:
    """Whether ``value`` is one noded could have written: a positive multiple of QUANTUM."""
    v = value.strip()
    return bool(_DECIMAL.fullmatch(v)) and int(v) % QUANTUM == 0


@dataclass(frozen=True)
class MemoryChange:
    job: str
    path: str
    limit_from: str
    limit: str
    error: str | None = None  # the kernel's message, or why the original could not be recorded


@dataclass(frozen=True)
class MemoryResult:
    """What one tick did: changes (errors included); per job its cgroup as read before the
    writes, and the soft limit in force after them (as noded wrote or found it)."""

    changes: tuple[MemoryChange, ...]
    cgroups: Mapping[str, MemoryCgroup]
    limits: Mapping[str, str]
    unplaced: Mapping[str, str]  # job -> why it has no memory cgroup to limit

    @property
    def failed(self) -> tuple[MemoryChange, ...]:
        return tuple(c for c in self.changes if c.error)


def write_limit(path: str, text: str, devices: frozenset[int]) -> None:
    """Write a soft limit into a cgroup file (see ``open_cgroup_file``), replacing what is
    there as a shell's > does; OSError as the kernel says."""
    fd = open_cgroup_file(path, os.O_WRONLY, devices)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _same(a: str, b: str) -> bool:
    return a.strip() == b.strip()


def parse_written(data: Any) -> dict[str, list[str]]:
    """``memory_written.json``: record key -> the limits noded wrote or was about to write."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    for key, values in data.items():
        where = key[len(KEY):]
        if not key.startswith(KEY + "/") or os.path.normpath(where) != where or "\0" in where \
                or not isinstance(values, list) or len(values) > _MAX_VALUES \
                or not all(isinstance(v, str) and noded_shaped(v) for v in values):
            raise ValueError(f"{key[:200]!r}: expected up to {_MAX_VALUES} limits noded writes (multiples of "
                             f"{QUANTUM} bytes) for a normalised cgroup path")
    return data


class MemorySoftLimits:
    """The one writer of jobs' soft memory limits (see the module's docstring)."""

    def __init__(self, originals: OriginalValues, *, proc: str = "/proc", mounts: str = "/proc/mounts",
                 dry_run: bool = False):
        self.originals = originals
        self.proc, self.mounts, self.dry_run = proc, mounts, dry_run
        self.dir: SecureDir = originals.dir
        loaded, note = self.dir.load_json(WRITTEN_FILE, "the memory limits noded wrote", parse_written)
        self._written: dict[str, list[str]] = loaded or {}
        self.notes: list[str] = [note] if note else []
        # The lists were lost: a recorded cgroup holding a value of noded's shape holds noded's.
        self._lost: set[str] = {k for k, _ in originals.items() if k.startswith(KEY)} if note else set()
        if self._lost:
            self.notes.append(f"{len(self._lost)} recorded memory soft limits have no list of the values noded "
                              f"wrote: where one holds a multiple of {QUANTUM} bytes (what noded writes), it is "
                              "taken as noded's and put back when no longer wished")

    def _devices(self) -> frozenset[int]:
        """The cgroup filesystems now (observe, don't believe); OSError when they cannot be known."""
        return cgroup_devices(self.mounts)

    def _set_written(self, key: str, values: list[str] | None) -> None:
        """What noded may leave in ``key``'s file (None: nothing); entries whose record is gone
        go with it. Raises StateWriteError (nothing changes)."""
        written = {k: v for k, v in self._written.items() if k != key and self.originals.get(k) is not None}
        if values:
            written[key] = list(dict.fromkeys(v.strip() for v in values))[-_MAX_VALUES:]
        if written != self._written:
            self.dir.write_json(WRITTEN_FILE, written)
            self._written = written
        self._lost.discard(key)

    def _ours(self, key: str, value: str) -> bool:
        rec = self.originals.get(key)
        if rec is None:
            return False
        if _same(value, rec["original"]):
            return True
        written = self._written.get(key)
        if written is None and key in self._lost:
            return noded_shaped(value)
        return any(_same(value, w) for w in written or ())

    def _forget(self, key: str) -> None:
        self.originals.forget(key)
        self._set_written(key, None)

    def apply(self, wishes: Mapping[str, int], cgroups: Mapping[str, MemoryCgroup],
              unplaced: Mapping[str, str] | None = None) -> MemoryResult:
        """Set each wished job's soft limit (bytes, a positive multiple of QUANTUM) in its cgroup
        as observed; put back every recorded limit no longer wished for. Returns what was done."""
        changes: list[MemoryChange] = []
        limits: dict[str, str] = {}
        wished_keys = set()
        devices = functools.cache(self._devices_or_error)  # read once, and only when a write is due
        for job, want in sorted(wishes.items()):
            cg = cgroups.get(job)
            if cg is None:
                continue
            wished_keys.add(cg.key)
            text = str(int(want))
            limits[job] = cg.limit
            if _same(cg.limit, text):
                continue
            if not noded_shaped(text):
                changes.append(MemoryChange(job, cg.path, cg.limit, text, f"{text} is not a soft limit noded writes "
                                            f"(a positive multiple of {QUANTUM} bytes): nothing written"))
                continue
            rec = self.originals.get(cg.key)
            if rec is not None and not self._ours(cg.key, cg.limit):
                self._theirs(job, cg, cg.limit)
                continue
            if self.dry_run:
                changes.append(MemoryChange(job, cg.path, cg.limit, text, None))
                continue
            change, limits[job] = self._record_and_write(job, cg, rec, text, devices)
            if change is not None:
                changes.append(change)
        # a cgroup not read this tick is not "no limit wished": held as it is
        changes.extend(self._restore_unwished(wished_keys, set(unplaced or ())))
        self._prune()
        return MemoryResult(tuple(changes), MappingProxyType(dict(cgroups)), MappingProxyType(limits),
                            MappingProxyType(dict(unplaced or {})))

    def _devices_or_error(self) -> frozenset[int] | OSError:
        try:
            return self._devices()
        except OSError as e:
            return e

    def _record_and_write(self, job: str, cg: MemoryCgroup, rec: Mapping[str, Any] | None, text: str,
                          devices: Callable[[], frozenset[int] | OSError]) -> tuple[MemoryChange | None, str]:
        """One job's limit to ``text``: its original recorded first, then written where the
        value is still the one observed (or one noded wrote). Returns the change (None: the
        value is someone else's now, and left) and the limit in force after it."""
        # what noded may leave there: the value in force when it is noded's, and the new one
        in_force = [cg.limit] if rec is not None and not _same(cg.limit, rec["original"]) else []
        try:
            self.originals.record(cg.key, {"job": job, "original": cg.limit.strip(), "version": cg.version})
            self._set_written(cg.key, in_force + [text])
        except StateWriteError as e:
            return MemoryChange(job, cg.path, cg.limit, text, f"original not recorded: {e}"), cg.limit
        found = devices()
        if isinstance(found, OSError):
            return MemoryChange(job, cg.path, cg.limit, text, f"{self.mounts}: {found.strerror}"), cg.limit
        try:  # observed a moment ago: a value someone wrote since is theirs
            now = read_cgroup_file(cg.limit_file, found).strip()
        except OSError as e:
            return MemoryChange(job, cg.path, cg.limit, text, f"{cg.limit_file}: {e.strerror or e}"), cg.limit
        if not _same(now, cg.limit) and not self._ours(cg.key, now):
            self._theirs(job, cg, now)
            return None, now
        change = self._write(job, cg.path, cg.limit_file, now, text, found)
        return change, text if change.error is None else cg.limit

    def _restore_unwished(self, wished_keys: set[str], held: set[str]) -> list[MemoryChange]:
        """Every recorded limit no longer wished for put back, but a held job's (its cgroup
        not read this tick) left as it is; a held record whose file is gone dropped."""
        changes = []
        for key, rec in self.originals.items():
            if not key.startswith(KEY) or key in wished_keys:
                continue
            if rec.get("job") not in held:
                c = self._restore(key, rec)
                if c is not None:
                    changes.append(c)
            elif not self.dry_run and not self._there(key, rec):
                self._drop(key, "gone")  # held, but nothing is left to hold
        return changes

    def _theirs(self, job: str, cg: MemoryCgroup, now: str) -> None:
        log.warning("job=%s its memory soft limit in %s is %s now, neither its original nor one noded wrote: "
                    "someone else set it; noded leaves it and forgets its record", job, cg.path, now)
        try:
            self._forget(cg.key)
        except StateWriteError as e:
            log.warning("forgetting the memory record of %s failed: %s", cg.path, e)

    def _write(self, job: str, path: str, file: str, was: str, text: str, devices: frozenset[int],
               action: str = "memory") -> MemoryChange:
        try:
            write_limit(file, text, devices)
        except OSError as e:
            c = MemoryChange(job, path, was, text, f"{file}: {e.strerror or e}")
            log_change("apply-failed", job, memory_from=was, memory=text, reason=c.error, severity=logging.WARNING)
            return c
        log_change(action, job, memory_from=was, memory=text, reason=f"wrote {file}")
        return MemoryChange(job, path, was, text)

    def _drop(self, key: str, why: str) -> None:
        try:
            self._forget(key)
        except StateWriteError as e:
            log.warning("forgetting the memory record of %s (%s) failed: %s", key[len(KEY):], why, e)

    def _there(self, key: str, rec: Mapping[str, Any]) -> bool:
        """Whether a record's file is still there; one shut to noded (a tenant's chmod:
        EACCES) or unreadable is: its record is kept (an error is not "gone")."""
        try:
            return paths.lexists(self._file(key, rec))
        except OSError:
            return True

    @staticmethod
    def _file(key: str, rec: Mapping[str, Any]) -> str:
        return os.path.join(key[len(KEY):], V2_FILE if rec.get("version") == 2 else V1_FILE)

    def _prune(self) -> None:
        """Lists of values whose record is gone (a crash between the two forgets) go too."""
        written = {k: v for k, v in self._written.items() if self.originals.get(k) is not None}
        if self.dry_run or written == self._written:
            return
        try:
            self.dir.write_json(WRITTEN_FILE, written)
            self._written = written
        except StateWriteError as e:
            log.warning("forgetting the memory limits noded wrote into cgroups no longer recorded failed: %s", e)

    def _restore(self, key: str, rec: Mapping[str, Any]) -> MemoryChange | None:
        """One record put back where the value is still noded's; None when nothing was to do."""
        path = key[len(KEY):]
        job = str(rec.get("job", "?"))
        file = self._file(key, rec)
        if self.dry_run:
            return None
        try:
            devices = self._devices()
            now = read_cgroup_file(file, devices).strip()
        except OSError as e:
            if isinstance(e, NotACgroupFile) or e.errno in (errno.ENOTDIR, errno.ELOOP):
                # noded writes cgroup files only: nothing of noded's can be there to put back
                error = f"{file}: {e.strerror or e}; not a cgroup's soft limit: nothing written, record dropped"
                log.error("memory record %s: %s", key, error)
                self._drop(key, "not a cgroup")
                return MemoryChange(job, path, "?", rec["original"], error)
            if e.errno in (errno.ENOENT, errno.ENODEV):  # the cgroup is gone: nothing to put back
                self._drop(key, "gone")
                return None
            error = f"{e.filename or file}: {e.strerror or e}"
            log.warning("job=%s could not read the memory soft limit to put back (record kept): %s", job, error)
            return MemoryChange(job, path, "?", rec["original"], error)
        if not self._ours(key, now):
            log.warning("not restoring %s: it is %s now, not a value noded wrote; someone else's", file, now)
            self._drop(key, "someone else's")
            return None
        c = MemoryChange(job, path, now, rec["original"])
        if not _same(now, rec["original"]):
            c = self._write(job, path, file, now, rec["original"], devices, action="restored")
            if c.error:
                return c
        try:
            self._forget(key)
        except StateWriteError as e:
            log.warning("restored %s but could not forget its record: %s", file, e)
        return c

    def release_all(self) -> list[str]:
        """Put back every recorded limit (at stop); returns the cgroups that could not be."""
        return self._restore_every(failed=True)

    def restore_all(self) -> list[str]:
        """Put back every recorded limit (at start: a crash left them set); returns those restored."""
        return self.restore_recorded()[0]

    def restore_recorded(self) -> tuple[list[str], list[str]]:
        """Every recorded limit put back: (those restored, those that could not be)."""
        restored, failed = [], []
        for key, rec in self.originals.items():
            if key.startswith(KEY):
                c = self._restore(key, rec)
                if c is not None:
                    (failed if c.error else restored).append(key)
        self._prune()
        return restored, failed

    def _restore_every(self, failed: bool) -> list[str]:
        return self.restore_recorded()[1 if failed else 0]
