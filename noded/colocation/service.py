"""The daemon's co-location service: reservations of admitted jobs, the MPS control
daemon it runs (through an ``MpsSupervisor``, in a thread of its own: the daemon's
tick never waits on MPS), and the admission decisions it answers for ``nodectl admit``.

What decides an admission: the fitted speedup model where there is one (loaded
from the state directory at start, or fitted at run time by ``nodectl model fit``),
else the ΣC rule (see ``admission.decide``). A model file that cannot be used is
refused loudly at start and the ΣC rule decides; it never stops noded starting.

The service is closable at any point (before or after ``start``, twice): ``close``
stops MPS within a bounded time; ``with`` closes it too.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable

from mps.supervisor import MpsSupervisor

from noded.util.journal import log_change, word, words  # a job named in a message: one word, one to one
from noded.samplers.sample import Sample
from noded.colocation.admission import ColocationRule, Decision, Reservation, decide, gpu_loads
from noded.colocation.outcomes import ModelError, Outcomes
from noded.colocation.view import ColocationView
from noded.colocation.profiles import JobProfile, ProfileError

log = logging.getLogger(__name__)

#: A reservation for a job that never shows up on the node is dropped after this.
UNSEEN_GRACE_S = 600.0
#: A job alone on its GPU is measured this long through NVML before its profile is learned.
PROBATION_S = 60.0


@dataclass
class _Held:
    reservation: Reservation
    since: float
    seen: bool = False


class Colocation:
    def __init__(self, rule: ColocationRule, profiles: dict[tuple[str, int], JobProfile], *,
                 mps: MpsSupervisor | None, clock: Callable[[], float], outcomes: Outcomes | None = None,
                 probation_s: float = PROBATION_S):
        self.rule = rule
        self.profiles = profiles
        self.mps = mps
        self.clock = clock
        self.outcomes = outcomes
        self.probation_s = probation_s
        self.learned: dict[tuple[str, int], JobProfile] = {}  # from NVML, for models without a profile
        self._probation: dict[str, tuple[float, list[float], list[float]]] = {}  # job -> (since, sm%, mem%)
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._closed = False
        # both keys from the start: a scrape copies it while admissions count, and the
        # series exist before the first decision
        self.decisions: Counter[str] = Counter({"admit": 0, "refuse": 0})
        #: what decides admissions, for operators: "model fitted from N records" or "ΣC rule (...)"
        self.decided_by = "ΣC rule (no speedup model fitted)" if rule.coef is None else "speedup model (given)"
        if outcomes is not None and rule.coef is None:
            self._load_model(outcomes)

    def _load_model(self, outcomes: Outcomes) -> None:
        try:
            model = outcomes.load_model()
        except ModelError as e:
            log.error("colocation: REFUSED the saved speedup model, deciding with the ΣC rule (threshold %g) "
                      "until `nodectl model fit` succeeds: %s", self.rule.threshold_c, e)
            self.decided_by = f"ΣC rule (saved model refused: {e})"
            return
        if model is not None:
            self.rule = replace(self.rule, coef=tuple(model["linear"]))
            self.decided_by = f"speedup model fitted from {model['records']} records ({outcomes.model_path})"
            log.warning("colocation: admissions decided by the %s", self.decided_by)

    @property
    def mps_state(self) -> str:
        """``off`` (no MPS), else the supervisor's state; admissions need ``ok``."""
        return "off" if self.mps is None else self.mps.state

    def start(self) -> "Colocation":
        """Compile the kernels, start supervising MPS (in its own thread; returns at once)."""
        from noded.colocation import kernels

        kernels.warm_up()
        if self.mps is not None:
            self.mps.start()
        return self

    def view(self) -> ColocationView:
        with self._lock:
            per_gpu = Counter(h.reservation.gpu_uuid for h in self._held.values())
            decisions = dict(self.decisions)
        return ColocationView(MappingProxyType(decisions), MappingProxyType(dict(per_gpu)), self.mps_state,
                              self.decided_by, self.mps.restarts if self.mps is not None else 0,
                              self.mps.start_failures if self.mps is not None else 0)

    def reservations(self) -> list[Reservation]:
        with self._lock:
            return [h.reservation for h in self._held.values()]

    def tick(self, sample: Sample) -> None:
        """Every tick: learn profiles, drop reservations of jobs that ended. Never waits
        on MPS (its supervisor keeps it up in its own thread)."""
        now = self.clock()
        self._learn_from_nvml(sample, now)
        with self._lock:
            for job, held in list(self._held.items()):
                if job in sample.jobs:
                    held.seen = True
                elif held.seen or now - held.since > UNSEEN_GRACE_S:
                    del self._held[job]
                    log_change("reservation-released", job, gpu=held.reservation.gpu_uuid,
                               reason="the job ended" if held.seen else "the job never appeared")

    def _learn_from_nvml(self, sample: Sample, now: float) -> None:
        """A GPU job alone on its GPU, with a model and batch size in its labels, is
        measured for ``probation_s``: its mean SM and memory utilisation become that
        model's profile (source "nvml") where no profile file has one."""
        alone = {}
        for g in sample.gpus:
            holders = [j for j in sample.jobs.values() if g.uuid in j.gpus]
            if len(holders) == 1 and not g.lost and g.util_memory is not None:
                alone[holders[0].id] = (holders[0], g.util_memory)
        for job in [j for j in self._probation if j not in alone]:
            del self._probation[job]  # no longer alone (or gone): start again later
        for job_id, (js, mem) in alone.items():
            key = (js.meta.model, js.meta.batch_size)
            if None in key or key in self.profiles or key in self.learned or js.gpu_util is None:
                continue
            if not (0 <= js.gpu_util <= 100 and 0 <= mem <= 100):  # NaN fails both: never learned
                continue
            since, sm, mm = self._probation.setdefault(job_id, (now, [], []))
            sm.append(float(js.gpu_util))
            mm.append(float(mem))
            if now - since >= self.probation_s:
                window = (now - since) * 1e6
                del self._probation[job_id]
                try:
                    self.learned[key] = JobProfile(key[0], key[1], sum(sm) / len(sm) * window,
                                                   sum(mm) / len(mm) * window, window, f"nvml:{job_id}")
                except ProfileError as e:
                    log.warning("colocation: not learning a profile from %s: %s", word(job_id), e)
                    continue
                log.info("colocation learned profile model=%s batch=%d from %s over %.0fs: C/W=%.1f%% M/W=%.1f%%",
                         key[0], key[1], word(job_id), now - since, sum(sm) / len(sm), sum(mm) / len(mm))

    def report(self, job: str, seconds: float, sample: Sample | None) -> dict:
        """An iteration time from a job; returns whether it ran alone or with whom."""
        if self.outcomes is None:
            raise ValueError("outcomes are not recorded on this node")
        with self._lock:
            mine = self._held.get(job)
            uuid = mine.reservation.gpu_uuid if mine else None
            if uuid is None and sample is not None and job in sample.jobs and sample.jobs[job].gpus:
                uuid = sample.jobs[job].gpus[0]
            peers = frozenset(h.reservation.job for h in self._held.values()
                              if h.reservation.gpu_uuid == uuid and h.reservation.job != job)
            features = {h.reservation.job: (h.reservation.profile.c_norm, h.reservation.profile.m_norm,
                                            float(h.reservation.batch_size)) for h in self._held.values()}
        self.outcomes.report(job, seconds, peers)
        record = self.outcomes.observe(peers | {job}, features) if peers else None
        if record is not None:
            log.info("colocation observed speedup=%.2f of jobs %s", record.delta, words(record.jobs))
        return {"job": job, "alone": not peers, "peers": sorted(peers),
                "observed_speedup": None if record is None else record.delta}

    def fit(self) -> dict:
        if self.outcomes is None:
            raise ValueError("outcomes are not recorded on this node")
        model = self.outcomes.fit()  # raises, changing nothing, where the fit is unusable
        with self._lock:
            self.rule = replace(self.rule, coef=tuple(model["linear"]))
            self.decided_by = f"speedup model fitted from {model['records']} records ({self.outcomes.model_path})"
        log.warning("colocation model refitted from %d records (mean abs error %.3f); it decides admissions now",
                    model["records"], model["mean_abs_error"])
        return model

    def admit(self, job: str, sample: Sample | None, *, model: str, batch_size: int,
              profile: JobProfile | None = None, gpu: str = "auto", uid: int | None = None) -> Decision:
        if profile is None:
            profile = self.profiles.get((model, batch_size)) or self.learned.get((model, batch_size))
        if sample is None:
            return self._count(Decision(False, job, None, None, None, "noded has not sampled the node yet",
                                        refusal="not-sampled"))
        if profile is None:
            return self._count(Decision(False, job, None, None, None,
                                        f"no profile for {model} at batch size {batch_size}: give one with "
                                        "--profile (ncu CSV or profile file) or add it to colocation.profiles",
                                        refusal="no-profile"))
        if self.mps is not None and self.mps.state != "ok":
            why = f"MPS is not running ({self.mps.state}" + (f": {self.mps.last_error})" if self.mps.last_error else ")")
            return self._count(Decision(False, job, None, None, None, why, refusal="mps-not-ready"))
        with self._lock:
            if job in self._held:
                r = self._held[job].reservation
                return self._count(Decision(False, job, r.gpu_uuid, None, None,
                                            f"{job} is already admitted on {r.gpu_uuid}",
                                            refusal="already-admitted"))
            reservations = [h.reservation for h in self._held.values()]
            decision = decide(job, profile, batch_size, gpu_loads(sample, reservations), self.rule, gpu,
                              pipe_dir=self.mps.pipe_dir if self.mps else None, uid=uid)
            if decision.admit:
                self._held[job] = _Held(Reservation(job, decision.gpu_uuid, profile, batch_size, uid), self.clock())
        return self._count(decision)

    def _count(self, d: Decision) -> Decision:
        self.decisions["admit" if d.admit else "refuse"] += 1
        log_change("admit" if d.admit else "refuse", d.job, gpu=d.gpu_uuid, predicted_speedup=d.predicted_speedup,
                   sources=",".join(d.sources) or None, reason=d.reason)
        return d

    def release(self, job: str) -> bool:
        with self._lock:
            held = self._held.pop(job, None)
        if held is not None:
            log_change("reservation-released", job, gpu=held.reservation.gpu_uuid, reason="released on request")
        return held is not None

    def close(self) -> None:
        """Stop MPS (bounded: see MpsSupervisor.close); safe before start, and twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.mps is not None:
            self.mps.close()

    def __enter__(self) -> "Colocation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
