"""Throttling with Memory Bandwidth Allocation.

CLOSIDs are scarce (often 8–16), so jobs at the same level share one control group,
``<prefix>mba-<level>``, whose schemata holds that level's MB value on every domain.
A job changes level by moving its monitoring group there (a rename, which moves
its tasks' CLOSID with it), or, for a job without its own monitoring group, by
moving its processes. Control groups no longer used are removed.
"""

from __future__ import annotations

import logging
import os

from resctrl import CtrlGroup, GroupNotFoundError, MbFlavour, MonGroup, Resctrl, ResctrlError, normalize_mb

from ..jobs.monitoring import JobMonitor
from ..sample import Sample
from .plan import LevelThrottle

log = logging.getLogger(__name__)
MIB = 1 << 20


def mb_value(share: float, rc: Resctrl, peak_bytes_per_domain: float) -> int:
    """The schemata MB value for a share of unthrottled bandwidth, in the host's units."""
    mb = rc.caps.mb
    assert mb is not None
    limits = mb.limits
    if limits.flavour is MbFlavour.MBPS:
        return normalize_mb(int(share * peak_bytes_per_domain / MIB), limits)
    return normalize_mb(round(share * limits.max_bandwidth), limits)


class MbaThrottle(LevelThrottle):
    kind = "mba"

    def __init__(self, rc: Resctrl, monitor: JobMonitor, levels: tuple[float, ...], peak_bytes_per_domain: float,
                 *, dry_run: bool = False):
        if rc.caps.mb is None:
            raise ValueError("MbaThrottle needs a host with memory bandwidth allocation")
        super().__init__(dry_run=dry_run)
        self.rc = rc
        self.monitor = monitor
        self.levels = levels
        self.peak = peak_bytes_per_domain
        self._ctrl: dict[int, CtrlGroup] = {}

    @property
    def max_level(self) -> int:
        return len(self.levels)

    def max_levels(self, sample: Sample) -> dict[str, int]:
        return {j: self.max_level for j in sample.jobs}

    def level_share(self, level: int) -> float:
        """Share of unthrottled bandwidth a level leaves."""
        return self.levels[level - 1] if level else 1.0

    def ctrl_name(self, level: int) -> str:
        return f"{self.rc.prefix}mba-{level}"

    def apply(self, levels, sample: Sample):
        self._reconcile()
        return super().apply(levels, sample)

    def _reconcile(self) -> None:
        # Levels in force are where the job groups really are: a group recreated
        # under the root (resctrl remounted, an operator's rmdir) is at level 0.
        for level, ctrl in list(self._ctrl.items()):
            if not os.path.isdir(ctrl.path):
                del self._ctrl[level]
        groups = self.monitor.groups()
        for job, level in list(self.current.items()):
            group = groups.get(job)
            if group is not None and os.path.basename(group.parent.path) != self.ctrl_name(level):
                del self.current[job]

    def _ensure_ctrl(self, level: int, writes: list[str]) -> CtrlGroup:
        ctrl = self._ctrl.get(level)
        if ctrl is None:
            value = mb_value(self.levels[level - 1], self.rc, self.peak)
            name = self.ctrl_name(level)
            writes.append(f"mkdir {name}; schemata MB={value} on every domain")
            if self.dry_run:
                return CtrlGroup(self.rc, name, os.path.join(self.rc.root, name))
            ctrl = self.rc.ensure_ctrl_group(name)
            ctrl.set_mb(value)
            self._ctrl[level] = ctrl
        return ctrl

    def _set_level(self, job: str, level: int, sample: Sample, writes: list[str]) -> None:
        target = self._ensure_ctrl(level, writes) if level else self.rc.root_group()
        group = self.monitor.groups().get(job)
        if group is not None:
            writes.append(f"rename {os.path.relpath(group.path, self.rc.root)} -> "
                          f"{os.path.relpath(os.path.join(target.path, 'mon_groups', group.name), self.rc.root)}")
            if not self.dry_run:
                self.monitor.set_group(job, group.move_to(target))
            return
        # Shared monitoring (no RMID of its own): move the processes themselves.
        for pid in sorted(sample.jobs[job].pids):
            writes.append(f"tasks {target.name or '/'} <- {pid} (all threads)")
            if not self.dry_run:
                target.add_process(pid)

    def _after_apply(self) -> None:
        used = set(self.current.values())
        for level in [lvl for lvl in self._ctrl if lvl not in used]:
            ctrl = self._ctrl.pop(level)
            if self.dry_run:
                continue
            try:
                ctrl.remove()
            except GroupNotFoundError:
                pass
            except (ResctrlError, OSError) as e:
                log.warning("removing %s failed: %s", ctrl.name, e)

    def release_all(self, sample: Sample | None = None) -> None:
        """Every job back to the root control group; our control groups removed."""
        for job in list(self.current):
            group = self.monitor.groups().get(job)
            try:
                if group is not None and not self.dry_run:
                    self.monitor.set_group(job, group.move_to(self.rc.root_group()))
                elif sample is not None and job in sample.jobs and not self.dry_run:
                    for pid in sample.jobs[job].pids:
                        self.rc.root_group().add_process(pid)
            except (ResctrlError, OSError) as e:
                log.warning("job=%s release failed: %s", job, e)
            self.current.pop(job, None)
        self._after_apply()
