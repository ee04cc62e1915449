"""Throttling with Memory Bandwidth Allocation.

CLOSIDs are scarce (often 8–16), so jobs at the same level share one control group,
``<prefix>mba-<level>``, whose schemata holds that level's MB value on every domain.
A job changes level by moving its monitoring group there (a rename, which moves
its tasks' CLOSID with it), or, for a job without its own monitoring group, by
moving its processes.

Everything is planned from the kernel's listing in the Sample (``GroupsView``): a
job's level is the control group its tasks are in; a control group some level
needs is made where it is missing and its schemata put right where it differs; a
control group no job wants is removed once no job's group is inside it (its
remaining tasks go back to the root with it, as the kernel does on rmdir).

A capped job has a control group of its own (``<prefix>cap-<job>``: a cap is per job, an
MB value per CLOSID). Where the kernel has no CLOSID left for it ("Out of CLOSIDs") it is
never left unlimited. Where it is alone in a group of noded's that no other job will be in
once this tick's moves are done (a level group its last other job left, a cap group whose
cap ended), that group's CLOSID becomes its own: after the moves the group is removed and
the job's own made at the same MB value (no burst), and the job moved there. Otherwise it
shares a group of noded's (``CapPlace``), the first that applies:

1. the group it already shares, while that group is still a capped job's own;
2. another capped job's own group, the one with the fewest sharers: that job's holder
   steers the group's sum to the strictest cap in it (noded.capping.service), so every
   job inside is at or below its cap, and one holder writes the group's value;
3. the deepest level group there is (the lowest MB value of noded's groups): held at that
   fixed value, written by the throttle alone as for any job at that level;
4. the cap group it is in whose own job is no longer capped, with other jobs like it: the
   first by name steers it, rather than any of them go to the root;
5. none, where other owners hold every CLOSID and noded has no group at all: it stays at the
   root, unheld, and that is said once (the one case a capped job runs unlimited).

Each tick the job's own group is tried again, so it moves there once a CLOSID is free.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from resctrl import CtrlGroup, GroupNotFoundError, MbFlavour, OutOfClosidsError, Resctrl, ResctrlError, normalize_mb

from noded.samplers.mongroups import group_name, mon_group_at
from noded.util.journal import log_change, word  # a job named in a message: one word, one to one
from noded.samplers.sample import Sample
from noded.samplers.resctrl import ResctrlSession
from noded.actuators.plan import CAPPED, UNKNOWN, UNSETTLED, LevelThrottle

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


@dataclass(frozen=True)
class CapPlace:
    """Where a capped job is held: its own cap group, or one it shares for want of a CLOSID."""

    group: str  # "": none to be had (other owners hold every CLOSID): it stays at the root, unheld
    shared_with: tuple[str, ...] = ()  # the other jobs in that group
    steers: bool = True  # whether its holder writes the group's MB value (one writer a group)
    level: int | None = None  # a level group's level: its value is the throttle's, fixed
    mb: int | None = None  # that level's MB value
    adopted: bool = False  # steers a cap group it was left in whose own job is no longer capped
    #: alone in this group once this tick's moves are done: its CLOSID becomes the job's own
    #: (the group removed, the job's own made at the same MB value, the job moved there)
    swap: bool = False

    @property
    def own(self) -> bool:
        """In its own cap group (shared or not): it got a CLOSID for it."""
        return self.steers and self.level is None and not self.adopted


class MbaThrottle(LevelThrottle):
    kind = "mba"
    holds_caps = True

    def __init__(self, session: ResctrlSession, levels: tuple[float, ...], peak_bytes_per_domain: float,
                 *, dry_run: bool = False):
        super().__init__(dry_run=dry_run)
        self.session = session
        self.levels = levels
        self._peak = peak_bytes_per_domain  # what a level's share is of, where MB is in MBps (use_peak)
        # level, or (CAPPED, job) for a cap's group -> why its control group cannot be used this tick
        self._broken: dict[int | tuple[int, str], str] = {}
        # the same keys -> what was written this tick to make its group ready
        self._prepared: dict[int | tuple[int, str], str] = {}
        # capped job -> where it is held (decided in _before, for the tick's moves and the caps)
        self._places: dict[str, CapPlace] = {}

    @property
    def cap_places(self) -> Mapping[str, CapPlace]:
        """Each capped job's group as of the last apply (noded.capping.service steers by it)."""
        return MappingProxyType(self._places)

    def cap_group_of(self, job: str) -> str:
        """The group a capped job is to be in: its own, or the one it shares."""
        place = self._places.get(job)
        return place.group if place is not None else self.cap_name(job)

    def use_peak(self, peak_bytes_per_domain: float) -> None:
        """A reload's peak: the MB values of levels prepared from now on are its shares."""
        self._peak = peak_bytes_per_domain

    @property
    def max_level(self) -> int:
        return len(self.levels)

    def max_levels(self, sample: Sample) -> dict[str, int]:
        return {j: self.max_level for j in sample.jobs}

    def level_share(self, level: int) -> float:
        """Share of unthrottled bandwidth a level leaves."""
        return self.levels[level - 1] if level else 1.0

    def ctrl_name(self, level: int) -> str:
        return f"{self.session.prefix}mba-{level}"

    def cap_name(self, job: str) -> str:
        """The control group of a capped job's own (one CLOSID a capped job: noded.capping)."""
        return group_name(f"{self.session.prefix}cap-", job)

    def is_cap_group(self, ctrl: str) -> bool:
        return ctrl.startswith(f"{self.session.prefix}cap-job-")

    def level_of(self, ctrl: str) -> int | None:
        """The level a control group of ours stands for, or None for any other name."""
        tail = ctrl.removeprefix(f"{self.session.prefix}mba-")
        if tail != ctrl and tail.isdigit() and 1 <= int(tail) <= self.max_level and self.ctrl_name(int(tail)) == ctrl:
            return int(tail)
        return None

    def _wholly_capped(self, job: str, names: set[str]) -> bool:
        """Whether the groups a job's tasks are in are exactly its cap place: its own cap
        group, the group it shares, or none at all where it is held nowhere ("")."""
        place = self._places.get(job)
        if not names:
            return place is not None and place.group == ""
        if len(names) != 1:
            return False
        (name,) = names
        # asked for every job every tick: a name is hashed only where it could be a cap group's
        return (place is not None and name == place.group) \
            or (self.is_cap_group(name) and name == self.cap_name(job))

    def levels_in_force(self, sample: Sample) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for job, js in sample.jobs.items():
            if js.ctrl_groups is None:
                out[job] = UNKNOWN
                continue
            if not js.ctrl_groups and not js.mon_parent:
                # nearly every job, every tick: in none of our control groups, its own group
                # (if any) at the root; only a cap that holds it nowhere makes that a place
                place = self._places.get(job)
                out[job] = CAPPED if place is not None and place.group == "" else 0
                continue
            # Where its tasks are; a job with its own monitoring group is where that group
            # is, and any task of it found elsewhere makes it unsettled.
            names = set(js.ctrl_groups) | ({js.mon_parent} if js.mon_parent else set())
            if self._wholly_capped(job, names):
                out[job] = CAPPED  # wholly in its own cap group (anywhere else of ours: unsettled)
                continue
            levels = {self.level_of(n) for n in names}
            if js.mon_parent == "" and names:
                out[job] = UNSETTLED  # its group is at the root, some of its tasks in a level
            elif not levels:
                out[job] = 0
            elif len(levels) == 1 and None not in levels:
                out[job] = levels.pop()
            else:
                out[job] = UNSETTLED  # spread over several of our groups, or in one that is no level
        return out

    def _rc(self, sample: Sample) -> Resctrl | None:
        rc = self.session.rc
        if rc is None or rc.caps.mb is None or sample.resctrl is None \
                or sample.resctrl.generation != self.session.generation:
            return None  # nothing seen of this mount: nothing can be planned on it
        return rc

    def _before(self, wanted: Mapping[str, int], sample: Sample) -> None:
        """Every level a job wants: its control group there, with its MB value; every capped
        job's own group, or the group it shares where no CLOSID is left."""
        self._broken = {}
        self._prepared = {}
        rc = self._rc(sample)
        if rc is None:
            return
        view = sample.resctrl.groups
        capped = sorted(j for j, lvl in wanted.items() if lvl == CAPPED and j in sample.jobs)
        homeless = [job for job in capped if not self._prepare_cap_group(rc, job, view)]
        levels = {lvl for job, lvl in wanted.items() if lvl > 0 and job in sample.jobs}
        for level in sorted(levels):
            self._prepare_level(rc, level, view)
        self._places = {job: CapPlace(self.cap_name(job)) for job in capped if job not in homeless}
        self._share(homeless, wanted, sample, rc)
        for level in sorted({p.level for p in self._places.values() if p.level is not None} - levels):
            self._prepare_level(rc, level, view)  # a level group kept for its sharers: its value right

    def _prepare_level(self, rc: Resctrl, level: int, view) -> None:
        name = self.ctrl_name(level)
        value = mb_value(self.levels[level - 1], rc, self._peak)
        seen = view.ctrl_mb.get(name) if name in view.ctrl_tasks else None
        if seen and all(v == value for v in seen.values()):
            return
        what = f"mkdir {name}; schemata MB={value} on every domain" if seen is None else \
            f"{name}/schemata MB={value} on every domain (was {dict(seen)})"
        self._prepared[level] = what  # reported with the first job moved there
        if self.dry_run:
            return
        try:
            ctrl = rc.ensure_ctrl_group(name)
            ctrl.set_mb(value)
        except (ResctrlError, OSError) as e:
            self._broken[level] = f"{what}: {e}"
            log.warning("mba level %d unusable this tick: %s: %s", level, what, e)
            return
        log.info("mba wrote: %s", what)

    def _prepare_cap_group(self, rc: Resctrl, job: str, view) -> bool:
        """A capped job's own control group, made where missing at the top MB value: the
        job's CapHolder steers it down from there (its first period measures it). False
        where the kernel has no CLOSID left for it (the job shares a group: ``_share``)."""
        name = self.cap_name(job)
        if name in view.ctrl_tasks:
            return True
        value = rc.caps.mb.limits.max_bandwidth
        what = f"mkdir {name}; schemata MB={value} on every domain (its cap's holder steers it)"
        if self.dry_run:
            self._prepared[CAPPED, job] = what
            return True
        try:
            rc.ensure_ctrl_group(name).set_mb(value)
        except OutOfClosidsError as e:
            log.debug("cap group of %s not made (it shares one): %s", word(job), e)
            return False
        except (ResctrlError, OSError) as e:
            self._broken[CAPPED, job] = f"{what}: {e}"
            log.warning("cap group of %s unusable this tick: %s: %s", word(job), what, e)
            return True
        self._prepared[CAPPED, job] = what
        log.info("mba wrote: %s", what)
        return True

    def _share(self, homeless: list[str], wanted: Mapping[str, int], sample: Sample, rc: Resctrl) -> None:
        """A group for each capped job that cannot have its own (the rule: the module's doc)."""
        if not homeless:
            return
        view = sample.resctrl.groups
        owners = {p.group: job for job, p in self._places.items() if (CAPPED, job) not in self._broken}
        sharers: dict[str, list[str]] = {g: [] for g in owners}
        levels = sorted(lvl for lvl in set(filter(None, map(self.level_of, view.ctrl_tasks)))
                        | {lvl for j, lvl in wanted.items() if lvl > 0 and j in sample.jobs}
                        if lvl not in self._broken)
        adopted: set[str] = set()
        for job in homeless:
            js = sample.jobs[job]
            names = set(js.ctrl_groups or ()) | ({js.mon_parent} if js.mon_parent else set())
            now = names.pop() if len(names) == 1 else None
            level = self.level_of(now) if now is not None else None
            if now is not None and (level is not None or self.is_cap_group(now)) and now not in owners \
                    and self._alone_after_moves(job, now, wanted, sample, homeless):
                self._places[job] = CapPlace(now, steers=level is None, level=level,
                                             mb=None if level is None else mb_value(self.levels[level - 1], rc,
                                                                                      self._peak),
                                             adopted=level is None, swap=True)
                continue
            if now in sharers:
                group = now
            elif sharers:
                group = min(sharers, key=lambda g: (len(sharers[g]), g))
            elif levels:
                level = levels[-1]
                self._places[job] = CapPlace(self.ctrl_name(level), steers=False, level=level,
                                             mb=mb_value(self.levels[level - 1], rc, self._peak))
                continue
            elif now is not None and self.is_cap_group(now):
                self._places[job] = CapPlace(now, steers=now not in adopted, adopted=True)
                adopted.add(now)
                continue
            else:  # every CLOSID another owner's: nothing of noded's to hold it in (said, once)
                self._places[job] = CapPlace("", steers=False)
                continue
            sharers[group].append(job)
            self._places[job] = CapPlace(group, steers=False)
        # who shares with whom: every capped job in the group, and the jobs at a shared level
        members: dict[str, list[str]] = {}
        for job, p in self._places.items():
            members.setdefault(p.group, []).append(job)
        for job, lvl in wanted.items():
            if lvl > 0 and job in sample.jobs and self.ctrl_name(lvl) in members:
                members[self.ctrl_name(lvl)].append(job)
        self._places = {job: CapPlace(p.group, tuple(sorted(set(members[p.group]) - {job})), p.steers, p.level,
                                      p.mb, p.adopted, p.swap) for job, p in self._places.items()}

    def _alone_after_moves(self, job: str, group: str, wanted: Mapping[str, int], sample: Sample,
                           homeless: list[str]) -> bool:
        """Whether no other job will be in ``group`` once this tick's moves are done."""
        for other, js in sample.jobs.items():
            if other == job or group not in set(js.ctrl_groups or ()) | {js.mon_parent}:
                continue
            lvl = wanted.get(other, 0)
            if other in homeless or (lvl == CAPPED and self.cap_name(other) == group) \
                    or (lvl > 0 and self.ctrl_name(lvl) == group):
                return False  # it stays there (or may)
        return True

    def _take_closid(self, rc: Resctrl, job: str, place: CapPlace, sample: Sample) -> None:
        """The group ``job`` is alone in becomes its own: its monitoring group to the root,
        the group removed, its own made at the same MB value, the job moved there. Any
        other job still there (its move out failed): not this tick."""
        js = sample.jobs[job]
        old = CtrlGroup(rc, place.group, os.path.join(rc.root, place.group))
        mine = group_name(rc.prefix, job)
        writes: list[str] = []
        try:
            with open(os.path.join(old.path, "tasks")) as f:
                tasks = {int(t) for t in f.read().split()}
            if any(tasks & o.pids for other, o in sample.jobs.items() if other != job):
                return  # another job's move out failed: not this tick
            if set(os.listdir(os.path.join(old.path, "mon_groups"))) - {mine}:
                return
            value = max(sample.resctrl.groups.ctrl_mb.get(place.group, {}).values(), default=None) or place.mb \
                or rc.caps.mb.limits.max_bandwidth
            if js.mon_parent == place.group:
                mon_group_at(rc, mine, place.group).move_to(rc.root_group())
                writes.append(f"rename {place.group}/mon_groups/{mine} -> mon_groups/{mine}")
            old.remove()
            writes.append(f"rmdir {place.group}")
            own = rc.ensure_ctrl_group(self.cap_name(job))
            own.set_mb(value)
            writes.append(f"mkdir {own.name}; schemata MB={value} on every domain (the value it was held at)")
            if js.mon_parent == place.group:
                mon_group_at(rc, mine, "").move_to(own)
                writes.append(f"rename mon_groups/{mine} -> {own.name}/mon_groups/{mine}")
            else:
                for pid in sorted(js.pids):
                    own.add_process(pid)
                    writes.append(f"tasks {own.name} <- {pid} (all threads)")
        except (GroupNotFoundError, FileNotFoundError, ResctrlError, OSError) as e:
            log_change("apply-failed", job, throttle="mba", group="cap", severity=logging.WARNING,
                       reason=f"taking the CLOSID of {place.group}, the group it was alone in: {e}"
                              + (f" (after: {'; '.join(writes)})" if writes else ""))
            return
        log_change("applied", job, throttle="mba", group="cap",
                   reason="; ".join(writes) + f" (the CLOSID of {place.group}, the group it was alone in, "
                                              "made its own)")
        self._places[job] = CapPlace(self.cap_name(job))

    def _set_level(self, job: str, level: int, in_force: int, sample: Sample, writes: list[str]) -> None:
        rc = self._rc(sample)
        if rc is None:
            raise ResctrlError("throttle", self.session.root, None, "resctrl with MBA is not mounted now")
        key = (CAPPED, job) if level == CAPPED else level
        name = self.cap_group_of(job) if level == CAPPED else self.ctrl_name(level)
        if key in self._broken:
            raise ResctrlError("throttle", name, None, self._broken[key])
        if key in self._prepared:
            writes.append(self._prepared.pop(key))
        target = CtrlGroup(rc, name, os.path.join(rc.root, name)) if level and name else rc.root_group()
        js = sample.jobs[job]
        view = sample.resctrl.groups
        if js.mon_parent is not None:
            group = mon_group_at(rc, group_name(rc.prefix, job), js.mon_parent)
            if js.mon_parent != target.name:
                writes.append(f"rename {os.path.relpath(group.path, rc.root)} -> "
                              f"{os.path.relpath(os.path.join(target.path, 'mon_groups', group.name), rc.root)}")
                if not self.dry_run:
                    group.move_to(target)
            # Tasks of the job left in another of our groups (moved there while it had
            # no monitoring group of its own) follow it.
            pids = {p for n, tids in view.ctrl_tasks.items() if n not in (target.name, js.mon_parent)
                    for p in tids & js.pids}
        else:
            # Shared monitoring (no RMID of its own): move the processes themselves.
            pids = set(js.pids)
        for pid in sorted(pids - view.foreign_tasks):  # never out of someone else's control group
            writes.append(f"tasks {target.name or '/'} <- {pid} (all threads)")
            if not self.dry_run:
                target.add_process(pid)

    def _after(self, wanted: Mapping[str, int], sample: Sample) -> None:
        """Remove our control groups that no job wants and no job's group is in."""
        rc = self._rc(sample)
        if rc is None or self.dry_run:
            return
        for job, place in sorted(self._places.items()):
            if place.swap and wanted.get(job) == CAPPED:
                self._take_closid(rc, job, place, sample)
        keep = {self.cap_group_of(job) if lvl == CAPPED else self.ctrl_name(lvl) for job, lvl in wanted.items()
                if lvl and job in sample.jobs}
        for name in sorted(set(sample.resctrl.groups.ctrl_tasks) - keep):
            if self.level_of(name) is None and not self.is_cap_group(name):
                continue  # ours by prefix but not a level or a cap (a newer noded's?): left alone
            self._remove_if_unused(rc, name)

    def _remove_if_unused(self, rc: Resctrl, name: str) -> bool:
        ctrl = CtrlGroup(rc, name, os.path.join(rc.root, name))
        try:
            if os.listdir(os.path.join(ctrl.path, "mon_groups")):
                return False  # a job's group is still inside (its move failed): not now
            ctrl.remove()
        except (GroupNotFoundError, FileNotFoundError):
            return True
        except (ResctrlError, OSError) as e:
            log.warning("removing %s failed (retried next tick): %s", name, e)
            self._housekeeping_failure("remove")
            return False
        log_change("group-removed", None, throttle="mba", group=name,
                   reason="no job capped there" if self.is_cap_group(name) else "no job at that level")
        return True

    def release_all(self) -> list[str]:
        """Remove every level's control group and every cap's: the kernel moves their tasks back to the
        root and frees the monitoring groups inside (the job monitor removes the rest).
        Returns what could not be removed."""
        rc = self.session.refresh()
        if rc is None or not rc.caps.alloc_capable or self.dry_run:
            return []
        try:
            names = sorted(n for n in os.listdir(rc.root) if self.level_of(n) is not None or self.is_cap_group(n))
        except OSError as e:
            log.warning("listing control groups at stop failed: %s", e)
            return [rc.root]
        failed = []
        for name in names:
            try:
                CtrlGroup(rc, name, os.path.join(rc.root, name)).remove()
            except GroupNotFoundError:
                continue
            except (ResctrlError, OSError) as e:
                log.warning("removing %s at stop failed: %s", name, e)
                failed.append(name)
        return failed
