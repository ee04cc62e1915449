"""Which of a source's job directories discovery reads this tick: a budget per source.

Any user who may write under a job source's root can make cgroups there by the
thousand, each a job directory to the patterns. Reading each one's cgroup.procs every
tick made noded's cost grow with what users create. Here it grows with the jobs noded
acts on: a source's directories are read every tick while there are no more than
``max_polled`` of them (a normal host: every job found within a tick, as before);
beyond that, at most ``max_polled`` a tick:

* first the directories a process was just placed in (an exec event, see
  ``JobDiscovery.job_of_new_process``), then those that held processes when last read,
  least recently read first: the jobs noded acts on. A job with processes not read
  this tick is held as last seen;
* then the empty ones, in turn, taking one of each owner (the directory's uid) in
  turn, least recently read first, and a new directory before any read already: one
  user's ten thousand directories take their share, and another user's new job is
  still read within a tick or two.

Always at least an eighth of the budget goes to the empty ones while there are any,
so new jobs are found even when the jobs with processes alone exceed the budget.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from noded.jobs.cgroups import CgroupScanner

log = logging.getLogger(__name__)

#: job directories read per source and tick at most (config: jobs.max_polled_per_source)
DEFAULT_MAX_POLLED = 256


@dataclass(frozen=True)
class SourceCost:
    """What discovery did for one source in its last run (metrics read it)."""

    source: str  # kind:root
    dirs: int  # job directories the patterns match
    polled: int  # read in this run
    capped: bool  # more directories than max_polled: the rest were held or left for a later tick


class SourcePoll:
    """One source's directories and the order they are read in (see the module's doc)."""

    def __init__(self, scanner: CgroupScanner, max_polled: int = DEFAULT_MAX_POLLED):
        if max_polled < 1:
            raise ValueError(f"max_polled must be at least 1, not {max_polled}")
        self.scanner = scanner
        self.max_polled = max_polled
        self.name = f"{scanner.source.kind}:{scanner.source.root}"
        self.capped = False
        self._generation = -1
        self._ids: set[str] = set()
        #: job ids whose directory held processes when last read, least recently read first
        self._active: OrderedDict[str, None] = OrderedDict()
        #: owner uid -> the empty job ids it owns, next to read first
        self._empty: dict[int, OrderedDict[str, None]] = {}
        self._owner_of: dict[str, int] = {}
        self._turn = 0  # which owner goes first this tick: each in turn

    def _sync(self, found: dict[str, str]) -> None:
        if self.scanner.generation == self._generation:
            return
        self._generation = self.scanner.generation
        ids = set(found)
        for gone in self._ids - ids:
            self._active.pop(gone, None)
            uid = self._owner_of.pop(gone, None)
            queue = self._empty.get(uid)
            if queue is not None:
                queue.pop(gone, None)
                if not queue:
                    del self._empty[uid]
        for new in ids - self._ids:
            uid = self.scanner.owner(found[new])
            self._owner_of[new] = uid
            queue = self._empty.setdefault(uid, OrderedDict())
            queue[new] = None
            queue.move_to_end(new, last=False)  # never read: read before those read already
        self._ids = ids

    def choose(self, found: dict[str, str], woken: set[str]) -> list[str]:
        """The job ids to read this tick, of ``found`` (the scanner's last scan); ``woken``:
        those a process was just placed in."""
        self._sync(found)
        capped = len(found) > self.max_polled
        if capped != self.capped:
            self.capped = capped
            if capped:
                log.warning("job_source=%s holds %d job directories, more than the %d read per tick "
                            "(jobs.max_polled_per_source): those with processes first, the empty ones in turn "
                            "by owner", self.name, len(found), self.max_polled)
            else:
                log.warning("job_source=%s holds %d job directories again, within the %d read per tick: "
                            "each is read every tick", self.name, len(found), self.max_polled)
        if not capped:
            return list(found)
        chosen = [j for j in woken if j in self._ids][: self.max_polled]
        taken = set(chosen)
        empties = sum(len(q) for q in self._empty.values())
        reserve = min(empties, max(1, self.max_polled // 8))
        room = self.max_polled - len(chosen) - reserve
        for job_id in self._active:
            if room <= 0:
                break
            if job_id not in taken:
                chosen.append(job_id)
                taken.add(job_id)
                room -= 1
        chosen += self._empty_in_turn(self.max_polled - len(chosen), taken)
        return chosen

    def _empty_in_turn(self, room: int, taken: set[str]) -> list[str]:
        owners = list(self._empty.values())
        if not owners or room <= 0:
            return []
        self._turn = (self._turn + 1) % len(owners)
        turns = [iter(q) for q in owners[self._turn:] + owners[: self._turn]]
        out: list[str] = []
        while turns and len(out) < room:
            left = []
            for it in turns:
                job_id = next(it, None)
                while job_id is not None and job_id in taken:
                    job_id = next(it, None)
                if job_id is None:
                    continue
                out.append(job_id)
                left.append(it)
                if len(out) >= room:
                    break
            turns = left
        return out

    def read(self, job_id: str, has_processes: bool) -> None:
        """A directory was read: it goes to the back of its line."""
        uid = self._owner_of.get(job_id)
        if uid is None:
            return  # not synced (a directory found and read in the same run as it went)
        if has_processes:
            queue = self._empty.get(uid)
            if queue is not None and queue.pop(job_id, 0) is None and not queue:
                del self._empty[uid]
            self._active[job_id] = None
            self._active.move_to_end(job_id)
        else:
            self._active.pop(job_id, None)
            queue = self._empty.setdefault(uid, OrderedDict())
            queue[job_id] = None
            queue.move_to_end(job_id)

    def held(self, read: set[str]) -> list[str]:
        """Job ids with processes when last read that were not read now: held as last seen."""
        return [j for j in self._active if j not in read] if self.capped else []

    def cost(self, dirs: int, polled: int) -> SourceCost:
        return SourceCost(self.name, dirs, polled, self.capped)
