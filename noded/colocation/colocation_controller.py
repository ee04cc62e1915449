"""Co-location as a controller of the tick. Its knob, the MPS admission of GPU jobs, is
turned when a job asks (``nodectl admit``), not by the tick: each tick, once the others'
plans are written, it learns profiles from the Sample and drops the reservations of jobs
that ended (never waiting on MPS)."""

from __future__ import annotations

from noded.colocation.service import Colocation
from noded.knobs.controller import NOTHING, Found, Outcome, Plans, Proposals, Proposer, Reading


class Colocating(Proposer):
    """Proposes nothing on a tick's knobs; learns after the writes."""

    name = "colocation"

    def __init__(self, service: Colocation):
        self.service = service

    def propose(self, reading: Reading, proposed: tuple[Proposals, ...]) -> Proposals:
        return NOTHING

    def after_apply(self, reading: Reading, plans: Plans, outcome: Outcome) -> Found:
        """Profiles learnt, ended jobs' reservations dropped; what co-location holds now, for
        the tick's result."""
        self.service.tick(reading.sample)
        return Found(colocation=self.service.view())

    def between_ticks(self) -> Found:
        """What co-location holds now: admissions and MPS's state move between ticks."""
        return Found(colocation=self.service.view())
