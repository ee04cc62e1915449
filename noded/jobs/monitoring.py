"""One resctrl monitoring group per job, holding all its threads.

RMIDs are scarce: when none is free a job falls back to shared monitoring (its
traffic counts in its control group's total only) and creation is retried no
sooner than ``retry_s`` later, or at once when another job's group was freed.
Groups of finished jobs are removed.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Callable

from resctrl import MonGroup, OutOfRmidsError, Resctrl, ResctrlError, TaskMoveError

from .model import Job

log = logging.getLogger(__name__)

OWN = "own"  # the job has its own monitoring group
SHARED = "shared"  # out of RMIDs: counted only in its control group's total
NONE = "none"  # no monitoring on this host


def group_name(prefix: str, job_id: str) -> str:
    """A stable, valid, collision-free resctrl directory name for a job id."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:40]
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:8]
    return f"{prefix}job-{safe}-{digest}"


@dataclass
class _Tracked:
    group: MonGroup | None
    created_at: float | None = None  # when we made the group (its counters start at zero)
    moved: set[int] = field(default_factory=set)  # processes whose threads we moved
    retry_at: float = 0.0


@dataclass(frozen=True)
class MonitorReport:
    monitoring: dict[str, str]  # job id -> own | shared | none
    vanished: tuple[int, ...]  # processes that exited before they could be moved
    rmids_exhausted: bool


class JobMonitor:
    def __init__(self, rc: Resctrl | None, *, clock: Callable[[], float], retry_s: float = 10.0,
                 on_removed: Callable[[str], None] | None = None, on_moved: Callable[[str], None] | None = None):
        self.rc = rc
        self.clock = clock
        self.retry_s = retry_s
        self.on_removed = on_removed or (lambda path: None)
        self.on_moved = on_moved or (lambda old_path: None)
        self._jobs: dict[str, _Tracked] = {}
        self._lock = threading.RLock()
        self._exhausted_logged = False

    @property
    def available(self) -> bool:
        return self.rc is not None and self.rc.caps.mon is not None

    def groups(self) -> dict[str, MonGroup]:
        with self._lock:
            return {j: t.group for j, t in self._jobs.items() if t.group is not None}

    def set_group(self, job_id: str, group: MonGroup) -> None:
        """The job's group moved (under a throttle's control group, or back)."""
        with self._lock:
            tracked = self._jobs.get(job_id)
            if tracked is None or tracked.group is None:
                return
            old = tracked.group.path
            tracked.group = group
        if old != group.path:
            self.on_moved(old)

    def lost(self, job_id: str) -> None:
        """The job's group is gone (resctrl remounted, an operator's rmdir): make it anew next sync."""
        with self._lock:
            tracked = self._jobs.get(job_id)
            if tracked is not None and tracked.group is not None:
                log.warning("job=%s group %s is gone; recreating it", job_id, tracked.group.name)
                tracked.group, tracked.retry_at = None, 0.0
                tracked.moved.clear()

    def created_at(self, job_id: str) -> float | None:
        with self._lock:
            t = self._jobs.get(job_id)
            return t.created_at if t else None

    def sync(self, jobs: dict[str, Job]) -> MonitorReport:
        vanished: list[int] = []
        with self._lock:
            freed = False
            for job_id in [j for j in self._jobs if j not in jobs]:
                freed |= self._drop(job_id)
            exhausted = False
            for job in jobs.values():
                tracked = self._jobs.get(job.id)
                if tracked is None or (tracked.group is None and (freed or self.clock() >= tracked.retry_at)):
                    tracked = self._create(job, tracked)
                    exhausted |= tracked.group is None and self.available
                vanished += self._move(job, tracked)
            report = MonitorReport(
                {j: (OWN if t.group else SHARED if self.available else NONE) for j, t in self._jobs.items()
                 if j in jobs},
                tuple(vanished), exhausted or any(t.group is None for t in self._jobs.values()) and self.available,
            )
        return report

    def add_process(self, job: Job, pid: int) -> None:
        """Place one new process at once (from the process-events connector)."""
        with self._lock:
            tracked = self._jobs.get(job.id)
            if tracked is None:
                tracked = self._create(job, None)
            self._move(job, tracked, only={pid})

    def _create(self, job: Job, tracked: _Tracked | None) -> _Tracked:
        tracked = tracked or _Tracked(None)
        self._jobs[job.id] = tracked
        if not self.available:
            return tracked
        name = group_name(self.rc.prefix, job.id)
        try:
            tracked.group = self.rc.root_group().create_mon_group(name)
            tracked.created_at = self.clock()
            tracked.moved.clear()
            log.info("job=%s monitoring=own group=%s", job.id, name)
        except OutOfRmidsError as e:
            tracked.retry_at = self.clock() + self.retry_s
            if not self._exhausted_logged:
                log.warning("rmids=exhausted job=%s monitoring=shared (%s); retrying every %.0fs or when a group is freed",
                            job.id, e.status or e, self.retry_s)
                self._exhausted_logged = True
        except ResctrlError as e:
            if e.errno == 17:  # EEXIST: left by an earlier run; adopt it
                tracked.group = self.rc.root_group().mon_group(name)
            else:
                tracked.retry_at = self.clock() + self.retry_s
                log.warning("job=%s monitoring group failed: %s", job.id, e)
        return tracked

    def _move(self, job: Job, tracked: _Tracked, only: set[int] | None = None) -> list[int]:
        if tracked.group is None:
            return []
        vanished = []
        todo = sorted((only or job.pids) - tracked.moved)
        for pid in todo:
            try:
                try:
                    result = tracked.group.add_process(pid)
                except TaskMoveError as e:
                    # The kernel's MON-parent rule: a task joins a monitoring group only
                    # from that group's control group. Under one of our throttle levels the
                    # task goes there first; a task in someone else's control group stays
                    # where its owner put it (moving it would undo their allocation).
                    parent = tracked.group.parent
                    if "different control group" not in e.status or not self.rc.owns(parent.name):
                        raise
                    parent.add_process(pid)
                    result = tracked.group.add_process(pid)
            except TaskMoveError as e:
                # EPERM and the like will not change by retrying every tick.
                log.warning("job=%s pid=%d not moved: %s", job.id, pid, e)
                tracked.moved.add(pid)
                continue
            except ResctrlError as e:
                # The group itself is unusable (removed by someone): recreate it.
                log.warning("job=%s group %s unusable: %s", job.id, tracked.group.path, e)
                tracked.group, tracked.retry_at = None, 0.0
                break
            tracked.moved.add(pid)
            vanished += result.vanished
        tracked.moved &= job.pids | set(todo)
        return vanished

    def _drop(self, job_id: str) -> bool:
        tracked = self._jobs.pop(job_id)
        if tracked.group is None:
            return False
        try:
            tracked.group.remove()
        except (ResctrlError, OSError) as e:  # OSError: resctrl itself went away
            log.warning("job=%s removing group %s failed: %s", job_id, tracked.group.path, e)
        self.on_removed(tracked.group.path)
        log.info("job=%s ended; removed %s", job_id, tracked.group.name)
        if self._exhausted_logged:
            self._exhausted_logged = False
        return True

    def close(self) -> None:
        """Remove every group this monitor made."""
        with self._lock:
            for job_id in list(self._jobs):
                self._drop(job_id)
