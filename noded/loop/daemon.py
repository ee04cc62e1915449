"""The loop: sample -> decide (pure) -> apply the difference -> publish the result.

Fixed-rate on a monotonic clock; a tick that overruns skips the missed slots
rather than bunching up. ``stop`` (a threading.Event) interrupts the wait at once.
Metrics read ``last`` (one reference, swapped whole), never the hardware.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping

from noded.actuators.cpusets import CpuSetResult
from noded.actuators.memsoft import MemoryResult
from noded.actuators.plan import CAPPED, UNKNOWN, Applied, ApplyResult
from noded.policy.baselines import LEARNED
from noded.capping.service import CapState
from noded.colocation.view import ColocationView
from noded.config import GB, Config
from noded.loop.control import ControlSnapshot, ControlState
from noded.util.signalflag import SignalFlag
from noded.util.journal import NOTICE, log_change
from noded.loop.health import Liveness
from noded.loop.lasting import LastingStates
from noded.loop.parts import Parts
from noded.policy.contention import NOTHING_LEFT_TO_THROTTLE, Decision, PolicyState, decide
from noded.util.ratelimit import RateLimitedLog
from noded.rightsize.cpuplan import CpuPlan, PlanError
from noded.rightsize.service import RightsizeView
from noded.samplers.sample import GPU, Sample
from noded.samplers.telemetry import Telemetry
from noded.loop.tickstats import TickStats, Totals
from noded.loop.watching import Watch, watching

if TYPE_CHECKING:  # the split needs numba: loaded only where memory is sized
    from noded.rightsize.memsplit import MemorySplit

log = logging.getLogger(__name__)


#: How often the state directory is tried for writing while throttles may be needed.
STATE_PROBE_S = 10.0

#: where in a tick one job's part can fail alone (that job held, the others go on), in words
JOB_ERROR_STAGES = {"monitor": "monitoring group's sync", "cpus": "CPUs' reading", "act": "change"}


@dataclass(frozen=True)
class TickFailure:
    """A tick that raised: why, how many in a row, the ticks completed before it, and
    when (wall-clock Unix seconds; None where not known)."""

    error: str
    in_a_row: int
    completed: int
    at: float | None = None


@dataclass(frozen=True)
class TickResult:
    tick: int
    t: float
    sample: Sample
    decision: Decision
    applied: tuple[Applied, ...]
    durations: Mapping[str, float]  # sample, decide, act, total (seconds)
    throttle_kind: str | None  # mba | cores | None (nothing can throttle here)
    levels: Mapping[str, int]  # levels in force after this tick (as observed, plus the writes that succeeded)
    state_unwritable: str | None = None  # why nothing new may be changed (the state directory), if so
    # GPU job -> (baseline utilisation %, where it came from); a GPU job absent has none yet
    baselines: Mapping[str, tuple[float, str]] = field(default_factory=lambda: MappingProxyType({}))
    config: Config | None = None  # the config this tick ran with
    overruns: int = 0  # ticks so far that took longer than their period
    original_cpus: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # cores hosts: CPU jobs
    colocation: ColocationView | None = None  # None: co-location is off
    control: ControlSnapshot = field(default_factory=ControlSnapshot)  # overrides, pause, action counts after it
    totals: Totals = field(default_factory=Totals)  # counted since start: durations, errors, failed ticks
    rightsize: RightsizeView | None = None  # None: right-sizing is off
    cpus: CpuSetResult | None = None  # the one owner of every job's CPUs applied this tick's plan (right-sizing)
    memory: MemoryView | None = None  # None: right-sizing's memory is off (rightsize.memory.cache_gb null)
    watching: tuple[Watch, ...] = ()  # what noded watches (jobs, gpus, resctrl), or why not
    # capped jobs after this tick: the cap, where it comes from, what its holder measured and holds
    caps: Mapping[str, CapState] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class MemoryView:
    """Right-sizing's memory this tick: the split (None when it could not be made: ``error``
    says why, and nothing was changed) and what the soft limits' writer did."""

    split: MemorySplit | None
    result: MemoryResult | None
    error: str | None = None


@dataclass(frozen=True)
class Decided:
    """What a tick decided: contention's decision, the levels in force it was made against,
    the caps planned (job -> cap) and why contention lasts with nothing left to throttle."""

    decision: Decision
    in_force: Mapping[str, int | None] = field(default_factory=lambda: MappingProxyType({}))
    caps: Mapping = field(default_factory=lambda: MappingProxyType({}))
    stuck: str | None = None


