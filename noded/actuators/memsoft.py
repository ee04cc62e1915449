"""Soft memory limits on GPU jobs' memory cgroups: right-sizing's memory (issue #13).

The only memory control noded writes is a soft one: ``memory.high`` on cgroup v2,
``memory.soft_limit_in_bytes`` on v1. Never ``memory.max`` / ``memory.limit_in_bytes``:
a hard limit can OOM-kill a job, a soft one only makes the kernel reclaim the job's page
cache (v1: under memory pressure only) or, on v2 above ``memory.high``, slow its
allocations. What the limit is comes from ``noded.rightsize.memsplit``.

* **Where.** A job's memory cgroup is its own cgroup's path in the memory hierarchy: the
  same directory on v2 (where ``memory.high`` exists there), the same path below the v1
  memory mount (from the mounts file) otherwise. It must hold the job's processes, as
  ``/proc/PID/cgroup`` says; a job without a cgroup, or whose processes are elsewhere, is
  not limited (``MemoryCgroupError`` says why).
* **Record before you touch.** The value in force before noded's first write goes durably
  into ``originals.json`` (``memory:<directory>``) and every value noded is about to write
  into ``memory_written.json``; when either cannot be written nothing is written.
* **Someone else's change is theirs.** A value that is neither the original nor one noded
  wrote (an operator, the job's scheduler) means the limit is theirs now: noded forgets its
  records and leaves it.
* **Restored** when the job's wish goes (memory off, the job no longer sized), at stop
  (``release_all``) and at the next start after a crash (``restore_all``), only where the
  value is still one noded wrote. A cgroup gone takes its records with it.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from resctrl.mounts import parse_mounts

from ..jobs.cgroups import read_process_cgroups
from ..journal import log_change
from ..sample import JobSample
from ..securedir import SecureDir
from ..state import OriginalValues, StateWriteError

log = logging.getLogger(__name__)

KEY = "memory:"
V1_FILE = "memory.soft_limit_in_bytes"
V2_FILE = "memory.high"
WRITTEN_FILE = "memory_written.json"
_MAX_VALUES = 4
_MAX_STAT = 1 << 16  # memory.stat is a few hundred bytes; never read more


class MemoryCgroupError(Exception):
    """A job's memory cgroup cannot be found or read (the message says where and why)."""


@dataclass(frozen=True)
class MemoryCgroup:
    """A job's memory cgroup as the kernel showed it this tick."""

    path: str
    version: int
    limit: str  # the soft limit's file as read, e.g. "max" (v2) or "9223372036854771712" (v1)
    anon_bytes: int  # anonymous memory: the job's process memory, which a cache share comes on top of
    file_bytes: int  # page cache: the data cache a soft limit reclaims first

    @property
    def limit_file(self) -> str:
        return os.path.join(self.path, V2_FILE if self.version == 2 else V1_FILE)

    @property
    def key(self) -> str:
        return KEY + self.path


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


