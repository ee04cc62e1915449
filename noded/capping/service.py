"""The daemon's caps: which job is capped at what (``plan``: noded.capping.plan), and a
``CapHolder`` steering each capped job's own control group.

One writer a knob: where a job's tasks are (a level group or its cap group) is the
throttle's to write (``MbaThrottle``, told ``CAPPED`` for a capped job); the MB value of a
cap group is its holder's. A holder starts once its job is in its cap group and stops,
leaving the group to the throttle, when the cap ends or the job does; the throttle then
moves the job out (to the level the policy gives it) and removes the group it no longer
needs. At stop every cap group goes with the level groups (``release_all``); after a
SIGKILL the next start removes them with every group of noded's (``remove_orphans``).

A holder that stopped steering (its group or the whole mount went away: an operator's
rmdir, resctrl unmounted and mounted again) or that steers a mount no longer current is
stopped and started anew once the throttle has put the job in a cap group again: it is
never left steering a dead group until its cap ends.

Below MBA's lowest value (``noded.capping.cores``) a capped job's CPUs are halved: the
levels are decided here, from what each holder measured, and written by the one owner of
every job's CPUs (``cpu_wishes``, then ``cpus_applied`` once the owner wrote them).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from noded.util.halving import kept_cpus
from noded.capping.cores import kept, next_level
from noded.capping.holder import NODED, CapHolder
from noded.capping.plan import OVERRIDE, Cap, plan_caps
from noded.util.journal import log_change, word, words  # a job named in a message: one word, one to one
from noded.jobs.model import Job
from noded.samplers.sample import UNKNOWN, Sample

if TYPE_CHECKING:  # what the owner of CPUs hands back: a type, not an arrow up
    from noded.actuators.cpusets import CpuSetResult

log = logging.getLogger(__name__)
#: the owner's records of a job's CPUs (noded.actuators.cpurecords: the keys of originals.json)
CPU_RECORDS = ("cpuset", "affinity", "affinity_job")
#: a reserve's cap moves a little every tick with what the GPU jobs use: the journal says
#: a change of more than this share (the holder follows every one)
JOURNAL_STEP = 0.05


@dataclass(frozen=True)
class CapState:
    """One capped job, for explain and the metrics."""

    cap_bps: float
    source: str
    why: str
    mode: str | None  # "noded" (its controller) or "kernel mba_MBps"; None: no holder yet
    measured_bps: float | None  # the holder's last period
    held: str | None  # the MB values held last ("70" or "70..80 (40 % at 80)")
    unreachable: bool = False
    note: str | None = None  # why no holder steers it (yet)
    cpus: str | None = None  # on fewer cores below MBA's lowest value: "2 of 8 CPUs"; None: its own
    busy_threads: int | None = None  # what its holder last read (the curve it steers on)
    #: no CLOSID of its own: the group it shares and with whom; None: in its own group
    shared_group: str | None = None
    shared_with: tuple[str, ...] = ()
    #: where others share its group: its holder steers their sum to the strictest cap there
    steered_for: tuple[str, ...] = ()


class CapService:
    def __init__(self, rc: Callable[[], object], cap_group: Callable[[str], str], *, dry_run: bool = False,
                 places: Callable[[], Mapping] | None = None):
        self.rc = rc  # the mount now (None while it is not)
        self.cap_group = cap_group  # job -> the name of its cap group (the throttle's)
        # job -> where the throttle holds it this tick (noded.actuators.mba.CapPlace: its own
        # group, or the one it shares for want of a CLOSID); None: always its own
        self.places = places or (lambda: {})
        self.shared: dict[str, object] = {}  # capped job -> the CapPlace it shares, while it shares one
        self.dry_run = dry_run
        self.holders: dict[str, CapHolder] = {}
        self.caps: dict[str, Cap] = {}
        self.notes: dict[str, str] = {}
        # below MBA's lowest value: job -> (halvings of its CPUs, of how many CPUs)
        self.core_levels: dict[str, tuple[int, int]] = {}
        self._cores_changed_at: dict[str, float] = {}  # job -> when (its holder's clock) they last changed
        self._pending: dict[str, tuple[int, int, str, int]] = {}  # this tick's: job -> (from, to, why, of CPUs)
        self._blind_since: dict[str, float] = {}  # job -> since when (sample.t) its kind is unknown
        self._end_why: dict[str, str] = {}  # this tick's plan: job -> why its cap in force ends

    def plan(self, sample: Sample, overrides: Mapping, source_caps: Mapping[str, float], reserve_bps: float | None,
             peak_bytes_per_domain: float, automatic: bool = True, blind_hold_s: float = 30.0) -> dict[str, Cap]:
        """This tick's caps. ``automatic=False`` (paused): only operators' caps.
        ``blind_hold_s``: how long a capped job whose kind noded cannot tell keeps its cap
        (``_held_blind``)."""
        override_caps = {j: o.cap_bps for j, o in overrides.items() if o.cap_bps is not None}
        level_owned = frozenset(j for j, o in overrides.items() if o.cap_bps is None)
        domains = len(sample.node_bandwidth_bps)
        peak = peak_bytes_per_domain * domains if domains else None
        # A tick whose job rates span more than one tick (the node read thin until now, a
        # reserve just set by a reload) shares nothing out: a job's mean since its last read
        # may be a level it left. Nothing is capped then (a node is read thin only with no
        # reserve and no cap): the reserve's caps come a tick later.
        reserve = reserve_bps if automatic and sample.job_bandwidth_current else None
        caps = plan_caps(sample.jobs, override_caps, level_owned, source_caps if automatic else {},
                         reserve, peak, {j: c.bps for j, c in self.caps.items()})
        if not automatic:
            caps = {j: c for j, c in caps.items() if c.source == OVERRIDE}
        return self._held_blind(sample, caps, override_caps, level_owned, automatic, blind_hold_s)

    def _held_blind(self, sample: Sample, caps: dict[str, Cap], override_caps: Mapping[str, float],
                    level_owned: frozenset[str], automatic: bool, hold_s: float) -> dict[str, Cap]:
        """``caps`` with the cap in force kept for each capped job whose kind this tick cannot
        tell (NVML unanswered: which processes hold a GPU is unknown, so plan_caps caps no
        job of it): an operator's for as long as the operator's cap stands, any other for at
        most ``hold_s`` seconds of not knowing (contention.missing_release_s, the time a
        throttle level holds while data is missing). Nothing is newly capped blind, and past
        that time the cap goes, as the levels do: noded holds no throttle blind. (Before,
        one tick of NVML late released every cap, an operator's too, and made it again at
        the next: the job ran uncapped in between.)"""
        blind = {j for j, js in sample.jobs.items() if js.kind == UNKNOWN}
        self._blind_since = {j: self._blind_since.get(j, sample.t) for j in blind}
        out = dict(caps)
        for job in sorted(blind & set(self.caps) - set(caps) - level_owned):
            was = self.caps[job]
            if was.source == OVERRIDE:
                if job in override_caps:
                    out[job] = replace(was, bps=override_caps[job])
            elif automatic and sample.t - self._blind_since[job] < hold_s:
                out[job] = was
        # why each cap in force now ends, for its cap-ended line (before_apply)
        self._end_why = {}
        for job in set(self.caps) - set(out):
            self._end_why[job] = (
                "the job ended" if job not in sample.jobs else
                "an operator holds it at a level or exempts it" if job in level_owned else
                "the operator's cap was released" if self.caps[job].source == OVERRIDE else
                "paused: only operators' caps hold" if not automatic else
                f"its kind has been unknown for {hold_s:g}s (contention.missing_release_s: NVML unanswered, which "
                "processes hold a GPU is not known), and noded holds no throttle blind" if job in blind else
                "the plan caps it no more (no default cap of its source, no share of the GPU reserve due)")
        return out

    def before_apply(self, caps: Mapping[str, Cap]) -> None:
        """Stop the holders of jobs no longer capped: the throttle moves them out next."""
        for job in sorted(set(self.holders) - set(caps)):
            self.holders.pop(job).stop(remove=False)
        for job in sorted(set(self.caps) - set(caps)):
            was = self.caps.pop(job)
            log_change("cap-ended", job, cap_bps=round(was.bps), source=was.source,
                       reason=self._end_why.get(job, "the job is at a level again"))
        for job in sorted(set(self.shared) - set(caps)):
            log_change("cap-unshared", job, group=self.shared.pop(job).group, reason="its cap ended")
        self.notes = {j: n for j, n in self.notes.items() if j in caps}

    def _steering(self, caps: Mapping[str, Cap]) -> tuple[dict, dict[str, float]]:
        """This tick's places, and each steered group's target: the strictest cap of the
        capped jobs in it (their sum held there, so each is at or below its own)."""
        places = dict(self.places())
        target: dict[str, float] = {}
        for job, cap in caps.items():
            group = places[job].group if job in places else self.cap_group(job)
            target[group] = min(target.get(group, cap.bps), cap.bps)
        return places, target

    def _say_shared(self, job: str, place, in_group: bool) -> None:
        """A journal line when a capped job begins to share a group, and when it ends."""
        was = self.shared.get(job)
        sharing = place is not None and not place.own and in_group
        if sharing:
            self.shared[job] = place  # with whom, as of now (said again only for another group)
        if sharing and (was is None or was.group != place.group):
            log_change("cap-unheld" if place.group == "" else "cap-shared", job, group=place.group or None,
                       severity=logging.WARNING,
                       reason=_shared_words(job, place, self.caps) + "; its own cap cannot be steered until a CLOSID "
                       "is free")
        elif not sharing and was is not None and place is not None and place.own and in_group:
            del self.shared[job]
            log_change("cap-unshared", job, group=place.group,
                       reason=f"in its own cap group now (a CLOSID came free, or the group it was alone in "
                              f"became its own), steered to its own cap; it shared {was.group}")

    def after_apply(self, caps: Mapping[str, Cap], in_cap_group: Callable[[str], bool]) -> None:
        """Start or retarget each capped job's holder, once the job is in its cap group."""
        for job, cap in sorted(caps.items()):
            before = self.caps.get(job)
            if before is None or before.source != cap.source or abs(before.bps - cap.bps) > JOURNAL_STEP * before.bps:
                log_change("cap-set" if before is None else "cap-changed", job, cap_bps=round(cap.bps),
                           source=cap.source, reason=cap.why)
            self.caps[job] = cap
        places, target = self._steering(caps)
        for job, cap in sorted(caps.items()):
            place = places.get(job)
            group = place.group if place is not None else self.cap_group(job)
            in_group = in_cap_group(job)
            self._say_shared(job, place, in_group)
            holder = self.holders.get(job)
            if holder is not None and (place is not None and not place.steers or holder.group.name != group):
                # it shares a group another job's holder steers, or it moved (to its own group
                # once a CLOSID was free): one holder a group, on the group it is in
                self.holders.pop(job).stop(remove=False)
                holder = None
            if holder is not None and (not holder.alive or holder.rc is not self.rc()):
                # its group or its mount went away (rmdir, an unmount, a remount): a new one
                # on the mount now, once the throttle has put the job back in a cap group
                log.warning("cap %s: its holder stopped steering (%s); started again on the mount as it is now",
                            word(job), "resctrl was mounted again" if holder.alive else "its group or mount went away")
                self.holders.pop(job).stop(remove=False)
                holder = None
            if place is not None and not place.steers:
                self.notes.pop(job, None)  # what it shares is said by view()
                continue
            if holder is not None:
                if holder.cap != target[group]:
                    holder.set_cap(target[group])
                continue
            if self.dry_run:
                self.notes[job] = "dry run: no holder steers it"
                continue
            if not in_group:
                self.notes[job] = "not in its cap group yet (the move failed: see the log)"
                continue
            rc = self.rc()
            if rc is None:
                self.notes[job] = "resctrl is not mounted now"
                continue
            try:
                self.holders[job] = CapHolder(rc, job, [], target[group], group_name=group).start()
            except Exception as e:  # noqa: BLE001 (one job's holder must not stop the tick)
                self.notes[job] = f"no holder: {type(e).__name__}: {e}"
                log.warning("cap %s: no holder this tick (tried again next tick): %s", word(job), e)
                continue
            self.notes.pop(job, None)

    # -- below MBA's lowest value: fewer cores
    def cpu_wishes(self, sample: Sample, owner, base: Mapping[str, Iterable[int] | None]) -> dict:
        """``base`` (what the rest of noded wants of each job's CPUs: right-sizing's plan, or
        nothing) with each capped job's CPUs halved as far as its cap needs: for the one
        owner of every job's CPUs (``owner``) to write. A job no longer capped has no wish
        of the cap's: the owner puts back what it recorded."""
        wishes = dict(base)
        self._pending = {}
        for job in [j for j in self.core_levels if j not in self.caps or j not in sample.jobs]:
            level, _ = self.core_levels.pop(job)
            self._cores_changed_at.pop(job, None)
            if job in sample.jobs:
                log_change("cap-cores", job, level_from=level, level_to=0, cause="cap_ended",
                           reason="the cap ended: its own CPUs back")
        for job, cap in sorted(self.caps.items()):
            js, h = sample.jobs.get(job), self.holders.get(job)
            v = owner.view(job, js) if js is not None else None
            if v is None or not v.original:
                continue  # its CPUs unknown this tick: left as they are
            own = sorted(base.get(job) or v.original)
            level, _ = self.core_levels.get(job, (0, len(own)))
            if h is not None and h.mode == NODED and h.alive and not self.dry_run:
                # one period's pair, read once (the holder's thread publishes each period whole:
                # read as two attributes, a period's bound came beside the next's "since", or a
                # "since" seen set was gone when read again)
                seen, now = h.steering, h.clock()
                since = seen.unreachable_since
                changed = self._cores_changed_at.get(job)
                step = next_level(level, len(own), cap.bps,
                                  unreachable_for_s=None if since is None else now - since,
                                  lowest_bound_bps=seen.lowest_bound,
                                  since_change_s=None if changed is None else now - changed)
                if step.level != level:
                    self._pending[job] = (level, step.level, step.why or "", len(own))
                    level = step.level
            if level:
                self.core_levels[job] = (level, len(own))
                wishes[job] = kept_cpus(own, level)
            else:
                self.core_levels.pop(job, None)
        return wishes

    def placements_wanted(self, jobs: Mapping[str, Job], record_keys: Iterable[str]) -> set[str]:
        """The jobs whose CPUs a tick must read where only caps change CPUs: the capped ones
        (a cap set since the last tick is read from the next) and every job the owner holds a
        record of (``record_keys``: its originals' keys), whose CPUs it may put back."""
        wanted = {j for j in self.caps if j in jobs}
        by_cgroup = {job.cgroup: j for j, job in jobs.items() if job.cgroup}
        by_pid: dict[int, str] | None = None  # made at the first record of a process
        for key in record_keys:
            kind, _, where = key.partition(":")
            if kind == "affinity_job" and where in jobs:
                wanted.add(where)
            elif kind == "cpuset":  # the job's cgroup or one below it
                path = where
                while path not in by_cgroup and os.path.dirname(path) != path:
                    path = os.path.dirname(path)
                if path in by_cgroup:
                    wanted.add(by_cgroup[path])
            elif kind == "affinity":  # a process of a job without a cpuset: its pid among the job's
                if by_pid is None:
                    by_pid = {pid: j for j, job in jobs.items() for pid in job.pids}
                pid_text = where.partition(":")[0]
                if pid_text.isdigit() and int(pid_text) in by_pid:
                    wanted.add(by_pid[int(pid_text)])
        return wanted

    @staticmethod
    def cpus_recorded(owner) -> bool:
        """Whether the owner holds an original of some job's CPUs (one to put back)."""
        return any(key.partition(":")[0] in CPU_RECORDS for key, _ in owner.originals.items())

    def cpus_applied(self, result: CpuSetResult) -> None:
        """The owner wrote this tick's CPUs: each capped job whose CPUs changed has its holder
        start afresh (its curves were of other cores) and the change journalled; one whose
        write failed is decided again next tick from where it is."""
        failed = {c.job: c.error for c in result.failed}
        for job, (was, now, why, ncpus) in sorted(self._pending.items()):
            if job in failed:
                if was:
                    self.core_levels[job] = (was, ncpus)
                else:
                    self.core_levels.pop(job, None)
                continue
            h = self.holders.get(job)
            if h is not None:
                h.cores_changed()
                self._cores_changed_at[job] = h.clock()
            log_change("cap-cores", job, level_from=was, level_to=now, cause="capped",
                       reason=why + ("" if now else " (its own CPUs back)"))
        self._pending = {}

    def view(self) -> Mapping[str, CapState]:
        out = {}
        places = self.places()
        for job, cap in self.caps.items():
            place = places.get(job)
            shared = self.shared.get(job)
            h = self.holders.get(job)
            seen = h.steering if h is not None else None  # one period's whole (read once)
            hold = seen.held if seen is not None else None
            held = None if hold is None else (str(hold.low) if hold.high_share <= 0 or hold.high == hold.low else
                                              f"{hold.low}..{hold.high} ({hold.high_share:.0%} at {hold.high})")
            level, ncpus = self.core_levels.get(job, (0, 0))
            out[job] = CapState(cap.bps, cap.source, cap.why, h.mode if h is not None else None,
                                seen.last_rate if seen is not None else None, held,
                                bool(hold is not None and hold.unreachable), self.notes.get(job),
                                f"{kept(ncpus, level)} of {ncpus} CPUs" if level else None,
                                seen.threads or None if seen is not None else None,
                                shared.group if shared is not None else None,
                                shared.shared_with if shared is not None else (),
                                place.shared_with if place is not None and place.steers else ())
            if shared is not None:
                out[job] = replace(out[job], note=_shared_words(job, shared, self.caps, self._held_in(shared.group))
                                   + "; its own cap cannot be steered until a CLOSID is free")
        return MappingProxyType(out)

    def _held_in(self, group: str) -> str | None:
        """The MB value the holder steering ``group`` held last."""
        for h in self.holders.values():
            hold = h.steering.held
            if h.group.name == group and hold is not None:
                return str(hold.low) if hold.high_share <= 0 or hold.high == hold.low else \
                    f"{hold.low}..{hold.high} ({hold.high_share:.0%} at {hold.high})"
        return None

    def stop_all(self) -> None:
        for job in sorted(self.holders):
            self.holders.pop(job).stop(remove=False)  # the throttle's release_all removes the groups


def _shared_words(job: str, place, caps: Mapping[str, Cap], held: str | None = None) -> str:
    """What a job gets that shares a group for want of a CLOSID, in words."""
    others = words(place.shared_with) or "no other job now"
    if place.group == "":
        return ("no CLOSID left for its own cap group and no group of noded's to share (other owners hold every "
                "CLOSID): NOT held, it runs unlimited")
    if place.level is not None:
        return (f"no CLOSID left for its own cap group: shares CLOSID {place.group} with {others}: held at "
                f"MB={place.mb} (level {place.level}'s value, the lowest of noded's groups)")
    strictest = min(caps[j].bps for j in (job, *place.shared_with) if j in caps) if job in caps else None
    at = f"MB={held}" if held is not None else "the MB value"
    within = f" ({strictest / 1e9:.3g} GB/s)" if strictest is not None else ""
    return (f"no CLOSID left for its own cap group: shares CLOSID {place.group} with {others}: held at {at} "
            f"that the group's holder steers to keep the sharers' sum within the strictest cap there{within}")
