"""The resctrl mount noded works on, and what noded's groups in it look like now.

``ResctrlSession.refresh()`` runs at the start of every tick. It costs two stats
while the mount stays the same; when resctrl was unmounted, or mounted anew (an
operator switching on ``mba_MBps``, say), it opens the new mount and reads its
capabilities again, so nothing downstream works with the old mount's units. noded
keeps no descriptor inside resctrl between ticks, so the operator's ``umount`` is
never refused with EBUSY because of noded.

``read_groups`` lists, from the kernel, where noded's groups are: every control
group with noded's prefix and the task ids in it, its MB values, and the control
group each of noded's monitoring groups sits in. Actuators plan from this, never
from what they remember having done.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from resctrl import Resctrl, ResctrlError
from resctrl.schemata import MB, MbFlavour, parse_schemata

log = logging.getLogger(__name__)


class ResctrlSession:
    """The current ``Resctrl`` for one mount point, or None while none is mounted there."""

    def __init__(self, root: str, *, mounts: str = "/proc/mounts", prefix: str = "noded-", proc: str = "/proc"):
        self.root = root
        self.mounts = mounts
        self.prefix = prefix
        self.proc = proc
        self.rc: Resctrl | None = None
        self.generation = 0  # counts the mounts noded has opened; a change means a remount
        self.unavailable: str | None = "not looked at yet"
        self._dev: int | None = None

    @classmethod
    def of(cls, rc: Resctrl) -> "ResctrlSession":
        """A session over an already opened mount (tools and tests)."""
        session = cls(rc.root, prefix=rc.prefix, proc=rc.proc)
        session.rc, session._dev, session.generation, session.unavailable = rc, os.stat(rc.root).st_dev, 1, None
        return session

    def refresh(self) -> Resctrl | None:
        """The mount as it is now: the same ``Resctrl`` while nothing changed, a new one
        after a remount, None (with ``unavailable`` saying why) while nothing is mounted."""
        try:
            dev = os.stat(self.root).st_dev if os.path.ismount(self.root) else None
        except OSError as e:  # ENOTCONN from a FUSE mount whose server died, EACCES, …
            dev, why = None, f"{self.root}: {e.strerror}"
        else:
            why = f"no resctrl filesystem mounted at {self.root}"
        if dev is not None and dev == self._dev and self.rc is not None:
            return self.rc
        if dev is None:
            if self.rc is not None:
                log.warning("resctrl=gone root=%s: monitoring and MBA stop until it is mounted again", self.root)
            self.rc, self._dev, self.unavailable = None, None, why
            return None
        try:
            rc = Resctrl.open(self.root, mounts=self.mounts, prefix=self.prefix, proc=self.proc)
        except (ResctrlError, OSError) as e:
            self.rc, self._dev, self.unavailable = None, None, str(e)
            return None
        if self.generation:
            log.warning("resctrl=mounted root=%s flavour=%s: capabilities read again; noded's groups are made anew",
                        self.root, rc.caps.mb.limits.flavour.value if rc.caps.mb else "no-mba")
        self.rc, self._dev, self.unavailable = rc, dev, None
        self.generation += 1
        return rc


@dataclass(frozen=True)
class GroupsView:
    """noded's groups as the kernel lists them now."""

    ctrl_tasks: Mapping[str, frozenset[int]]  # our control group -> task ids in it (its monitoring groups' too)
    ctrl_mb: Mapping[str, Mapping[int, int]]  # our control group -> MB value per domain ({} without MBA)
    mon_parent: Mapping[str, str]  # our monitoring group -> the control group it sits in ("" = the root)
    foreign_tasks: frozenset[int] = frozenset()  # task ids in other owners' control groups (never moved)


@dataclass(frozen=True)
class ResctrlFacts:
    """What one tick saw of resctrl: the mount's capabilities and noded's groups."""

    generation: int
    num_rmids: int | None  # None: no monitoring on this host
    max_ctrl_groups: int
    mb_flavour: MbFlavour | None  # None: no MBA on this host
    groups: GroupsView

    @property
    def rmids_used_by_noded(self) -> int:
        """RMIDs noded's groups hold: one each monitoring group, one each control group."""
        return len(self.groups.mon_parent) + len(self.groups.ctrl_tasks)


def _vanished(e: OSError) -> bool:
    return e.errno in (errno.ENOENT, errno.ENODEV)


def _read_tasks(path: str) -> frozenset[int] | None:
    try:
        with open(os.path.join(path, "tasks")) as f:
            return frozenset(int(t) for t in f.read().split())
    except OSError as e:
        if _vanished(e):
            return None
        raise


def read_groups(rc: Resctrl) -> GroupsView:
    """List noded's groups. A group removed while we look is left out; any other error raises."""
    names = sorted(n for n in os.listdir(rc.root) if n not in ("info", "mon_data", "mon_groups")
                   and os.path.isdir(os.path.join(rc.root, n))) if rc.caps.alloc_capable else []
    tasks: dict[str, frozenset[int]] = {}
    mb: dict[str, Mapping[int, int]] = {}
    foreign: set[int] = set()
    for name in names:
        path = os.path.join(rc.root, name)
        tids = _read_tasks(path)
        if tids is None:
            continue
        if not rc.owns(name):
            foreign |= tids
            continue
        tasks[name] = tids
        if rc.caps.mb is not None:
            try:
                with open(os.path.join(path, "schemata")) as f:
                    mb[name] = MappingProxyType(dict(parse_schemata(f.read()).get(MB, {})))
            except OSError as e:
                if not _vanished(e):
                    raise
                del tasks[name]
    mon: dict[str, str] = {}
    if rc.caps.mon is not None:
        for parent in [""] + sorted(tasks):
            try:
                listed = os.listdir(os.path.join(rc.root, parent, "mon_groups"))
            except OSError as e:
                if _vanished(e):
                    continue
                raise
            mon.update({n: parent for n in listed if rc.owns(n)})
    return GroupsView(MappingProxyType(tasks), MappingProxyType(mb), MappingProxyType(mon), frozenset(foreign))


def read_facts(session: ResctrlSession, rc: Resctrl) -> ResctrlFacts:
    caps = rc.caps
    return ResctrlFacts(session.generation, caps.mon.num_rmids if caps.mon else None, caps.max_ctrl_groups,
                        caps.mb.limits.flavour if caps.mb else None, read_groups(rc))
