"""The loop: sample -> decide (each controller proposes) -> one plan per knob -> apply ->
publish the result. The controllers are the parts' (noded.loop.parts.Parts.tick_controllers),
the planners noded.loop.planners', the writers noded.loop.applying's: a new controller is a
file of its package, never a branch here.

Fixed-rate on a monotonic clock; a tick that overruns skips the missed slots
rather than bunching up. ``stop`` (a threading.Event) interrupts the wait at once.
Metrics read ``last`` (one reference, swapped whole), never the hardware.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from noded.actuators.cpusets import CpuSetResult
from noded.actuators.memsoft import MemoryResult
from noded.actuators.plan import CAPPED, Applied, ApplyResult
from noded.policy.baselines import LEARNED
from noded.capping.service import CapState
from noded.colocation.view import ColocationView
from noded.config import Config
from noded.knobs.controller import NO_FINDINGS, Found, Outcome, Plans, Proposals, Reading
from noded.loop.applying import Appliers
from noded.loop.control import ControlSnapshot, ControlState
from noded.util.settled import SETTLE_S, Unsettled
from noded.util.signalflag import SignalFlag
from noded.util.journal import NOTICE, log_change, words
from noded.loop.health import Liveness
from noded.loop.lasting import LastingStates
from noded.loop.parts import Parts
from noded.loop.planners import plan_knobs
from noded.policy.contention import Decision, PolicyState
from noded.rightsize.service import RightsizeView
from noded.samplers.bandwidth import QuietRead
from noded.samplers.sample import GPU, Sample
from noded.loop.tickstats import TickStats, Totals
from noded.loop.watching import Watch, watching

if TYPE_CHECKING:  # the split needs numba: loaded only where memory is sized
    from noded.rightsize.memsplit import MemorySplit

log = logging.getLogger(__name__)


#: How often the state directory is tried for writing while throttles may be needed.
STATE_PROBE_S = 10.0

#: how long a reload waits for its file to stop changing (noded.util.settled) before it is
#: given up, the running config kept: read once a tick meanwhile
RELOAD_PATIENCE_S = 30.0

#: where in a tick one job's part can fail alone (that job held, the others go on), in words
#: lasting states logged as their alerts see them (monitoring/prometheus/noded-rules.yml): more
#: than OVERRUN_SHARE of the last OVERRUN_WINDOW ticks overran (NodedTickOverruns); noded's
#: groups hold more than RMIDS_NEARLY_EXHAUSTED of the RMIDs (NodedRmidsNearlyExhausted)
OVERRUN_WINDOW = 60
OVERRUN_SHARE = 0.1
RMIDS_NEARLY_EXHAUSTED = 0.9
JOB_ERROR_STAGES = {"monitor": "monitoring group's sync", "cpus": "CPUs' reading", "act": "change"}


@dataclass(frozen=True)
class DeferredReload:
    """A reload asked for whose file may be half written: since when (the daemon's clock)
    and how many reads found it so."""

    since: float
    tries: int


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
    """What a tick decided: contention's decision, the levels in force it was made against
    and why contention lasts with nothing left to throttle."""

    decision: Decision
    in_force: Mapping[str, int | None] = field(default_factory=lambda: MappingProxyType({}))
    stuck: str | None = None


@dataclass(frozen=True)
class Acted:
    """What a tick changed: the levels' (or the plan's) result, the owner of CPUs' result,
    right-sizing's memory's (None: off, or not this tick), and what the controllers found
    (the jobs unknown: the last tick's, with what moves between ticks as it is now)."""

    result: ApplyResult
    cpus: CpuSetResult | None = None
    memory: MemoryView | None = None
    found: Found = NO_FINDINGS


class Daemon:
    def __init__(self, config: Config, parts: Parts, *, clock: Callable[[], float] = time.monotonic,
                 extra_info: Mapping[str, str] | None = None):
        self.config = config
        self.parts = parts  # frozen, whole: which parts are on is decided by the wiring, not here
        self.clock = clock
        # the controllers that are on, in the order they propose; the policy's (contention's) state is its own
        self.policy, self.controllers = parts.tick_controllers(clock)
        self.appliers = Appliers(parts.throttle, parts.cpu_owner, parts.memory)  # each knob's one writer
        # overrides, pause, decision history: what the admin socket changes (read once a tick)
        self.control = ControlState(parts.overrides, parts.registered_labels)
        self.last: TickResult | None = None  # swapped whole each tick: what metrics and the admin socket read
        self.ticks = 0
        self.overruns = 0
        # the overrun count at each of the last ticks: a share of them overrunning is a lasting state
        self._overrun_marks: deque[int] = deque(maxlen=OVERRUN_WINDOW + 1)
        self.stats = TickStats()  # the loop's own counters; each TickResult carries a snapshot
        self.totals = Totals()  # the counters as of the last loop round, failed ticks too: what metrics read
        self.extra_info = dict(extra_info or {})
        self._reload = SignalFlag()  # set by SIGHUP's handler: no lock taken (see SignalFlag)
        self._deferred: DeferredReload | None = None  # a reload asked for, its file not yet settled
        self._reload_notifier = None  # told RELOADING=1 for the reload in progress: told READY=1 at its end
        self._state_failures_seen = 0
        self._state_checked: float | None = None
        self._state_unwritable: str | None = None
        #: per CPU job, what right-sizing's last plan granted it before halving: a cores host
        #: reads its levels in force against it (written once a tick, by _apply)
        self._granted: Mapping[str, tuple[int, ...]] = MappingProxyType({})
        self.lasting = LastingStates()  # states an alert can see: logged when each begins and ends
        self.liveness = Liveness(clock)  # when the loop's rounds end: /healthz and noded_last_tick_timestamp_seconds
        #: the last tick that raised, kept once ticks complete again (`nodectl status` says when it was)
        self.last_failure: TickFailure | None = None
        self.failures_in_a_row = 0  # ticks failed since the last that completed: 0 while ticks complete

    @property
    def state(self) -> PolicyState:
        """The policy's state as its last tick left it (throttles, baselines)."""
        return self.policy.state

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

    def reload_if_due(self) -> None:
        """Called by the loop before each tick: a reload asked for (SIGHUP), or one deferred,
        tried once a round and never waited for inside one. A file that may be half written
        (the reloader raises Unsettled) is read again the next round, for at most
        RELOAD_PATIENCE_S; then the reload is given up and the running config kept. A SIGHUP
        while one is deferred starts its patience again."""
        if self.parts.reloader is None:
            return
        asked = self._reload.is_set()
        if not asked and self._deferred is None:
            return
        if asked:
            self._reload.clear()
            if self._deferred is None:
                # systemd hears RELOADING=1 now and READY=1 when it is over, applied or not;
                # not before the first tick's READY=1, which says that noded has started.
                self._reload_notifier = self.parts.notifier if self.last is not None else None
                if self._reload_notifier is not None:
                    self._reload_notifier.reloading()
            self._deferred = DeferredReload(self.clock(), 0)
        status = self._reload_config()
        if status is None:
            return  # deferred: read again next round
        self._deferred = None
        notifier, self._reload_notifier = self._reload_notifier, None
        if notifier is not None:
            notifier.ready(status)

    def _reload_config(self) -> str | None:
        """Read the config again and take it; returns how that went, for systemd's STATUS
        (None: deferred, the file may be half written)."""
        deferred = self._deferred
        try:
            new = self.parts.reloader()
        except Unsettled as e:
            return self._unsettled(e)
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
        waited = (f" (once the file had been unchanged for {SETTLE_S:g} s: deferred {deferred.tries} "
                  f"{'time' if deferred.tries == 1 else 'times'}, {self.clock() - deferred.since:.1f} s)"
                  if deferred is not None and deferred.tries else "")
        log.warning("config reloaded%s%s", waited,
                    f"; these changes need a restart and were not applied: {', '.join(restart)}" if restart else "")
        return "config reloaded" + waited + (f"; needs a restart to apply: {', '.join(restart)}" if restart else "")

    def _unsettled(self, e: Unsettled) -> str | None:
        """The file may be half written: deferred to the next round (None), or given up
        with the running config kept once RELOAD_PATIENCE_S have passed (the status)."""
        since, tries = self._deferred.since, self._deferred.tries + 1
        waited = self.clock() - since
        if waited >= RELOAD_PATIENCE_S:
            log.error("config reload given up after %d tries over %.0f s, keeping the running config: %s; write the "
                      "file elsewhere and rename it into place, then reload again", tries, waited, e)
            return (f"config reload given up: the file kept changing for {waited:.0f} s; the running config is kept "
                    "(the journal says why)")
        self._deferred = DeferredReload(since, tries)
        # the usual reload (saved, then reloaded within a second) is deferred once: not a
        # warning; its outcome's line says it was
        log.info("config reload deferred (try %d): %s; read again each tick until it is unchanged for %g s, for at "
                 "most %g s", tries, e, SETTLE_S, RELOAD_PATIENCE_S)
        return None

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

    def tick(self) -> TickResult:
        """sample -> decide (each controller proposes) -> one plan per knob -> apply -> result."""
        t0 = self.clock()
        sample = self.parts.telemetry.sample(self._quiet_read())
        t1 = self.clock()
        control = self.control.read()  # what operators set, once: every step below sees this reading
        unwritable = self._state_check(t1)
        if sample.jobs_known:
            reading = self._reading(sample, control, unwritable, t0)
            proposed = tuple(self._propose(reading))
            plans = plan_knobs(proposed)
            t2 = self.clock()
            outcome, found_after = self._apply(reading, plans)
            decided, acted = self._decided(reading, proposed), self._acted(plans, outcome, proposed, found_after)
        else:
            # Not knowing the jobs is not "no jobs": hold every decision as it stands,
            # forget nothing, change nothing, until discovery works again.
            decided = Decided(self.policy.holding())
            acted = Acted(ApplyResult((), MappingProxyType({})), found=self._found_between_ticks())
            t2 = self.clock()
        t3 = self.clock()
        durations = {"sample": t1 - t0, "decide": t2 - t1, "act": t3 - t2}
        return self._publish(t0, sample, control, decided, acted, durations)

    def _quiet_read(self) -> QuietRead | None:
        """Whether this tick may read a quiet node thin (noded.samplers.bandwidth): only where
        the last tick left nothing throttled, capped or overridden, and no rule of the config
        needs each job's bandwidth every tick (a per-job cap, a source's cap, a GPU reserve)."""
        c, last = self.config, self.last
        if last is None or c.resctrl.quiet_read_every <= 1:
            return None
        contention = c.contention
        if (contention.cpu_job_cap_gbps is not None or contention.gpu_reserve_gbps is not None
                or any(s.cap_gbps is not None for s in c.jobs.sources)):
            return None
        if any(last.levels.values()) or self.state.throttles or last.caps or last.control.overrides:
            return None
        return QuietRead(0.5 * contention.threshold * c.peak_bytes_per_domain, c.resctrl.quiet_read_every,
                         contention.hold_s)

    def _reading(self, sample: Sample, control: ControlSnapshot, unwritable: str | None, now: float) -> Reading:
        """What every controller sees of this tick: the Sample, the operators' one reading and
        what the throttle has in force (read once, here)."""
        throttle = self.parts.throttle
        in_force = self._levels_in_force(sample)
        return Reading(sample, self.config, now, control.paused, MappingProxyType({o.job: o for o in control.overrides}),
                       unwritable, throttle.kind if throttle else None, MappingProxyType(in_force),
                       frozenset(j for j, lvl in in_force.items() if lvl == CAPPED),
                       MappingProxyType(throttle.max_levels(sample) if throttle else {}),
                       throttle.level_share if throttle else (lambda level: 1.0))

    def _propose(self, reading: Reading) -> Iterator[Proposals]:
        """Each controller's proposals, in order; each sees only those of the controllers it
        reads (its ``reads``: in_reading_order put them before it), so what it proposes
        depends on nothing it did not declare."""
        by_name: dict[str, Proposals] = {}
        for controller in self.controllers:
            read = tuple(by_name[name] for name in controller.reads if name in by_name)
            by_name[controller.name] = controller.propose(reading, read)
            yield by_name[controller.name]

    def _apply(self, reading: Reading, plans: Plans) -> tuple[Outcome, tuple[Found | None, ...]]:
        """The plans written, each knob by its one writer; the controllers told before and
        after: what each found once the writes were done."""
        # the next tick's levels in force are read against what the plan of CPUs grants CPU jobs
        self._granted = plans.cpus.granted if plans.cpus is not None else MappingProxyType({})
        for controller in self.controllers:
            controller.before_apply(reading, plans)
        outcome = self.appliers.apply(reading.sample, plans, reading.in_force, self.stats)
        return outcome, tuple(controller.after_apply(reading, plans, outcome) for controller in self.controllers)

    def _decided(self, reading: Reading, proposed: tuple[Proposals, ...]) -> Decided:
        """The policy's decision (the tick's), the levels in force it was made against."""
        policy = proposed[self.controllers.index(self.policy)].found
        return Decided(policy.decision, reading.in_force, stuck=policy.stuck)

    @staticmethod
    def _acted(plans: Plans, outcome: Outcome, proposed: tuple[Proposals, ...],
               found_after: tuple[Found | None, ...]) -> Acted:
        """What was written, with right-sizing's memory and what the controllers found, in
        their order (when proposing, then after the writes), for the result."""
        wished, memory = plans.memory, None
        if wished is not None:
            memory = MemoryView(wished.split, outcome.memory, wished.error)
        found = NO_FINDINGS
        for later in (*(p.found for p in proposed), *found_after):
            found = found.then(later)
        return Acted(outcome.levels, outcome.cpus, memory, found)

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
        found = acted.found
        result = TickResult(
            tick=self.ticks, t=t0, sample=sample, decision=decision, applied=acted.result.applied,
            durations=MappingProxyType(durations), throttle_kind=throttle.kind if throttle else None,
            levels=acted.result.levels,
            state_unwritable=self._state_check(self.clock()),  # a write of this tick's that failed shows here
            baselines=MappingProxyType({j: (b, self.state.baseline_sources.get(j, LEARNED))
                                        for j, b in self.state.baselines.items()}),
            config=self.config, overruns=self.overruns, original_cpus=MappingProxyType(original_cpus),
            colocation=found.colocation, control=self.control.after(control), totals=self.stats.snapshot(),
            rightsize=found.rightsize, cpus=acted.cpus, memory=acted.memory, watching=watching(sample, self.config),
            caps=found.caps if found.caps is not None else MappingProxyType({}))
        self.last = result
        self.totals = result.totals
        # a state away for less than hold_s has not ended (contention flickers around its thresholds)
        self._overrun_marks.append(self.overruns)
        self.lasting.update(self._lasting_states(result, decided.stuck, acted), t0, self.config.contention.hold_s)
        return result

    def _found_between_ticks(self) -> Found:
        """A tick that proposed nothing: what the controllers found last (its result says the
        same as the last one's, no counter of theirs goes back to zero), with what moved since
        on their own threads and requests (MPS's state, admissions, cap holders) as it is now."""
        last, found = self.last, NO_FINDINGS
        if last is not None:
            found = Found(rightsize=last.rightsize, colocation=last.colocation, caps=last.caps)
        for controller in self.controllers:
            found = found.then(controller.between_ticks())
        return found

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

    def _lasting_states(self, result: TickResult, stuck: str | None, acted: Acted) -> dict[str, str]:
        """The states an alert can see that are in force after this tick, with why."""
        states = {f"not_watching_{w.what}": w.why for w in result.watching if not w.watching}
        if stuck:
            states["contention_nothing_left_to_throttle"] = stuck
        held = sorted({job for _, job, _ in result.sample.job_errors} | set(acted.result.job_errors))
        if held:  # NodedJobsHeld
            states["jobs_held"] = (f"{len(held)} job(s) held by an error of their own, the others go on: "
                                   f"{words(held[:5])}{' ...' if len(held) > 5 else ''}")
        overran = self._overrun_marks[-1] - self._overrun_marks[0]
        if len(self._overrun_marks) == self._overrun_marks.maxlen and overran > OVERRUN_SHARE * (len(self._overrun_marks) - 1):
            states["ticks_overrunning"] = (f"{overran} of the last {len(self._overrun_marks) - 1} ticks took longer "
                                           f"than the {self.config.tick_s:g}s period")  # NodedTickOverruns
        facts = result.sample.resctrl
        if facts is not None and facts.num_rmids and \
                facts.rmids_used_by_noded > RMIDS_NEARLY_EXHAUSTED * facts.num_rmids:  # NodedRmidsNearlyExhausted
            states["rmids_nearly_exhausted"] = (f"noded's groups hold {facts.rmids_used_by_noded} of the "
                                                f"{facts.num_rmids} RMIDs the hardware offers")
        return states

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
            self.reload_if_due()
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
                    log.error("at stop, could not release: %s", words(left))
                for job, level in sorted((self.last.levels if self.last else {}).items()):
                    log_change("release", job, level_from=level, level_to=0, cause="stopping",
                               reason="noded is stopping" + (f"; not released: {words(left)}" if left else ""),
                               severity=logging.WARNING if left else NOTICE)
            except Exception:
                log.exception("releasing throttles at shutdown failed")
        if self.parts.cpu_owner is not None and (self.parts.throttle is None or self.parts.throttle.kind != "cores"):
            try:  # right-sizing on an MBA host: the owner's records are not the throttle's
                left = self.parts.cpu_owner.release_all()
                if left:
                    log.error("at stop, could not restore the CPUs of: %s", words(left))
            except Exception:
                log.exception("restoring jobs' CPUs at shutdown failed")
        if self.parts.memory is not None:
            try:
                left = self.parts.memory.release_all()
                if left:
                    log.error("at stop, could not restore the memory soft limits of: %s", words(left))
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