def _read_small(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.read(fd, _MAX_STAT).decode("ascii", "replace")
    finally:
        os.close(fd)


def write_limit(path: str, text: str) -> None:
    """Write a soft limit (an existing file only, no symlink followed); OSError as the kernel says."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)  # as a shell's > does
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def parse_memory_stat(text: str, version: int) -> tuple[int, int]:
    """(anonymous, page cache) bytes from memory.stat; v1 counts the hierarchy below (total_*).
    Raises ValueError naming the field that is missing or not a number."""
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        fields[name] = value
    names = ("anon", "file") if version == 2 else ("total_rss", "total_cache")
    out = []
    for name in names:
        try:
            out.append(int(fields[name]))
        except (KeyError, ValueError):
            raise ValueError(f"memory.stat has no number for {name!r}") from None
    return out[0], out[1]


def _mount_of(path: str) -> str:
    while not os.path.ismount(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def find_memory_cgroup(js: JobSample, *, proc: str = "/proc", mounts: str = "/proc/mounts") -> MemoryCgroup:
    """The job's memory cgroup and what it holds now. Raises MemoryCgroupError."""
    if js.cgroup is None:
        raise MemoryCgroupError("the job has no cgroup of its own (a registered process tree)")
    if os.path.exists(os.path.join(js.cgroup, V2_FILE)):
        version, path, controller = 2, js.cgroup, ""
    else:
        try:
            with open(mounts, encoding="utf-8", errors="surrogateescape") as f:
                memory = [m for m in parse_mounts(f.read()) if m.fstype == "cgroup" and "memory" in m.options]
        except OSError as e:
            raise MemoryCgroupError(f"{mounts}: {e.strerror}") from None
        if not memory:
            raise MemoryCgroupError(f"no memory cgroup: {V2_FILE} is not in {js.cgroup} and {mounts} lists no v1 "
                                    "memory hierarchy")
        rel = os.path.relpath(js.cgroup, _mount_of(js.cgroup))
        version, path, controller = 1, os.path.normpath(os.path.join(memory[-1].target, rel)), "memory"
    mount_rel = "/" + os.path.relpath(path, _mount_of(path)).removeprefix(".")
    inside = [pid for pid in sorted(js.pids)
              if (read_process_cgroups(proc, pid).get(controller, "") + "/").startswith(mount_rel.rstrip("/") + "/")]
    if js.pids and not inside:
        raise MemoryCgroupError(f"none of the job's processes is in the memory cgroup {path}")
    try:
        limit = _read_small(os.path.join(path, V2_FILE if version == 2 else V1_FILE)).strip()
        anon, cached = parse_memory_stat(_read_small(os.path.join(path, "memory.stat")), version)
    except OSError as e:
        raise MemoryCgroupError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise MemoryCgroupError(f"{path}: {e}") from None
    return MemoryCgroup(path, version, limit, anon, cached)


def _same(a: str, b: str) -> bool:
    return a.strip() == b.strip()


def parse_written(data: Any) -> dict[str, list[str]]:
    """``memory_written.json``: record key -> the limits noded wrote or was about to write."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found {type(data).__name__}")
    for key, values in data.items():
        if not key.startswith(KEY + "/") or not isinstance(values, list) or len(values) > _MAX_VALUES or not all(
                isinstance(v, str) and 0 < len(v) <= 32 for v in values):
            raise ValueError(f"{key[:200]!r}: expected up to {_MAX_VALUES} limits as the kernel shows them")
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

    def observe(self, jobs: Mapping[str, JobSample]) -> tuple[dict[str, MemoryCgroup], dict[str, str]]:
        """Each job's memory cgroup now, and why a job has none."""
        found, unplaced = {}, {}
        for job, js in sorted(jobs.items()):
            try:
                found[job] = find_memory_cgroup(js, proc=self.proc, mounts=self.mounts)
            except MemoryCgroupError as e:
                unplaced[job] = str(e)
        return found, unplaced

    def _set_written(self, key: str, values: list[str] | None) -> None:
        written = dict(self._written)
        if values:
            written[key] = list(dict.fromkeys(values))[-_MAX_VALUES:]
        else:
            written.pop(key, None)
        if written != self._written:
            self.dir.write_json(WRITTEN_FILE, written)
            self._written = written

    def _ours(self, key: str, value: str) -> bool:
        rec = self.originals.get(key)
        return rec is not None and (_same(value, rec["original"]) or any(_same(value, w) for w in self._written.get(key, ())))

    def _forget(self, key: str) -> None:
        self.originals.forget(key)
        self._set_written(key, None)

    def apply(self, wishes: Mapping[str, int], cgroups: Mapping[str, MemoryCgroup],
              unplaced: Mapping[str, str] | None = None) -> MemoryResult:
        """Set each wished job's soft limit (bytes) in its cgroup as observed; put back every
        recorded limit no longer wished for. Returns what was done."""
        changes: list[MemoryChange] = []
        limits: dict[str, str] = {}
        wished_keys = set()
        for job, want in sorted(wishes.items()):
            cg = cgroups.get(job)
            if cg is None:
                continue
            wished_keys.add(cg.key)
            text = str(int(want))
            limits[job] = cg.limit
            if _same(cg.limit, text):
                continue
            rec = self.originals.get(cg.key)
            if rec is not None and not self._ours(cg.key, cg.limit):
                self._theirs(job, cg)
                continue
            if self.dry_run:
                changes.append(MemoryChange(job, cg.path, cg.limit, text, None))
                continue
            try:
                self.originals.record(cg.key, {"job": job, "original": cg.limit, "version": cg.version})
                self._set_written(cg.key, self._written.get(cg.key, []) + [text])
            except StateWriteError as e:
                changes.append(MemoryChange(job, cg.path, cg.limit, text, f"original not recorded: {e}"))
                continue
            changes.append(self._write(job, cg.path, cg.limit_file, cg.limit, text))
            if changes[-1].error is None:
                limits[job] = text
        held = set(unplaced or ())  # a cgroup not read this tick is not "no limit wished": held as it is
        for key, rec in self.originals.items():
            if key.startswith(KEY) and key not in wished_keys and rec.get("job") not in held:
                c = self._restore(key, rec)
                if c is not None:
                    changes.append(c)
        return MemoryResult(tuple(changes), MappingProxyType(dict(cgroups)), MappingProxyType(limits),
                            MappingProxyType(dict(unplaced or {})))

    def _theirs(self, job: str, cg: MemoryCgroup) -> None:
        log.warning("job=%s its memory soft limit in %s is %s now, neither its original nor one noded wrote: "
                    "someone else set it; noded leaves it and forgets its record", job, cg.path, cg.limit)
        try:
            self._forget(cg.key)
        except StateWriteError as e:
            log.warning("forgetting the memory record of %s failed: %s", cg.path, e)

    def _write(self, job: str, path: str, file: str, was: str, text: str, action: str = "memory") -> MemoryChange:
        try:
            write_limit(file, text)
        except OSError as e:
            c = MemoryChange(job, path, was, text, f"{file}: {e.strerror or e}")
            log_change("apply-failed", job, memory_from=was, memory=text, reason=c.error, severity=logging.WARNING)
            return c
        log_change(action, job, memory_from=was, memory=text, reason=f"wrote {file}")
        return MemoryChange(job, path, was, text)

    def _restore(self, key: str, rec: Mapping[str, Any]) -> MemoryChange | None:
        """One record put back where the value is still noded's; None when nothing was to do."""
        path = key[len(KEY):]
        job = str(rec.get("job", "?"))
        file = os.path.join(path, V2_FILE if rec.get("version") == 2 else V1_FILE)
        if self.dry_run:
            return None
        try:
            now = _read_small(file).strip()
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENODEV):  # the cgroup is gone: nothing to put back
                try:
                    self._forget(key)
                except StateWriteError as se:
                    log.warning("forgetting the memory record of %s (gone) failed: %s", path, se)
                return None
            return MemoryChange(job, path, "?", rec["original"], f"{file}: {e.strerror or e}")
        if not self._ours(key, now):
            log.warning("not restoring %s: it is %s now, not a value noded wrote; someone else's", file, now)
            try:
                self._forget(key)
            except StateWriteError as e:
                log.warning("forgetting the memory record of %s failed: %s", path, e)
            return None
        c = MemoryChange(job, path, now, rec["original"])
        if not _same(now, rec["original"]):
            c = self._write(job, path, file, now, rec["original"], action="restored")
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
        return self._restore_every(failed=False)

    def _restore_every(self, failed: bool) -> list[str]:
        out = []
        for key, rec in self.originals.items():
            if key.startswith(KEY):
                c = self._restore(key, rec)
                if c is not None and bool(c.error) == failed:
                    out.append(key)
        return out
