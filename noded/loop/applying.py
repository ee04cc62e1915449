"""The tick's plans written, each knob by its one writer: where CPU jobs go by the throttle
(or, on a host that halves cores with a plan of CPUs, by the owner of every job's CPUs,
which then holds the levels too), every job's CPUs by that owner, memory soft limits by
their writer. Nothing else in noded is handed an actuator."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from noded.actuators.plan import CAPPED, UNKNOWN, Applied, ApplyResult
from noded.knobs.controller import Outcome, Plans
from noded.samplers.sample import GPU, Sample

if TYPE_CHECKING:
    from noded.actuators.cpusets import CpuSetOwner, CpuSetResult
    from noded.actuators.memsoft import MemorySoftLimits, MemoryResult
    from noded.loop.parts import Throttle
    from noded.loop.tickstats import TickStats


class Appliers:
    def __init__(self, throttle: Throttle | None, cpu_owner: CpuSetOwner | None, memory: MemorySoftLimits | None):
        self.throttle, self.cpu_owner, self.memory = throttle, cpu_owner, memory

    def apply(self, sample: Sample, plans: Plans, in_force: Mapping[str, int | None], stats: TickStats) -> Outcome:
        """Every plan of the tick written: levels and caps' places (or the plan's CPUs),
        then memory soft limits."""
        result, cpus = self._apply_places(sample, plans, in_force)
        failed = {a.job for a in result.failed} | set(result.job_errors)
        in_cap_group = frozenset(j for j in plans.capped if j not in failed and (
            in_force.get(j) == CAPPED or any(a.job == j and a.level == CAPPED for a in result.applied)))
        return Outcome(result, cpus, self.apply_memory(plans, stats), in_cap_group)

    def _apply_places(self, sample: Sample, plans: Plans,
                      in_force: Mapping[str, int | None]) -> tuple[ApplyResult, CpuSetResult | None]:
        """The places planned: through the plan of CPUs where one was made, else through
        the throttle (and a capped job's fewer cores through the owner)."""
        if plans.cpus is not None:
            return self._apply_plan(plans, in_force, sample)
        throttle = self.throttle
        result = throttle.apply(plans.places, sample) if throttle else ApplyResult((), MappingProxyType({}))
        return result, self._fewer_cores(sample, plans)

    def _fewer_cores(self, sample: Sample, plans: Plans) -> CpuSetResult | None:
        """Without a plan of CPUs: a capped job below MBA's lowest value on fewer cores,
        through the one owner of every job's CPUs (None: nothing to write or put back)."""
        owner = self.cpu_owner
        if not plans.fewer_cores or owner is None:
            return None
        wishes: dict = {}
        for fewer in plans.fewer_cores:
            wishes = fewer.wishes(wishes, owner)
        return owner.apply(wishes, sample) if wishes or any(f.has_records(owner) for f in plans.fewer_cores) else None

    def _apply_plan(self, plans: Plans, in_force: Mapping[str, int | None],
                    sample: Sample) -> tuple[ApplyResult, CpuSetResult]:
        """Every job's CPUs from the plan, through the one owner: one writer a tick. On a host
        that halves cores the plan holds the levels too (the throttle does not write then); on
        an MBA host the throttle still applies its levels, and the owner only sizes and lends."""
        levels = plans.places
        wishes: Mapping = plans.cpus.cpus
        for fewer in plans.fewer_cores:  # a capped job below MBA's lowest value: fewer of the plan's CPUs
            wishes = fewer.wishes(wishes, self.cpu_owner)
        cpus = self.cpu_owner.apply(dict(wishes), sample)
        if self.throttle is None or self.throttle.kind != "cores":
            throttle = self.throttle
            result = throttle.apply(levels, sample) if throttle else ApplyResult((), MappingProxyType({}))
            return result, cpus
        changed = {c.job: c for c in cpus.applied}
        applied, after = [], {}
        cpu_jobs = {j for j, js in sample.jobs.items() if js.kind != GPU}
        for job in sorted((set(levels) | {j for j, lvl in in_force.items() if lvl}) & cpu_jobs):
            want, was = levels.get(job, 0), in_force.get(job)
            c = changed.get(job)
            if c is not None and c.error:
                if was is not UNKNOWN and was > 0:
                    after[job] = was
            elif want > 0:
                after[job] = want
            if c is not None and was != want:
                applied.append(Applied(job, want, c.writes, c.error, was))
        failed = tuple(a for a in applied if a.error)
        return ApplyResult(tuple(applied), MappingProxyType(after), failed, cpus.housekeeping_failed), cpus

    def apply_memory(self, plans: Plans, stats: TickStats) -> MemoryResult | None:
        """The soft limits wished, by their writer (None: not sized, or no split this tick)."""
        wished = plans.memory
        if wished is None or wished.wishes is None or self.memory is None:
            return None
        result = self.memory.apply(dict(wished.wishes), wished.cgroups, wished.unplaced)
        for c in result.failed:
            stats.actuator_error("memory", "record" if c.error.startswith("original not recorded") else "write")
        return result
