"""Throttling by halving a CPU job's cores, where the host has no MBA (CODA Sec. V-D).

Level L leaves the first ``max(1, n >> L)`` of the job's original n CPUs. The contention
policy says a level per CPU job; the CPUs that level means come from the node's plan of
CPUs (``noded.rightsize.cpuplan``, which composes halving with whatever else wants a
job's CPUs), and the one owner of every job's CPUs (``CpuSetOwner``) writes them: a
cpuset (children before the parent when shrinking, after it when growing) or the
affinity of every thread, each original recorded durably before the first write,
restored on release, at stop and at the next start after a crash.

The level in force is read from the Sample (what the kernel reports now) against the
recorded originals: a value someone else changed since (a resize by the scheduler, an
operator) is theirs: noded forgets its record rather than fight it.

The plan here holds only the CPU jobs, each granted its own original CPUs (no GPU array,
nothing lent). Where right-sizing is on and has a plan, the daemon writes that plan through
the owner and this throttle does not write (one writer); the daemon then gives
``levels_in_force`` what the plan granted each CPU job before halving (lent CPUs
included), and a level in force is read against it as well as against the job's original.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from noded.samplers.sample import CPU, Sample
from noded.stores.originals import OriginalValues
from noded.actuators.cpusets import CpuSetOwner
from noded.actuators.plan import UNKNOWN, UNSETTLED, LevelThrottle
from noded.rightsize import cpuplan
from noded.util.halving import kept_cpus
from noded.util.halving import max_level


def consistent_levels(original: list[int], now: frozenset[int]) -> list[int]:
    """The levels whose CPUs are exactly ``now`` (several where halving stops at one CPU)."""
    return [lvl for lvl in range(max_level(len(original)) + 1) if set(kept_cpus(original, lvl)) == now]


class CoreHalving(LevelThrottle):
    kind = "cores"

    def __init__(self, originals: OriginalValues, *, proc: str = "/proc", dry_run: bool = False):
        super().__init__(dry_run=dry_run)
        self.owner = CpuSetOwner(originals, proc=proc, dry_run=dry_run)
        self.originals = originals
        self.proc = proc
        self._plan: cpuplan.CpuPlan | None = None

    @staticmethod
    def level_share(level: int) -> float:
        return 0.5 ** level  # cores halved per level; bandwidth roughly follows

    def original_cpus(self, js) -> list[int]:
        """The job's CPUs before noded touched them: recorded, else as they are now."""
        return self.owner.original_cpus(js)

    def max_levels(self, sample: Sample) -> dict[str, int]:
        return {j: max_level(len(self.original_cpus(js))) for j, js in sample.jobs.items()
                if js.kind == CPU and js.cpus is not None}

    def levels_in_force(self, sample: Sample,
                        granted: Mapping[str, tuple[int, ...]] = MappingProxyType({})) -> dict[str, int | None]:
        """Per job, the lowest level whose CPUs the kernel shows in every cgroup or process of
        the job; 0 where someone else changed them (noded forgets its records: they are the
        job's own now); UNSETTLED where it shows none of them (a change left half done).
        ``granted``: per CPU job, the CPUs right-sizing's last plan granted it before halving
        (its levels are read against those too); none where right-sizing has no plan."""
        out: dict[str, int | None] = {}
        for job, js in sample.jobs.items():
            v = self.owner.view(job, js)
            if v is None:
                out[job] = UNKNOWN
                continue
            original = sorted(v.original)
            base_granted = sorted(granted.get(job) or ())
            out[job] = next((lvl for base in ([base_granted] if base_granted else []) + [original]
                             for lvl in range(max_level(len(base)) + 1)
                             if self.owner.matches(v, kept_cpus(base, lvl))),
                            0 if self.owner.changed_by_others(v) else UNSETTLED)
        return out

    def _node_plan(self, wanted: Mapping[str, int], sample: Sample) -> cpuplan.CpuPlan | None:
        """Every CPU job's CPUs at its wanted level, from the node's plan of CPUs: the CPU
        array is every CPU the jobs had originally, each job granted its own."""
        jobs = []
        for job, js in sorted(sample.jobs.items()):
            if js.kind != CPU:
                continue
            own = self.original_cpus(js)
            if own:
                jobs.append(cpuplan.CpuJob(job, js.source, frozenset(own), wanted.get(job, 0)))
        if not jobs:
            return None
        view = cpuplan.NodeView(tuple(sorted(set().union(*(j.own for j in jobs)))), max(1, len(sample.gpus)),
                                cpu_jobs=tuple(jobs))
        return cpuplan.plan(view, cpuplan.PlanConfig(reserve_cores=0))

    def _wanted_cpus(self, job: str, level: int, sample: Sample) -> list[int] | None:
        """The CPUs a level means for a job (None: its own, level 0)."""
        if level == 0:
            return None
        if self._plan is not None and job in self._plan.jobs:
            return list(self._plan.cpus_of(job))
        return kept_cpus(self.original_cpus(sample.jobs[job]), level)  # a job the plan does not hold (not a CPU job)

    def _before(self, wanted: Mapping[str, int], sample: Sample) -> None:
        """Forget records that no longer describe the kernel's state (values someone else
        changed: theirs now; originals already back in place), and record the original of
        whatever appeared in a job whose CPUs noded changed, so a crash cannot strand it."""
        self._plan = self._node_plan(wanted, sample)
        wishes = {job: self._wanted_cpus(job, level, sample) for job, level in wanted.items() if job in sample.jobs}
        for operation in self.owner.prepare(sample, wishes):
            self._housekeeping_failure(operation)
        self._plan = self._node_plan(wanted, sample)  # the originals may have been forgotten

    def _set_level(self, job: str, level: int, in_force: int, sample: Sample, writes: list[str]) -> None:
        js = sample.jobs[job]
        v = self.owner.view(job, js)
        if v is None or not v.original:
            raise OSError(f"no CPUs known for job {js.id}")
        self.owner.change(v, self._wanted_cpus(job, level, sample), writes)

    # -- stop, and the start after a crash
    def release_all(self) -> list[str]:
        """Put back every recorded original; returns what could not be restored."""
        return self.owner.release_all()

    def restore_all(self) -> list[str]:
        """Put back every recorded original (at start: a crash left them changed)."""
        return self.owner.restore_all()
