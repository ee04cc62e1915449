"""Bandwidth caps as a controller of the tick: which jobs are held at a cap in a group of
their own this tick (noded.capping.plan), and, below MBA's lowest value, their fewer cores
on top of whatever else plans their CPUs. Its holders steer each cap group between ticks:
told before the throttle moves jobs (those no longer capped stop) and after (each capped
job now in its group is steered)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from noded.capping.service import CapService
from noded.config import GB
from noded.knobs.controller import CpuRecords, Found, Outcome, Plans, Proposals, Reading
from noded.samplers.sample import Sample


@dataclass(frozen=True)
class _FewerCores:
    """A capped job below MBA's lowest value on fewer of the CPUs planned for it."""

    service: CapService
    sample: Sample

    def wishes(self, base: Mapping[str, Iterable[int] | None], owner: CpuRecords) -> dict:
        return self.service.cpu_wishes(self.sample, owner, base)

    def has_records(self, owner: CpuRecords) -> bool:
        return self.service.cpus_recorded(owner)


class Caps:
    """The caps, proposed; the holders told around the writes."""

    name = "caps"
    reads: tuple[str, ...] = ()

    def __init__(self, service: CapService):
        self.service = service

    def propose(self, reading: Reading, proposed: tuple[Proposals, ...]) -> Proposals:
        """This tick's caps. Paused: operators' caps only. State directory unwritable: no
        new cap, as no new level (those in force hold)."""
        c = reading.config
        caps = self.service.plan(reading.sample, reading.overrides,
                                 {s.kind: s.cap_gbps * GB for s in c.jobs.sources if s.cap_gbps is not None},
                                 None if c.contention.gpu_reserve_gbps is None else c.contention.gpu_reserve_gbps * GB,
                                 c.peak_bytes_per_domain, automatic=not reading.paused,
                                 blind_hold_s=c.contention.missing_release_s)
        if reading.unwritable:
            caps = {j: cap for j, cap in caps.items() if j in reading.capped_in_force}
        return Proposals(capped=caps, fewer_cores=_FewerCores(self.service, reading.sample))

    def before_apply(self, reading: Reading, plans: Plans) -> None:
        self.service.before_apply(plans.capped)

    def after_apply(self, reading: Reading, plans: Plans, outcome: Outcome) -> Found:
        """The holders told; the caps as they are held now, for the tick's result."""
        if outcome.cpus is not None:
            self.service.cpus_applied(outcome.cpus)
        self.service.after_apply(plans.capped, lambda job: job in outcome.in_cap_group)
        return Found(caps=self.service.view())

    def between_ticks(self) -> Found:
        """The caps as their holders hold them now (each steers its group between ticks)."""
        return Found(caps=self.service.view())
