"""The daemon's co-location service: reservations of admitted jobs, the MPS control
daemon it runs, and the admission decisions it answers for ``nodectl admit``."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from mps.manager import MpsControl

from ..sample import Sample
from .admission import ColocationRule, Decision, Reservation, decide, gpu_loads
from .profiles import JobProfile

log = logging.getLogger(__name__)

#: A reservation for a job that never shows up on the node is dropped after this.
UNSEEN_GRACE_S = 600.0


@dataclass
class _Held:
    reservation: Reservation
    since: float
    seen: bool = False


class Colocation:
    def __init__(self, rule: ColocationRule, profiles: dict[tuple[str, int], JobProfile], *,
                 mps: MpsControl | None, clock: Callable[[], float]):
        self.rule = rule
        self.profiles = profiles
        self.mps = mps
        self.clock = clock
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self.decisions: Counter[str] = Counter()
        self.mps_state = "off" if mps is None else "starting"

    def start(self) -> None:
        if self.mps is not None:
            self.mps.start()
            self.mps_state = "ok"

    def reservations(self) -> list[Reservation]:
        with self._lock:
            return [h.reservation for h in self._held.values()]

    def tick(self, sample: Sample) -> None:
        """Every tick: keep MPS healthy, and drop reservations of jobs that ended."""
        if self.mps is not None:
            self.mps_state = self.mps.health()
        now = self.clock()
        with self._lock:
            for job, held in list(self._held.items()):
                if job in sample.jobs:
                    held.seen = True
                elif held.seen or now - held.since > UNSEEN_GRACE_S:
                    del self._held[job]
                    log.info("colocation job=%s reservation on %s released (job %s)", job,
                             held.reservation.gpu_uuid, "ended" if held.seen else "never appeared")

    def admit(self, job: str, sample: Sample | None, *, model: str, batch_size: int,
              profile: JobProfile | None = None, gpu: str = "auto") -> Decision:
        if profile is None:
            profile = self.profiles.get((model, batch_size))
        if sample is None:
            return self._count(Decision(False, job, None, None, None, "noded has not sampled the node yet"))
        if profile is None:
            return self._count(Decision(False, job, None, None, None,
                                        f"no profile for {model} at batch size {batch_size}: give one with "
                                        "--profile (ncu CSV or profile file) or add it to colocation.profiles"))
        if self.mps is not None and self.mps_state not in ("ok", "restarted"):
            return self._count(Decision(False, job, None, None, None, f"MPS is not running ({self.mps_state})"))
        with self._lock:
            if job in self._held:
                r = self._held[job].reservation
                return self._count(Decision(False, job, r.gpu_uuid, None, None,
                                            f"{job} is already admitted on {r.gpu_uuid}"))
            reservations = [h.reservation for h in self._held.values()]
            decision = decide(job, profile, batch_size, gpu_loads(sample, reservations), self.rule, gpu,
                              pipe_dir=self.mps.pipe_dir if self.mps else None)
            if decision.admit:
                self._held[job] = _Held(Reservation(job, decision.gpu_uuid, profile, batch_size), self.clock())
        return self._count(decision)

    def _count(self, d: Decision) -> Decision:
        self.decisions["admit" if d.admit else "refuse"] += 1
        log.info("colocation decision=%s job=%s gpu=%s predicted_speedup=%s reason=%r sources=%s",
                 "admit" if d.admit else "refuse", d.job, d.gpu_uuid, d.predicted_speedup, d.reason,
                 ",".join(d.sources))
        return d

    def release(self, job: str) -> bool:
        with self._lock:
            return self._held.pop(job, None) is not None

    def close(self) -> None:
        if self.mps is not None:
            self.mps.stop()
            self.mps_state = "off"
