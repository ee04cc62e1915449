"""Right-sizing's CPUs as a controller of the tick: each sizing fed from this Sample (or held
while paused), and the node's plan of every job's CPUs (noded.rightsize.cpuplan). On a host
that halves cores the plan carries contention's levels too, so it reads the levels proposed
before it."""

from __future__ import annotations

import logging
from types import MappingProxyType
from typing import Callable

from noded.knobs.controller import CpuRecords, CpuWishes, Found, Proposals, Proposer, Reading
from noded.rightsize.cpuplan import PlanError
from noded.rightsize.service import RightSizing
from noded.util.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)


class CpuSizing(Proposer):
    """``owner``: the one owner of every job's CPUs, read here (each job's original CPUs and
    those it has now), written only by the loop's actuators."""

    name = "rightsize"
    reads = ("contention",)  # its levels, carried in the plan of CPUs where cores are halved

    def __init__(self, service: RightSizing, owner: CpuRecords, clock: Callable[[], float]):
        self.service, self.owner = service, owner
        self._plan_log = RateLimitedLog(log, 60.0, clock)  # a node short of CPUs says so once a minute, not a tick

    def propose(self, reading: Reading, proposed: tuple[Proposals, ...]) -> Proposals:
        sample, now, rs = reading.sample, reading.now, self.service
        originals, have = {}, {}
        for job, js in sample.jobs.items():
            v = self.owner.view(job, js)
            if v is not None:
                originals[job], have[job] = sorted(v.original), len(v.now)
        node_cpus = len(set().union(*map(set, originals.values()))) if originals else 0
        if reading.paused:
            rs.hold(now)  # paused: no probe begins or moves on; every job keeps the size it asks for now
        else:
            rs.tick(sample, have, originals, now, node_cpus, max(1, len(sample.gpus)))
        levels = {j: lvl for p in proposed if p.levels for j, lvl in p.levels.items()}
        error = None
        try:
            plan = rs.plan(sample, originals, levels if reading.throttle_kind == "cores" else {},
                           reading.config.rightsize.lend_to, now)
        except PlanError as e:
            plan, error = None, str(e)
            self._plan_log.log(logging.WARNING, "plan", "rightsize: no plan of CPUs this tick: %s", e)
        found = Found(rightsize=rs.view(have, plan, error))
        if plan is None:
            return Proposals(found=found)
        # the next tick's levels in force are read against what the plan grants CPU jobs (lent CPUs included)
        granted = MappingProxyType({j: jc.granted for j, jc in plan.jobs.items() if jc.kind == "cpu"})
        return Proposals(cpus=CpuWishes(MappingProxyType({job: plan.cpus_of(job) for job in plan.jobs}), granted),
                         found=found)