@dataclass(frozen=True)
class Acted:
    """What a tick changed: the levels' (or the plan's) result, the owner of CPUs' result,
    right-sizing's view and its memory's (None: off, or not this tick)."""

    result: ApplyResult
    cpus: CpuSetResult | None = None
    rightsize: RightsizeView | None = None
    memory: MemoryView | None = None


def nothing_left_to_throttle(decision: Decision) -> str | None:
    """Why contention lasts with nothing left to throttle, while it does (an alert's text)."""
    if decision.note != NOTHING_LEFT_TO_THROTTLE:
        return None
    return (f"node bandwidth {decision.node_share:.0%} of peak and GPU job"
            f"{'s' * (len(decision.slowed) > 1)} {', '.join(decision.slowed)} below baseline, but no CPU "
            "job can be throttled further (exempt, overridden, at its deepest level, or its bandwidth "
            "unknown): `nodectl explain JOB` says which")


def limits_while_unwritable(limits: Mapping[str, int], in_force: Mapping[str, int | None]) -> dict[str, int]:
    """No new original can be recorded: no level may rise above what is in force. A job
    whose level is unknown (None) or unsettled (a change left half done, -1) is at no
    level: nothing may rise there either, and no limit is below 0."""
    return {j: min(lvl, max(0, in_force.get(j) or 0)) for j, lvl in limits.items()}


