"""The plan of differences: compare the levels the policy wants with the levels the
kernel reports in force now (read into the Sample), and carry out only the changes,
one job at a time, logging each write (in dry-run, each write it would make, once
per change of plan). A failed change is reported and, the kernel still showing the
old level, planned again next tick; it never stops the others and nothing is
believed that the kernel did not confirm.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from resctrl import ResctrlError

from noded.util.journal import log_change
from noded.samplers.sample import Sample
from noded.stores.originals import StateWriteError

log = logging.getLogger(__name__)

#: levels_in_force() for a job whose level cannot be seen now (nothing is planned for it)
UNKNOWN = None
#: levels_in_force() for a job in a state that is no level (tasks spread over several
#: of noded's groups, say): any wanted level differs from it, so it is put right
UNSETTLED = -1
#: a job's wanted and in-force "level" while a bandwidth cap owns it: in its own cap group
#: (noded.capping), at no level (MBA only: a core-halving throttle has no cap groups)
CAPPED = -2


@dataclass(frozen=True)
class Applied:
    job: str
    level: int
    writes: tuple[str, ...]  # what was (or, in dry-run, would be) written
    error: str | None = None
    from_level: int | None = None  # the level in force before (UNSETTLED: none that is a level)

    @property
    def operation(self) -> str:
        """``release`` (a level down, or back to none) or ``throttle`` (a level up)."""
        return "release" if self.level == 0 or (self.from_level is not None and self.level < self.from_level) \
            else "throttle"


@dataclass(frozen=True)
class ApplyResult:
    applied: tuple[Applied, ...]
    levels: Mapping[str, int]  # in force after this tick: as observed, changed by the writes that succeeded
    failed: tuple[Applied, ...] = ()  # every change that failed this tick (``applied`` in dry-run shows news only)
    # Failures around the changes, one operation name each: a control group noded could
    # not remove ("remove"), an original it could not record or forget ("record").
    housekeeping_failed: tuple[str, ...] = ()
    # job -> an error that is no failed write (a bug, data of the job's noded cannot take):
    # that job held at the level in force, every other job's change made
    job_errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def plan(in_force: Mapping[str, int | None], wanted: Mapping[str, int], sample: Sample) -> list[tuple[str, int]]:
    """(job, level) for every job now whose level in force is known and not the wanted one."""
    return [(job, wanted.get(job, 0)) for job in sorted(sample.jobs)
            if in_force.get(job) is not UNKNOWN and in_force[job] != wanted.get(job, 0)]


class LevelThrottle:
    """Base of the throttles: ``apply`` runs the plan through ``_set_level``."""

    kind = "none"
    #: whether it can place a job in a cap group of its own (``CAPPED``): MBA's alone
    holds_caps = False

    def __init__(self, *, dry_run: bool = False):
        self.dry_run = dry_run
        self._would: dict[str, tuple[int, tuple[str, ...]]] = {}  # dry-run: the plan last logged per job
        self._housekeeping_failed: list[str] = []  # this apply's (see ApplyResult)

    def _housekeeping_failure(self, operation: str) -> None:
        self._housekeeping_failed.append(operation)

    def levels_in_force(self, sample: Sample) -> dict[str, int | None]:
        raise NotImplementedError

    def use_peak(self, peak_bytes_per_domain: float) -> None:
        """The node's peak from now on (a reload): levels that are a share of it follow."""

    def _set_level(self, job: str, level: int, in_force: int, sample: Sample, writes: list[str]) -> None:
        raise NotImplementedError

    def _before(self, wanted: Mapping[str, int], sample: Sample) -> None:
        """Before the changes: put right what the plan builds on (e.g. control groups)."""

    def _after(self, wanted: Mapping[str, int], sample: Sample) -> None:
        """After the changes: tidy up (e.g. remove control groups no job uses)."""

    def apply(self, levels: Mapping[str, int], sample: Sample) -> ApplyResult:
        self._housekeeping_failed = []
        self._before(levels, sample)
        in_force = self.levels_in_force(sample)
        after = {j: lvl for j, lvl in in_force.items() if lvl is not UNKNOWN and lvl > 0}
        out: list[Applied] = []
        job_errors: dict[str, str] = {}
        for job, level in plan(in_force, levels, sample):
            writes: list[str] = []
            try:
                self._set_level(job, level, in_force[job], sample, writes)
            except (OSError, ResctrlError, StateWriteError) as e:
                out.append(Applied(job, level, tuple(writes), str(e), in_force[job]))
                continue
            except Exception as e:  # noqa: BLE001 (one job's data must not stop every job's change)
                job_errors[job] = f"{type(e).__name__}: {e}" + (f" (after: {'; '.join(writes)})" if writes else "")
                continue
            if not self.dry_run:
                after[job] = level
            if not writes:
                # Nothing to write: the kernel already shows what this level means for the
                # job (one CPU cannot be halved): no change, so no line in the journal.
                continue
            out.append(Applied(job, level, tuple(writes), from_level=in_force[job]))
        self._after(levels, sample)
        shown = self._dry_run_news(out) if self.dry_run else out
        for a in shown:
            was = None if a.from_level == UNSETTLED else max(a.from_level, 0) if a.from_level is not None else None
            group = "cap" if CAPPED in (a.level, a.from_level) else None  # to or from a cap's own group
            if a.error:
                log_change("apply-failed", a.job, level_from=was, level_to=max(a.level, 0), severity=logging.WARNING,
                           throttle=self.kind, group=group,
                           reason=a.error + (f" (after: {'; '.join(a.writes)})" if a.writes else ""))
            else:
                log_change("dry-run" if self.dry_run else "applied", a.job, level_from=was, level_to=max(a.level, 0),
                           throttle=self.kind, group=group,
                           reason=("would write " if self.dry_run else "") + "; ".join(a.writes))
        return ApplyResult(tuple(shown), MappingProxyType({j: lvl for j, lvl in after.items() if lvl > 0}),
                           tuple(a for a in out if a.error), tuple(self._housekeeping_failed),
                           MappingProxyType(job_errors))

    def _dry_run_news(self, out: list[Applied]) -> list[Applied]:
        # In dry-run nothing changes, so the same plan comes back every tick: say it
        # once, and again only when it changes.
        news = [a for a in out if self._would.get(a.job) != (a.level, a.writes)]
        self._would = {a.job: (a.level, a.writes) for a in out}
        return news
