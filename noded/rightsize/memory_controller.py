"""Right-sizing's memory as a controller of the tick: the exact split of
``rightsize.memory.cache_gb`` between the sized jobs that declare a cache curve, each
proposed as a soft limit on its memory cgroup; limits no longer wished for are put back by
the writer. A job whose cgroup could not be read this tick keeps what it has (an error is
not "no limit")."""

from __future__ import annotations

import logging

from noded.knobs.controller import MemoryWishes, Proposals, Proposer, Reading
from noded.rightsize.service import RightSizing

log = logging.getLogger(__name__)


class MemorySizing(Proposer):
    """Proposes the soft limits; the loop's writer of them (actuators.memsoft) writes."""

    name = "memory"

    def __init__(self, service: RightSizing):
        self.service = service

    def propose(self, reading: Reading, proposed: tuple[Proposals, ...]) -> Proposals:
        from noded.rightsize.memsplit import GIB, CacheJob, cache_curve, soft_limit_bytes, split_memory  # numba
        from noded.rightsize.split import SplitError

        sample, cfg = reading.sample, reading.config.rightsize.memory
        # every GPU job of an enabled source, whether or not its CPUs could be read this tick
        jobs = {j: sample.jobs[j] for j in self.service.gpu_jobs(sample)}
        wanted = [CacheJob(j, max(1, len(js.gpus)), cache_curve(js.meta.dataset_gb, js.meta.uncached_share))
                  for j, js in jobs.items()]
        try:
            split = split_memory(wanted, max(1, len(sample.gpus)), cfg.units, cfg.cache_gb)
        except SplitError as e:
            log.warning("rightsize: no memory split this tick (nothing changed): %s", e)
            return Proposals(memory=MemoryWishes(None, error=str(e)))
        # the cgroups the Sample read (none where its memory sampler failed: an error is not
        # "no limit wished", so each job of the split is then held as it is)
        mem = sample.memory
        cgroups = {j: mem.cgroups[j] for j in split.units if mem is not None and j in mem.cgroups}
        unplaced = {j: mem.unplaced.get(j, "its memory cgroup was not read this tick") if mem is not None
                    else "the jobs' memory cgroups could not be read this tick" for j in split.units if j not in cgroups}
        headroom = int(cfg.headroom_gb * GIB)
        wishes = {j: soft_limit_bytes(cg.anon_bytes, split.units[j], split.unit_bytes, headroom)
                  for j, cg in cgroups.items()}
        return Proposals(memory=MemoryWishes(wishes, cgroups, unplaced, split))
