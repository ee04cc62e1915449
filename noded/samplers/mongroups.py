"""One resctrl monitoring group per job, holding all its threads.

Where each job's group is comes from the kernel's listing every tick (``GroupsView``),
not from memory: a group that vanished (resctrl remounted, an operator's rmdir) is
made anew, and a group of a job that ended is removed, and stays listed, so the
removal is tried again, until its rmdir succeeded.

RMIDs are scarce: when none is free a job falls back to shared monitoring (its
traffic counts in its control group's total only) and creation is retried no
sooner than ``retry_s`` later, or at once when another job's group was freed.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from resctrl import CtrlGroup, GroupNotFoundError, MonGroup, OutOfRmidsError, Resctrl, ResctrlError, TaskMoveError
from resctrl.info import read_domains
from resctrl.mbm import MBM_TOTAL, MbmReader, MbmSample

from noded.samplers.resctrl import GroupsView, ResctrlSession
from noded.jobs.model import Job

log = logging.getLogger(__name__)

OWN = "own"  # the job has its own monitoring group
SHARED = "shared"  # out of RMIDs: counted only in its control group's total
NONE = "none"  # no monitoring on this host


#: bits of SHA-256 in a group's name: finding another id with a given job's name (a second
#: preimage) takes about 2**128 hashes, out of any tenant's reach (32 bits, SHA-1's first 8
#: hex digits until 2026-11, took minutes; two ids of one tenant with one name, under a second)
DIGEST_BITS = 128


@functools.lru_cache(maxsize=8192)  # asked for every job every tick; bounded, as jobs come and go
def group_name(prefix: str, job_id: str) -> str:
    """A stable, valid resctrl directory name for a job id, which no other id can be made
    to share: the id's first 40 characters made safe (for people to read; lossy) and 128
    bits of the SHA-256 of the whole id (what tells ids apart).

    Tenants choose job ids (a cgroup source's id is the cgroup's path; a delegated subtree
    names its own), and two ids with one name would be one group to noded: one job's
    traffic read and steered as the other's. A job id holds a cgroup's name, any bytes
    but '/' and NUL: one that is not UTF-8 reaches Python as lone surrogates
    (os.fsdecode), and a registered id may hold any code point. The digest is of the id's
    UTF-8 with surrogates passed through, which every str has and no two ids share. The
    name is a pure function of the id, the same across restarts; at most 113 bytes (a
    32-character prefix, ``cap-``), far under the 255 of a kernfs name.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:40]
    digest = hashlib.sha256(job_id.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_BITS // 4]
    return f"{prefix}job-{safe}-{digest}"


def mon_group_at(rc: Resctrl, name: str, parent: str) -> MonGroup:
    ctrl = rc.root_group() if parent == "" else CtrlGroup(rc, parent, os.path.join(rc.root, parent))
    return MonGroup(rc, name, os.path.join(ctrl.path, "mon_groups", name), ctrl)


@dataclass
class _Tracked:
    created_at: float | None = None  # when we made its group (its counters start at zero)
    group: str | None = None  # the path its group had when last listed
    moved: set[int] = field(default_factory=set)  # processes whose threads we moved into it
    retry_at: float = 0.0


@dataclass(frozen=True)
class MonitorReport:
    monitoring: Mapping[str, str]  # job id -> own | shared | none
    groups: Mapping[str, MonGroup]  # job id -> its monitoring group, where it has one
    vanished: tuple[int, ...]  # processes that exited before they could be moved
    rmids_exhausted: bool
    # job id -> why its group could not be brought in line this tick: the job is held
    # (keeps the group it had, if any) and every other job went on
    errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # (path, its control group's path, its counters read just before its rmdir) of each group
    # removed this sync: the kernel drops a removed group's count from its control group's
    # total, and the bandwidth sampler adds it back (noded.samplers.bandwidth)
    removed: tuple[tuple[str, str, MbmSample], ...] = ()


class JobMonitor:
    def __init__(self, session: ResctrlSession, *, clock: Callable[[], float], retry_s: float = 10.0):
        self.session = session
        self.clock = clock
        self.retry_s = retry_s
        self._jobs: dict[str, _Tracked] = {}
        self._groups: dict[str, MonGroup] = {}  # as last listed, for placing new processes between ticks
        self._in_our_ctrl_groups: frozenset[int] = frozenset()  # task ids in noded's control groups, as last listed
        self._lock = threading.RLock()
        self._exhausted_logged = False
        # (name, parent) -> its MonGroup as listed last tick: the same groups are listed
        # tick after tick, and building each one's objects anew was most of sync's time
        self._listed_at: dict[tuple[str, str], MonGroup] = {}
        self._listed_rc: Resctrl | None = None
        self._failing: set[str] = set()  # jobs whose sync failed last time (said once, when it begins)
        self._reader = MbmReader(events=(MBM_TOTAL,), keep_open=False)  # a removed group's last counts

    def groups(self) -> dict[str, MonGroup]:
        """Each job's group as last listed (or made) by ``sync``."""
        with self._lock:
            return dict(self._groups)

    def created_at(self, job_id: str) -> float | None:
        with self._lock:
            t = self._jobs.get(job_id)
            return t.created_at if t else None

    def sync(self, jobs: Mapping[str, Job], view: GroupsView | None) -> MonitorReport:
        """Bring the groups in line with ``jobs`` (every job on the host now) from what
        ``view`` lists: remove groups of jobs that ended, make missing ones, move processes."""
        rc = self.session.rc
        if rc is None or rc.caps.mon is None or view is None:
            with self._lock:
                self._groups.clear()
                self._jobs = {j: self._jobs.get(j, _Tracked()) for j in jobs}
            return MonitorReport(MappingProxyType({j: NONE for j in jobs}), MappingProxyType({}), (), False)
        vanished: list[int] = []
        errors: dict[str, str] = {}
        with self._lock:
            self._in_our_ctrl_groups = frozenset().union(*view.ctrl_tasks.values())
            names = {group_name(rc.prefix, j): j for j in jobs}  # total: every str has a name
            listed: dict[str, MonGroup] = {}
            freed = False
            removed: list[tuple[str, str, MbmSample]] = []
            known_at = self._listed_at if self._listed_rc is rc else {}
            self._listed_at, self._listed_rc = {}, rc
            for name, parent in sorted(view.mon_parent.items()):
                group = known_at.get((name, parent)) or mon_group_at(rc, name, parent)
                self._listed_at[(name, parent)] = group
                job = names.get(name)
                if job is None:
                    final = self._last_counts(rc, group)
                    if self._remove(group):
                        freed = True
                        removed.append((group.path, group.parent.path, final))
                else:
                    listed[job] = group
            self._jobs = {j: self._jobs.get(j) or _Tracked() for j in jobs}
            for job in jobs.values():
                try:
                    vanished += self._sync_job(rc, job, listed, freed)
                except Exception as e:  # noqa: BLE001 (one job's data must not stop every job's sync)
                    errors[job.id] = f"{type(e).__name__}: {e}"
            self._groups = dict(listed)
            for j in errors.keys() - self._failing:
                log.error("job=%s monitoring group not synced, the job held as it was (said once): %s", j, errors[j])
            self._failing = set(errors)
            report = MonitorReport(
                MappingProxyType({j: OWN if j in listed else SHARED for j in jobs}),
                MappingProxyType(dict(listed)), tuple(vanished), any(j not in listed for j in jobs),
                MappingProxyType(errors), tuple(removed))
        return report

    def _sync_job(self, rc: Resctrl, job: Job, listed: dict[str, MonGroup], freed: bool) -> list[int]:
        """One job's part of ``sync``: its group made where missing, its processes moved
        (``listed`` gains or loses its group); the processes that vanished meanwhile."""
        tracked = self._jobs[job.id]
        group = listed.get(job.id)
        if group is not None and tracked.group is None:
            tracked.group = group.path  # adopted (left by an earlier run, or made by us before)
        if group is None:
            if tracked.group is not None:
                log.warning("job=%s group %s is gone; making it anew", job.id, tracked.group)
                tracked.group, tracked.retry_at = None, 0.0
                tracked.moved.clear()
            if freed or self.clock() >= tracked.retry_at:
                group = self._create(rc, job, tracked)
        vanished: list[int] = []
        if group is not None:
            listed[job.id] = group
            tracked.group = group.path
            vanished = self._move(rc, job, tracked, group)
            if tracked.group is None:  # the group proved unusable while moving
                listed.pop(job.id)
        return vanished

    def add_process(self, job: Job, pid: int) -> None:
        """Place one new process at once (from the process-events connector), in the
        job's group as last listed; the next sync places whatever this missed."""
        rc = self.session.rc
        with self._lock:
            group = self._groups.get(job.id)
            tracked = self._jobs.get(job.id)
            if rc is None or group is None or tracked is None:
                return
            self._move(rc, job, tracked, group, only={pid})

    def _create(self, rc: Resctrl, job: Job, tracked: _Tracked) -> MonGroup | None:
        name = group_name(rc.prefix, job.id)
        # Its counters start at zero somewhere inside mkdir: the time before the call, so a
        # first rate may read low, never high (a slow mkdir on a loaded host once made it 40 %).
        before = self.clock()
        try:
            group = rc.root_group().create_mon_group(name)
        except OutOfRmidsError as e:
            tracked.retry_at = self.clock() + self.retry_s
            if not self._exhausted_logged:
                log.warning("rmids=exhausted job=%s monitoring=shared (%s); retrying every %.0fs or when a group "
                            "is freed", job.id, e.status or e, self.retry_s)
                self._exhausted_logged = True
            return None
        except ResctrlError as e:
            tracked.retry_at = self.clock() + self.retry_s
            log.warning("job=%s monitoring group failed: %s", job.id, e)
            return None
        tracked.created_at = before
        tracked.moved.clear()
        log.info("job=%s monitoring=own group=%s", job.id, name)
        return group

    def _move(self, rc: Resctrl, job: Job, tracked: _Tracked, group: MonGroup,
              only: set[int] | None = None) -> list[int]:
        vanished = []
        todo = (only or job.pids) - tracked.moved
        if not todo:  # every tick, for nearly every job: nothing new to move
            tracked.moved &= job.pids
            return vanished
        todo = sorted(todo)
        for pid in todo:
            try:
                try:
                    result = group.add_process(pid)
                except TaskMoveError as e:
                    # The kernel's MON-parent rule: a task joins a monitoring group only
                    # from that group's control group. Under one of our throttle levels the
                    # task goes there first; a task in someone else's control group stays
                    # where its owner put it (moving it would undo their allocation).
                    if "different control group" not in e.status or not rc.owns(group.parent.name):
                        raise
                    group.parent.add_process(pid)
                    result = group.add_process(pid)
            except TaskMoveError as e:
                if "different control group" in e.status and pid in self._in_our_ctrl_groups:
                    continue  # stranded in one of our levels: the throttle brings it back, then it joins
                # EPERM, someone else's control group: will not change by retrying every tick.
                log.warning("job=%s pid=%d not moved: %s", job.id, pid, e)
                tracked.moved.add(pid)
                continue
            except (ResctrlError, OSError) as e:
                # The group itself is unusable (removed by someone): made anew next sync.
                log.warning("job=%s group %s unusable: %s", job.id, group.path, e)
                tracked.group, tracked.retry_at = None, 0.0
                tracked.moved.clear()
                break
            tracked.moved.add(pid)
            vanished += result.vanished
        tracked.moved &= job.pids | set(todo)
        return vanished

    def _last_counts(self, rc: Resctrl, group: MonGroup) -> MbmSample:
        """A group's total counters just before its rmdir ({}: unknown). What it counts
        between this read and the rmdir (microseconds of one job's traffic) is lost."""
        try:
            return self._reader.read(group.path, read_domains(rc.root, True))
        except OSError:
            return {}
        finally:
            self._reader.close()

    def _remove(self, group: MonGroup) -> bool:
        """rmdir a group no job owns any more; True once it is gone. A failure is logged
        and, the group still being listed, tried again next tick."""
        try:
            group.remove()
        except GroupNotFoundError:
            pass
        except (ResctrlError, OSError) as e:  # OSError: resctrl itself went away
            log.warning("removing group %s failed (retried next tick): %s", group.path, e)
            return False
        log.info("group %s removed: its job ended", group.name)
        self._exhausted_logged = False
        return True

    def close(self) -> list[str]:
        """Remove every monitoring group of noded's under the root control group (those
        under noded's control groups went with them); returns what could not be removed."""
        rc = self.session.rc
        failed = []
        with self._lock:
            self._groups.clear()
            self._jobs.clear()
            if rc is None or rc.caps.mon is None:
                return failed
            try:
                names = [n for n in os.listdir(os.path.join(rc.root, "mon_groups")) if rc.owns(n)]
            except OSError as e:
                log.warning("listing monitoring groups at stop failed: %s", e)
                return [rc.root]
            for name in names:
                if not self._remove(mon_group_at(rc, name, "")):
                    failed.append(name)
        return failed