class Daemon:
    def __init__(self, config: Config, parts: Parts, *, clock: Callable[[], float] = time.monotonic,
                 extra_info: Mapping[str, str] | None = None):
        self.config = config
        self.parts = parts  # frozen, whole: which parts are on is decided by the wiring, not here
        self.clock = clock
        self.state = PolicyState()
        # overrides, pause, decision history: what the admin socket changes (read once a tick)
        self.control = ControlState(parts.overrides, parts.registered_labels)
        self._plan_log = RateLimitedLog(log, 60.0, clock)  # a node short of CPUs says so once a minute, not a tick
        self.last: TickResult | None = None  # swapped whole each tick: what metrics and the admin socket read
        self.ticks = 0
        self.overruns = 0
        self.stats = TickStats()  # the loop's own counters; each TickResult carries a snapshot
        self.totals = Totals()  # the counters as of the last loop round, failed ticks too: what metrics read
        self.extra_info = dict(extra_info or {})
        self._reload = SignalFlag()  # set by SIGHUP's handler: no lock taken (see SignalFlag)
        self._state_failures_seen = 0
        self._state_checked: float | None = None
        self._state_unwritable: str | None = None
        #: per CPU job, what right-sizing's last plan granted it before halving: a cores host
        #: reads its levels in force against it (written once a tick, by _rightsize)
        self._granted: Mapping[str, tuple[int, ...]] = MappingProxyType({})
        self.lasting = LastingStates()  # states an alert can see: logged when each begins and ends
        self.liveness = Liveness(clock)  # when the loop's rounds end: /healthz and noded_last_tick_timestamp_seconds
        #: the last tick that raised, kept once ticks complete again (`nodectl status` says when it was)
        self.last_failure: TickFailure | None = None
        self.failures_in_a_row = 0  # ticks failed since the last that completed: 0 while ticks complete

    def request_reload(self) -> None:
        """Safe from a signal handler: the reload happens between two ticks."""
        self._reload.set()

    def reload(self, new: Config) -> list[str]:
        """Take a new config's tunables now; returns the changed keys that need a restart
        (those keep their running values: they shape what was built at start)."""
        old = self.config
        restart_only = {"resctrl": old.resctrl, "jobs": old.jobs, "metrics": old.metrics, "state_dir": old.state_dir,
                        "runtime_dir": old.runtime_dir, "nvml": old.nvml, "admin": old.admin,
                        "colocation": old.colocation, "rightsize": old.rightsize}
        needs_restart = [k for k, v in restart_only.items() if getattr(new, k) != v]
        for k in ("mba_levels", "method"):
            if getattr(new.contention, k) != getattr(old.contention, k):
                needs_restart.append(f"contention.{k}")
        contention = replace(new.contention, mba_levels=old.contention.mba_levels, method=old.contention.method)
        self.config = replace(new, contention=contention, **restart_only)
        if self.parts.throttle is not None:
            self.parts.throttle.use_peak(self.config.peak_bytes_per_domain)  # new MBps levels use it
        return needs_restart

    def _maybe_reload(self) -> None:
        if not self._reload.is_set() or self.parts.reloader is None:
            return
        self._reload.clear()
        # systemd hears RELOADING=1 now and READY=1 when it is over, applied or not; not
        # before the first tick's READY=1, which says that noded has started.
        notifier = self.parts.notifier if self.last is not None else None
        if notifier is not None:
            notifier.reloading()
        status = self._reload_config()
        if notifier is not None:
            notifier.ready(status)

    def _reload_config(self) -> str:
        """Read the config again and take it; returns how that went, for systemd's STATUS."""
        try:
            new = self.parts.reloader()
        except Exception:
            log.exception("config reload failed, keeping the running config")
            new = None
        if new is None:
            return "config reload refused; the running config is kept (the journal says why)"
        try:
            restart = self.reload(new)
        except Exception:
            log.exception("config reload failed, keeping the running config")
            return "config reload failed; the running config is kept (the journal says why)"
        log.warning("config reloaded%s", f"; these changes need a restart and were not applied: {', '.join(restart)}"
                    if restart else "")
        return "config reloaded" + (f"; needs a restart to apply: {', '.join(restart)}" if restart else "")

    def _state_check(self, now: float) -> str | None:
        """Why the state directory cannot be written now (None: it can): tried every
        STATE_PROBE_S, every second while it fails. Where originals cannot be recorded,
        nothing new is changed."""
        if self.parts.state_probe is None:
            return None
        every = 1.0 if self._state_unwritable else STATE_PROBE_S
        failures = self.parts.state_failed_writes() if self.parts.state_failed_writes is not None else 0
        if failures != self._state_failures_seen:
            self._state_failures_seen = failures
            if not self._state_unwritable:
                every = 0.0  # a write failed since: probed now, not at the end of the period
        if self._state_checked is not None and now - self._state_checked < every:
            return self._state_unwritable
        self._state_checked = now
        was, self._state_unwritable = self._state_unwritable, self.parts.state_probe()
        if self._state_unwritable and not was:
            log.error("state=unwritable reason=%r: noded monitors and exports but changes nothing new (no original "
                      "can be recorded); throttles in force may still be released", self._state_unwritable)
        elif was and not self._state_unwritable:
            log.warning("state=writable again: throttling resumes")
        return self._state_unwritable

    def _levels_in_force(self, sample: Sample) -> dict[str, int | None]:
        throttle = self.parts.throttle
        if throttle is None:
            return {}
        if throttle.kind == "cores":
            return throttle.levels_in_force(sample, self._granted)
        return throttle.levels_in_force(sample)

    def _rightsize(self, sample: Sample, decision: Decision, paused: str | None,
                   now: float) -> tuple[CpuPlan | None, RightsizeView]:
        """Right-sizing's part of a tick: its sizings fed from this Sample, and the node's
        plan of CPUs (None: nothing to plan, or no plan possible: the view says why)."""
        owner, rs = self.parts.cpu_owner, self.parts.rightsize
        originals, have = {}, {}
        for job, js in sample.jobs.items():
            v = owner.view(job, js)
            if v is not None:
                originals[job], have[job] = sorted(v.original), len(v.now)
        node_cpus = len(set().union(*map(set, originals.values()))) if originals else 0
        if paused:
            rs.hold(now)  # paused: no probe begins or moves on; every job keeps the size it asks for now
        else:
            rs.tick(sample, have, originals, now, node_cpus, max(1, len(sample.gpus)))
        cores = self.parts.throttle is not None and self.parts.throttle.kind == "cores"
        error = None
        try:
            plan = rs.plan(sample, originals, decision.levels if cores else {}, self.config.rightsize.lend_to, now)
        except PlanError as e:
            plan, error = None, str(e)
            self._plan_log.log(logging.WARNING, "plan", "rightsize: no plan of CPUs this tick: %s", e)
        # the next tick's levels in force are read against what the plan grants CPU jobs (lent CPUs included)
        self._granted = MappingProxyType({} if plan is None else {
            j: jc.granted for j, jc in plan.jobs.items() if jc.kind == "cpu"})
        return plan, rs.view(have, plan, error)

    def _memory(self, sample: Sample) -> MemoryView:
        """Right-sizing's memory: the exact split of ``rightsize.memory.cache_gb`` between the
        sized jobs that declare a cache curve, each carried out as a soft limit on its memory
        cgroup; limits no longer wished for are put back. A job whose cgroup could not be read
        this tick keeps what it has (an error is not "no limit")."""
        from noded.rightsize.memsplit import GIB, CacheJob, cache_curve, soft_limit_bytes, split_memory
        from noded.rightsize.split import SplitError

        cfg = self.config.rightsize.memory
        # every GPU job of an enabled source, whether or not its CPUs could be read this tick
        jobs = {j: sample.jobs[j] for j in self.parts.rightsize.gpu_jobs(sample)}
        wanted = [CacheJob(j, max(1, len(js.gpus)), cache_curve(js.meta.dataset_gb, js.meta.uncached_share))
                  for j, js in jobs.items()]
        try:
            split = split_memory(wanted, max(1, len(sample.gpus)), cfg.units, cfg.cache_gb)
        except SplitError as e:
            log.warning("rightsize: no memory split this tick (nothing changed): %s", e)
            return MemoryView(None, None, str(e))
        # the cgroups the Sample read (none where its memory sampler failed: an error is not
        # "no limit wished", so each job of the split is then held as it is)
        reading = sample.memory
        cgroups = {j: reading.cgroups[j] for j in split.units if reading is not None and j in reading.cgroups}
        unplaced = {j: reading.unplaced.get(j, "its memory cgroup was not read this tick") if reading is not None
                    else "the jobs' memory cgroups could not be read this tick" for j in split.units if j not in cgroups}
        headroom = int(cfg.headroom_gb * GIB)
        wishes = {j: soft_limit_bytes(cg.anon_bytes, split.units[j], split.unit_bytes, headroom)
                  for j, cg in cgroups.items()}
        result = self.parts.memory.apply(wishes, cgroups, unplaced)
        for c in result.failed:
            self.stats.actuator_error("memory", "record" if c.error.startswith("original not recorded") else "write")
        return MemoryView(split, result)

    def _apply_plan(self, plan: CpuPlan, levels: Mapping[str, int], in_force: Mapping[str, int | None],
                    sample: Sample) -> tuple[ApplyResult, CpuSetResult]:
        """Every job's CPUs from the plan, through the one owner: one writer a tick. On a host
        that halves cores the plan holds the levels too (the throttle does not write then); on
        an MBA host the throttle still applies its levels, and the owner only sizes and lends."""
        wishes = {job: plan.cpus_of(job) for job in plan.jobs}
        if self.parts.caps is not None:  # a capped job below MBA's lowest value: fewer of the plan's CPUs
            wishes = self.parts.caps.cpu_wishes(sample, self.parts.cpu_owner, wishes)
        cpus = self.parts.cpu_owner.apply(wishes, sample)
        if self.parts.throttle is None or self.parts.throttle.kind != "cores":
            throttle = self.parts.throttle
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

    def tick(self) -> TickResult:
        """sample -> decide (each controller proposes) -> one plan per knob -> apply -> result."""
        t0 = self.clock()
        sample = self.parts.telemetry.sample()
        t1 = self.clock()
        control = self.control.read()  # what operators set, once: every step below sees this reading
        unwritable = self._state_check(t1)
        if sample.jobs_known:
            decided = self._decide(sample, control, unwritable, t0)
            t2 = self.clock()
            acted = self._act(sample, decided, control.paused, t0)
        else:
            # Not knowing the jobs is not "no jobs": hold every decision as it stands,
            # forget nothing, change nothing, until discovery works again.
            decided, acted = self._holding(), Acted(ApplyResult((), MappingProxyType({})))
            t2 = self.clock()
        t3 = self.clock()
        durations = {"sample": t1 - t0, "decide": t2 - t1, "act": t3 - t2}
        return self._publish(t0, sample, control, decided, acted, durations)

    def _holding(self) -> Decided:
        """The decision while the jobs are unknown: every level as it stands."""
        return Decided(Decision(MappingProxyType({j: t.level for j, t in self.state.throttles.items()}), (),
                                False, None, (), "holding: jobs unknown (discovery failed), nothing changed"))

    def _decide(self, sample: Sample, control: ControlSnapshot, unwritable: str | None, now: float) -> Decided:
        """Contention's levels and the bandwidth caps, from this Sample and the operators' reading."""
        throttle = self.parts.throttle
        in_force = self._levels_in_force(sample)
        limits = throttle.max_levels(sample) if throttle else {}
        if unwritable:
            limits = limits_while_unwritable(limits, in_force)
        active = {o.job: o for o in control.overrides}
        overrides = {j: o.level for j, o in active.items() if o.cap_bps is None}
        paused = control.paused
        caps = self._plan_caps(sample, active, in_force, unwritable, paused)
        if paused:
            # Paused: nothing is throttled automatically (the policy still learns its
            # baselines); only what operators set explicitly holds.
            limits = {j: lvl for j, lvl in limits.items() if j in overrides}
        metas = {j: js.meta for j, js in sample.jobs.items() if js.kind == GPU}
        baselines = self.parts.baselines
        known = baselines.known(metas) if baselines else MappingProxyType({})
        decision, self.state = decide(sample, self.state, self.config.contention, self.config.peak_bytes_per_domain,
                                      limits, now, MappingProxyType(overrides),
                                      throttle.level_share if throttle else (lambda level: 1.0), known,
                                      frozenset(caps), paused=bool(paused))
        stuck = nothing_left_to_throttle(decision)
        if baselines:
            baselines.update(self.state.baselines, self.state.baseline_sources, metas)
        if paused:
            decision = replace(decision, note=f"paused: {paused}")
        elif unwritable:
            decision = replace(decision, note=f"state directory not writable ({unwritable}): no new throttles"
                               + (f"; {decision.note}" if decision.note else ""))
        for a in decision.actions:  # the why, before the actuator's lines saying what it wrote
            log_change(a.kind, a.job, level_from=a.from_level, level_to=a.to_level, cause=a.cause, reason=a.reason)
        return Decided(decision, in_force, caps, stuck)

    def _act(self, sample: Sample, decided: Decided, paused: str | None, now: float) -> Acted:
        """Right-sizing's plan of CPUs, then each knob written once: levels and caps (or the
        plan's CPUs), memory soft limits, co-location's view of the GPUs."""
        plan, rightsize = None, None
        if self.parts.rightsize is not None:
            plan, rightsize = self._rightsize(sample, decided.decision, paused, now)
        result, cpus = self._apply_levels(sample, decided, plan)
        memory = None
        if self.parts.memory is not None and self.parts.rightsize is not None:
            memory = self._memory(sample)
        if self.parts.colocation is not None:
            self.parts.colocation.tick(sample)
        return Acted(result, cpus, rightsize, memory)

    def _apply_levels(self, sample: Sample, decided: Decided,
                      plan: CpuPlan | None) -> tuple[ApplyResult, CpuSetResult | None]:
        """The levels and caps decided: through the plan of CPUs where right-sizing made one,
        else through the throttle; the caps' holders told before and after."""
        caps, in_force = decided.caps, decided.in_force
        # where each job's tasks go: its level's group, or its cap's own (decided here, once)
        places = {**decided.decision.levels, **{j: CAPPED for j in caps}}
        if self.parts.caps is not None:
            self.parts.caps.before_apply(caps)
        cpus = None
        if plan is not None:
            result, cpus = self._apply_plan(plan, places, in_force, sample)
        else:
            throttle = self.parts.throttle
            result = throttle.apply(places, sample) if throttle else ApplyResult((), MappingProxyType({}))
            cpus = self._cap_cores(sample)
        if self.parts.caps is not None and cpus is not None:
            self.parts.caps.cpus_applied(cpus)
        if self.parts.caps is not None:
            failed = {a.job for a in result.failed} | set(result.job_errors)
            self.parts.caps.after_apply(caps, lambda j: j not in failed and (
                in_force.get(j) == CAPPED or any(a.job == j and a.level == CAPPED for a in result.applied)))
        return result, cpus

    def _cap_cores(self, sample: Sample) -> CpuSetResult | None:
        """Without a plan of CPUs: a capped job below MBA's lowest value on fewer cores,
        through the one owner of every job's CPUs (None: nothing to write or put back)."""
        caps, owner = self.parts.caps, self.parts.cpu_owner
        if caps is None or owner is None:
            return None
        wishes = caps.cpu_wishes(sample, owner, {})
        return owner.apply(wishes, sample) if wishes or caps.cpus_recorded(owner) else None

    def _publish(self, t0: float, sample: Sample, control: ControlSnapshot, decided: Decided, acted: Acted,
                 durations: dict[str, float]) -> TickResult:
        """The tick's result, counted and swapped in whole: what metrics and the admin socket read."""
        decision, throttle = decided.decision, self.parts.throttle
        self.control.record(t0, decision.actions, sample.jobs if sample.jobs_known else None)
        self.ticks += 1
        durations["total"] = self.clock() - t0
        self.stats.tick(durations, ((s.name, s.ok, s.duration_s, s.cpu_s) for s in sample.samplers))
        self._count_errors(sample, acted)
        original_cpus = {}
        if throttle is not None and throttle.kind == "cores":
            original_cpus = {j: len(throttle.original_cpus(js)) for j, js in sample.jobs.items() if js.cpus is not None}
        rightsize = acted.rightsize
        if rightsize is None and self.parts.rightsize is not None:
            rightsize = self.parts.rightsize.view()
        result = TickResult(
            tick=self.ticks, t=t0, sample=sample, decision=decision, applied=acted.result.applied,
            durations=MappingProxyType(durations), throttle_kind=throttle.kind if throttle else None,
            levels=acted.result.levels,
            state_unwritable=self._state_check(self.clock()),  # a write of this tick's that failed shows here
            baselines=MappingProxyType({j: (b, self.state.baseline_sources.get(j, LEARNED))
                                        for j, b in self.state.baselines.items()}),
            config=self.config, overruns=self.overruns, original_cpus=MappingProxyType(original_cpus),
            colocation=self.parts.colocation.view() if self.parts.colocation is not None else None,
            control=self.control.after(control), totals=self.stats.snapshot(), rightsize=rightsize,
            cpus=acted.cpus, memory=acted.memory, watching=watching(sample, self.config),
            caps=self.parts.caps.view() if self.parts.caps is not None else MappingProxyType({}))
        self.last = result
        self.totals = result.totals
        # a state away for less than hold_s has not ended (contention flickers around its thresholds)
        self.lasting.update(self._lasting_states(result, decided.stuck), t0, self.config.contention.hold_s)
        return result

    def _count_errors(self, sample: Sample, acted: Acted) -> None:
        """The actuators' failures of this tick, by actuator and operation, and the jobs held."""
        throttle, result, cpus = self.parts.throttle, acted.result, acted.cpus
        kind = throttle.kind if throttle else "cpusets"
        for failed in result.failed:
            self.stats.actuator_error(kind, failed.operation)
        self._count_job_errors(sample, result)
        for operation in result.housekeeping_failed:
            self.stats.actuator_error(kind, operation)
        if cpus is not None and kind != "cores":  # on a cores host, the result above is the owner's
            for c in cpus.failed:
                self.stats.actuator_error("cpusets", c.operation)
            for operation in cpus.housekeeping_failed:
                self.stats.actuator_error("cpusets", operation)

    @staticmethod
    def _lasting_states(result: TickResult, stuck: str | None) -> dict[str, str]:
        """The states an alert can see that are in force after this tick, with why."""
        states = {f"not_watching_{w.what}": w.why for w in result.watching if not w.watching}
        if stuck:
            states["contention_nothing_left_to_throttle"] = stuck
        return states

    def _plan_caps(self, sample: Sample, active: Mapping, in_force: Mapping[str, int | None],
                   unwritable: str | None, paused: str | None) -> dict:
        """This tick's caps (noded.capping.plan). Paused: operators' caps only. State
        directory unwritable: no new cap, as no new level (those in force hold)."""
        if self.parts.caps is None:
            return {}
        c = self.config
        caps = self.parts.caps.plan(sample, active, {s.kind: s.cap_gbps * GB for s in c.jobs.sources
                                                if s.cap_gbps is not None},
                              None if c.contention.gpu_reserve_gbps is None else c.contention.gpu_reserve_gbps * GB,
                              c.peak_bytes_per_domain, automatic=not paused)
        if unwritable:
            caps = {j: cap for j, cap in caps.items() if in_force.get(j) == CAPPED}
        return caps

    def _count_job_errors(self, sample: Sample, result: ApplyResult) -> None:
        """Jobs held this tick by an error of their own (the others went on): counted by
        stage, said once when it begins (not every tick while it lasts)."""
        by_stage: dict[str, dict[str, str]] = {stage: {} for stage in JOB_ERROR_STAGES}
        by_stage["act"] = dict(result.job_errors)
        for stage, job, why in sample.job_errors:
            by_stage.setdefault(stage, {})[job] = why
        for stage, errors in by_stage.items():
            for job in sorted(self.stats.job_errors(stage, errors)):
                log.error("job=%s held: its %s failed (said once; the other jobs go on): %s", job,
                          JOB_ERROR_STAGES.get(stage, stage), errors[job])

    def run(self, stop: threading.Event, on_tick: Callable[[TickResult], None] | None = None,
            on_failed: Callable[[TickFailure], None] | None = None) -> None:
        """Ticks until ``stop``: ``on_tick`` after each tick, ``on_failed`` after each that
        raised (the loop goes on; the next tick starts afresh). Each loop round ends in one
        of the two, so whoever listens (systemd's watchdog) hears that the loop runs."""
        next_t = self.clock()
        in_a_row = 0
        self.liveness.loop_started(self.config.tick_s)
        while not stop.is_set():
            self._maybe_reload()
            period = self.config.tick_s
            try:
                result = self.tick()
            except Exception as e:
                # A bug in one tick must not take the node's protection down for good: counted
                # (and published, though no tick completes), said with its traceback.
                in_a_row += 1
                self.stats.tick_failed()
                self.totals = self.stats.snapshot()
                log.exception("tick failed (%d in a row)", in_a_row)
                failure = TickFailure(f"{type(e).__name__}: {e}", in_a_row, self.ticks, time.time())
                self.last_failure, self.failures_in_a_row = failure, in_a_row
                if on_failed:
                    on_failed(failure)
            else:
                in_a_row = 0
                self.failures_in_a_row = 0
                if on_tick:
                    try:
                        on_tick(result)
                    except Exception:
                        log.exception("after tick %d: telling the listener failed", result.tick)
            self.liveness.round_ended(period)
            next_t += period
            now = self.clock()
            if now > next_t:
                self.overruns += 1
                next_t = now
            stop.wait(next_t - now)

    def shutdown(self) -> None:
        """Release every throttle, restore what we changed, remove our groups.

        Each step runs even when an earlier one failed (resctrl gone, a job gone); what
        the kernel lists is removed, whatever noded remembers.
        """
        if self.parts.baselines is not None and self.last is not None and self.last.sample.jobs_known:
            metas = {j: js.meta for j, js in self.last.sample.jobs.items() if js.kind == GPU}
            self.parts.baselines.update(self.state.baselines, self.state.baseline_sources, metas, force=True)
        if self.parts.caps is not None:
            try:
                self.parts.caps.stop_all()  # their groups go with the levels' next
            except Exception:
                log.exception("stopping the caps' holders at shutdown failed")
        if self.parts.throttle is not None:
            try:
                left = self.parts.throttle.release_all()
                if left:
                    log.error("at stop, could not release: %s", ", ".join(left))
                for job, level in sorted((self.last.levels if self.last else {}).items()):
                    log_change("release", job, level_from=level, level_to=0, cause="stopping",
                               reason="noded is stopping" + (f"; not released: {', '.join(left)}" if left else ""),
                               severity=logging.WARNING if left else NOTICE)
            except Exception:
                log.exception("releasing throttles at shutdown failed")
        if self.parts.cpu_owner is not None and (self.parts.throttle is None or self.parts.throttle.kind != "cores"):
            try:  # right-sizing on an MBA host: the owner's records are not the throttle's
                left = self.parts.cpu_owner.release_all()
                if left:
                    log.error("at stop, could not restore the CPUs of: %s", ", ".join(left))
            except Exception:
                log.exception("restoring jobs' CPUs at shutdown failed")
        if self.parts.memory is not None:
            try:
                left = self.parts.memory.release_all()
                if left:
                    log.error("at stop, could not restore the memory soft limits of: %s", ", ".join(left))
            except Exception:
                log.exception("restoring jobs' memory soft limits at shutdown failed")
        try:
            self.parts.telemetry.close()
        except Exception:
            log.exception("closing telemetry at shutdown failed")
        if self.parts.colocation is not None:
            try:
                self.parts.colocation.close()  # MPS stopped, compute modes restored
            except Exception:
                log.exception("stopping MPS at shutdown failed")
