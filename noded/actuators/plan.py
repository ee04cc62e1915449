"""The plan of differences: compare desired throttle levels with the levels in
force and carry out only the changes, one job at a time, logging each write (or,
in dry-run, each write it would make). A failed change is reported and retried
next tick; it never stops the others."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from resctrl import ResctrlError

from ..sample import Sample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    job: str
    level: int
    writes: tuple[str, ...]  # what was (or, in dry-run, would be) written
    error: str | None = None


def plan(current: Mapping[str, int], levels: Mapping[str, int], sample: Sample) -> list[tuple[str, int]]:
    """(job, level) for every running job whose level must change, in a stable order."""
    wanted = {j: lvl for j, lvl in levels.items() if j in sample.jobs}
    return [(job, wanted.get(job, 0)) for job in sorted(set(current) | set(wanted))
            if job in sample.jobs and current.get(job, 0) != wanted.get(job, 0)]


class LevelThrottle:
    """Base of the throttles: ``apply`` runs the plan through ``_set_level``."""

    kind = "none"

    def __init__(self, *, dry_run: bool = False):
        self.dry_run = dry_run
        self.current: dict[str, int] = {}

    def _set_level(self, job: str, level: int, sample: Sample, writes: list[str]) -> None:
        raise NotImplementedError

    def _after_apply(self) -> None:
        """Tidy-up once all changes are made (e.g. remove unused control groups)."""

    def apply(self, levels: Mapping[str, int], sample: Sample) -> list[Applied]:
        for job in [j for j in self.current if j not in sample.jobs]:
            del self.current[job]  # ended: what it held went with it
        out: list[Applied] = []
        for job, level in plan(self.current, levels, sample):
            writes: list[str] = []
            try:
                self._set_level(job, level, sample, writes)
            except (OSError, ResctrlError) as e:
                log.warning("job=%s %s level %d failed: %s", job, self.kind, level, e)
                out.append(Applied(job, level, tuple(writes), str(e)))
                continue
            out.append(Applied(job, level, tuple(writes)))
            if level:
                self.current[job] = level
            else:
                self.current.pop(job, None)
        self._after_apply()
        for a in out:
            log.info("job=%s %s_level=%d %s: %s%s", a.job, self.kind, a.level,
                     "would write" if self.dry_run else "wrote", "; ".join(a.writes),
                     f" error={a.error}" if a.error else "")
        return out
