"""The daemon's right-sizing state, beside the loop (as ``noded.colocation.service`` is for
co-location): one ``JobSizing`` per GPU job of an enabled source, fed every tick, and the
node's plan of CPUs made from what each of them asks for.

Each tick the daemon calls ``tick(sample, have, originals, now)``:

* **Which jobs.** A GPU job of a source in ``rightsize.sources`` whose CPUs the Sample
  shows (``have``) is sized; its sizing begins the first tick it is seen and ends when it
  is gone (its queued reports go with it). Its ``JobSpec``: ``max_cores`` its CPUs before
  noded changed them (``originals``), its GPUs, its owner (the uid of its first process,
  read once from ``/proc/PID``), its labels' category, model, batch size and hints, and its
  GPU-proportional share of the node (the floor phase).
* **The signal.** Iteration times the job reported (``report``, from the report socket)
  where it reports them, else its GPU utilisation from the Sample. A job starts on
  utilisation; its first report switches it to iteration times if nothing was measured
  yet (points of two signals are never mixed).
* **Observe, don't believe.** A probe's window takes samples only while the Sample shows
  the job holding the probed number of CPUs; while it does not (the write is pending or
  failed, the plan cut it), the window is opened again, so its warm-up counts from when
  the cores are really there.
* **Answers.** A searched or confirmed answer is remembered in ``rightsize.json``
  (``history.record``; a state directory that cannot be written is logged, the answer is
  kept). Each new probe and answer is one journal line (``probe``, ``size``).

``plan(sample, originals, levels, now)`` makes the node's plan (``cpuplan``) from the
sized jobs' targets, the CPU jobs' own CPUs and contention levels; a probe the plan cuts
(the node is short) goes to the allocator as a ceiling (``limit``) and the plan is made
again once. GPU jobs that are not sized are not in the plan and their CPUs are not handed
out. ``view(...)`` is the frozen record of it all for the TickResult.

**Operator controls** (``pin``, ``stop``, ``reprobe``, from nodectl through the admin
socket) take effect at once, under the service's lock, and are kept with who asked and
why for as long as the job runs: a pin or a stop is in force once ``size_controls.json``
has it (``controls``), so after a restart the job is held at it again from its first
tick; a reprobe or the job's end forgets it. A job that is not being sized (not a GPU job
of an enabled source, or gone) is refused with the reason.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

from noded.config import RightsizeConfig
from noded.util.journal import log_change
from noded.samplers.sample import CPU, GPU, Sample
from noded.stores.originals import StateWriteError
from noded.rightsize import cpuplan
from noded.rightsize.controls import SizeControls, StoredControl
from noded.rightsize.history import SizingHistory
from noded.rightsize.signal import GPU_UTILISATION, ITERATION_TIME, BadSample, SignalConfig, Window
from noded.rightsize.jobsizing import JobSizing, begin_job, feed, limit_job, pin_job, reprobe_job, stop_job
from noded.rightsize.sizing import LIMITED as LIMITED_REASON
from noded.rightsize.sizing import PINNED as PINNED_PHASE
from noded.rightsize.sizing import PROBING as PROBING_PHASES
from noded.rightsize.sizing import STOPPED as STOPPED_PHASE
from noded.rightsize.sizing import AllocatorConfig, JobSpec, OutOfRange, Probe, Sized, SizingError, SizingState
from noded.rightsize.starts import UNKNOWN_START

log = logging.getLogger(__name__)

#: the GPU array's cores per GPU without configuration or history
DEFAULT_RESERVE_PER_GPU = UNKNOWN_START
#: iteration times kept per job between two ticks (a job reporting faster drops the oldest)
MAX_QUEUED = 4096

# a sized job's state, for the metrics (noded_job_sizing_state)
PROBING = "probing"
SIZED = "sized"
PINNED = "pinned"
STOPPED = "stopped"
LIMITED = "limited"  # sized, at the plan's ceiling: it may want more than the node had
STATES = (PROBING, SIZED, PINNED, STOPPED, LIMITED)


class NotSized(ValueError):
    """An operator control for a job right-sizing does not size (the message says why)."""


def allocator_config(config: RightsizeConfig) -> AllocatorConfig:
    return AllocatorConfig(method=config.method, noise_margin=config.noise_margin,
                                 signal=SignalConfig(tolerance=config.tolerance, max_window_s=config.max_window_s,
                                                     warmup_s=config.warmup_s))


def _means(state: SizingState) -> tuple[tuple[int, float], ...]:
    """Every core count measured, with the mean of its windows, in the order first measured."""
    return tuple((c, state.value(c)) for c in dict.fromkeys(c for c, _ in state.points))


def state_of(state: SizingState) -> str:
    if state.phase in PROBING_PHASES:
        return PROBING
    if state.phase == PINNED_PHASE:
        return PINNED
    if state.phase == STOPPED_PHASE:
        return STOPPED
    return LIMITED if state.reason == LIMITED_REASON else SIZED


@dataclass(frozen=True)
class Control:
    """An operator's control of a job's sizing: pin (with ``cores``), stop or reprobe."""

    kind: str
    uid: int | None
    reason: str
    t: float
    cores: int | None = None


@dataclass(frozen=True)
class JobSizingView:
    """One sized job as a tick left it. ``target``: the cores its sizing asks for now (the
    probe's or the answer's); ``allocated``: the CPUs the Sample showed it holding;
    ``planned``: the CPUs the plan gives it (None without a plan); ``optimal``: the answer
    found (None while probing, and for a pin or a stop)."""

    job: str
    owner: str | None
    model: str | None
    batch_size: int | None
    category: str | None
    gpus: int
    signal: str
    state: str  # one of STATES
    phase: str
    reason: str | None
    target: int
    max_cores: int
    ceiling: int | None
    optimal: int | None
    start: int
    start_source: str
    points: tuple[tuple[int, float], ...]  # (cores, mean of its windows) in the order first measured
    window_samples: int  # in the open window (0 without one)
    window_open_s: float | None
    allocated: int | None
    planned: tuple[int, ...] | None
    plan_note: str | None
    control: Control | None
    remembered: bool  # its answer is in the history (recorded by this noded)


@dataclass(frozen=True)
class RightsizeView:
    """What one tick saw of right-sizing: the sized jobs; CPU jobs' borrowed CPUs; the
    GPU array's lent and idle CPUs (empty without a plan); why there is no plan, if so."""

    jobs: Mapping[str, JobSizingView]
    borrowed: Mapping[str, tuple[int, ...]]  # CPU job -> GPU-array CPUs it has on loan
    lent: tuple[int, ...]
    idle: tuple[int, ...]
    reserve: int
    plan_error: str | None = None
    history_errors: int = 0  # answers that could not be remembered (state directory)
    probes: int = 0  # probes begun since start (each a journal line `probe`)
    sized: int = 0  # answers found since start (searched, confirmed or limited: each a journal line `size`)


class _Job:
    """The service's record of one sized job (under the service's lock)."""

    def __init__(self, sizing: JobSizing, out: Probe | Sized):
        self.sizing = sizing
        self.out = out
        self.control: Control | None = None
        self.remembered = False
        self.reports: list[tuple[float, float]] = []
        self.reported = False
        self.identity: tuple = ()  # what the job was sized as (``identity``): a change searches again


def identity(js, max_cores: int) -> tuple:
    """What a job's sizing was for: its labels (model, batch size, category, hints), its
    cgroup and its CPUs at start. Another job in all but name: searched again from the top."""
    meta = js.meta
    return (meta.model, meta.batch_size, meta.category, tuple(sorted(meta.hints().items())), js.cgroup, max_cores,
            len(js.gpus))


def job_owner(proc: str, pids: Iterable[int]) -> str | None:
    """The uid owning the job's first process that still exists (a name, as history keeps it)."""
    for pid in sorted(pids):
        try:
            return str(os.stat(f"{proc}/{pid}").st_uid)
        except OSError:
            continue
    return None


class RightSizing:
    def __init__(self, config: RightsizeConfig, history: SizingHistory | None, *, clock: Callable[[], float],
                 proc: str = "/proc", controls: SizeControls | None = None):
        self.config = config
        self.controls = controls  # operators' pins and stops, kept across restarts (None: in memory only)
        self.alloc_config = allocator_config(config)
        self.history = history
        self.clock = clock
        self.proc = proc
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self.history_errors = 0
        self.probes = 0  # counted under the lock, for the metrics
        self.sized = 0

    # -- what the job says (report socket thread)
    def report(self, job: str, seconds: float) -> dict:
        """An iteration time from a job's own process. Raises ValueError for a value that is
        not one (nothing is taken); a job that is not sized is answered, not refused."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise ValueError(f"iteration_s must be a number, not {seconds!r:.40}")
        try:
            Window(ITERATION_TIME, 1, 0.0).add(1.0, float(seconds), SignalConfig(warmup_s=0.0, warmup_samples=0))
        except BadSample as e:
            raise ValueError(str(e)) from None
        t = self.clock()
        with self._lock:
            j = self._jobs.get(job)
            if j is None:
                return {"job": job, "sized": False}
            j.reports.append((t, float(seconds)))
            del j.reports[:-MAX_QUEUED]
            return {"job": job, "sized": True, "state": state_of(j.sizing.state), "cores": j.out.cores}

    # -- the tick
    def gpu_jobs(self, sample: Sample) -> list[str]:
        """The jobs of this sample right-sizing is for: GPU jobs of enabled sources."""
        return sorted(j for j, js in sample.jobs.items() if js.kind == GPU and js.source in self.config.sources)

    def sized_jobs(self, sample: Sample) -> list[str]:
        """The jobs of this sample right-sizing sizes now: GPU jobs of enabled sources with CPUs known."""
        return [j for j in self.gpu_jobs(sample) if sample.jobs[j].cpus is not None]

    def tick(self, sample: Sample, have: Mapping[str, int], originals: Mapping[str, Iterable[int]],
             now: float, node_cpus: int, node_gpus: int) -> dict[str, Probe | Sized]:
        """Begin, feed and end sizings for this Sample; returns every sized job's request.
        ``have``: per job, how many CPUs the Sample shows it holding; ``originals``: per job,
        its CPUs before noded changed them; ``node_cpus``/``node_gpus``: what the plan shares."""
        if not sample.jobs_known:
            with self._lock:
                return {j: r.out for j, r in self._jobs.items()}
        wanted = set(self.sized_jobs(sample))
        # a job whose CPUs could not be read this tick is held as it is (its sizing, its
        # operator's control): an error is not "no longer sized"
        held = set(self.gpu_jobs(sample)) - wanted
        with self._lock:
            for job in [j for j in self._jobs if j not in wanted | held]:
                del self._jobs[job]
                log.info("job=%s no longer sized (gone, or no longer a GPU job of an enabled source)", job)
            if self.controls is not None:
                unsaved = self.controls.drop(self.controls.jobs() - wanted - held)
                if unsaved:
                    log.warning("the controls of jobs no longer sized could not be forgotten in the state "
                                "directory (a restart may bring them back if the jobs come back): %s", unsaved)
            for job in sorted(wanted):
                js = sample.jobs[job]
                own = sorted(originals.get(job) or ())
                if not own:
                    continue
                r = self._jobs.get(job)
                if r is not None and r.identity != identity(js, len(own)) and r.control is None:
                    log.info("job=%s its labels, cgroup or CPUs changed: searched again from the top", job)
                    r = None
                if r is None:
                    r = self._begin(job, js, len(own), now, node_cpus, node_gpus)
                    if r is None:
                        continue
                    self._jobs[job] = r
                    continue  # its window opened now: the cores it has now are the old ones
                self._feed(job, r, js.gpu_util, sample.t, have.get(job), now)
            return {j: r.out for j, r in self._jobs.items()}

    def hold(self, now: float) -> None:
        """A tick while paused: nothing is measured, so every open window starts again at
        ``now`` (its warm-up and its longest wait count from the resume, not from before)."""
        with self._lock:
            for r in self._jobs.values():
                r.reports = []
                w = r.sizing.window
                if w is not None:
                    r.sizing = replace(r.sizing, window=Window(w.kind, r.sizing.state.cores, now))

    def _begin(self, job: str, js, max_cores: int, now: float, node_cpus: int, node_gpus: int) -> _Job | None:
        gpus = max(1, len(js.gpus))
        meta = js.meta
        try:
            spec = JobSpec(job, max_cores, gpus, owner=job_owner(self.proc, js.pids), category=meta.category,
                           model=meta.model, batch_size=meta.batch_size, signal=GPU_UTILISATION,
                           labels=MappingProxyType(meta.hints()),
                           share=max(1, node_cpus * gpus // max(1, node_gpus)))
            out, sizing = begin_job(spec, self.history.view() if self.history else None, self.alloc_config, now)
        except (ValueError, SizingError) as e:
            log.warning("job=%s cannot be sized: %s", job, e)
            return None
        self._announce(job, None, out, sizing, f"begins: {max_cores} CPUs, {gpus} GPU{'s' * (gpus > 1)}, start "
                       f"{sizing.state.start.cores} from {sizing.state.start.source}")
        r = _Job(sizing, out)
        r.identity = identity(js, max_cores)
        kept = self.controls.get(job) if self.controls is not None else None
        if kept is not None:  # an operator's pin or stop from before a restart holds again
            cores = min(kept.cores, max_cores)
            out, sizing = pin_job(sizing, cores, PINNED_PHASE if kept.kind == "pin" else STOPPED_PHASE)
            self._controlled(job, r, out, sizing, Control(kept.kind, kept.uid, kept.reason, now, cores),
                             note="kept from before noded's restart")
            return r
        self._maybe_remember(job, r)
        return r

    def _feed(self, job: str, r: _Job, gpu_util: float | None, t: float, have: int | None, now: float) -> None:
        reports, r.reports = r.reports, []
        sizing = r.sizing
        if reports and sizing.spec.signal == GPU_UTILISATION and not sizing.state.points:
            # the job reports its iterations: measure those (nothing was measured on utilisation)
            spec = replace(sizing.spec, signal=ITERATION_TIME)
            window = Window(ITERATION_TIME, sizing.state.cores, now) if sizing.window is not None else None
            state = replace(sizing.state, per_iteration=True)  # the time budget counts its iterations
            sizing = r.sizing = JobSizing(spec, state, window)
            log.info("job=%s reports its iteration times: measured by them from now", job)
        if sizing.window is None:
            return
        if have != sizing.state.cores:
            # observe, don't believe: measure only while the job holds the probed cores
            r.sizing = replace(sizing, window=Window(sizing.window.kind, sizing.state.cores, now))
            return
        if sizing.spec.signal == ITERATION_TIME:
            samples = reports
        else:
            samples = [(t, gpu_util)] if gpu_util is not None else []
        try:
            out, new, measured = feed(sizing, samples, now, self.alloc_config)
        except BadSample as e:
            log.warning("job=%s a sample was refused: %s", job, e)
            return
        if out is None:
            r.sizing = new
            return
        note = (f"measured {measured.mean:.4g} at {measured.cores} cores over {measured.elapsed_s:.1f}s "
                f"({measured.samples} samples{'' if measured.steady else ', not steady'})"
                if measured is not None and measured.mean is not None else "no sample in the window")
        if isinstance(r.out, Sized) and isinstance(out, Probe):
            note = f"its throughput moved beyond the margin ({note}): searched again from the top"
            r.remembered = False  # the new answer is remembered in its turn
        self._announce(job, r.out, out, new, note)
        r.sizing, r.out = new, out
        self._maybe_remember(job, r)

    def _maybe_remember(self, job: str, r: _Job) -> None:
        if self.history is None or not isinstance(r.out, Sized) or r.remembered:
            return
        try:
            r.remembered = self.history.record(r.sizing.spec, r.out)
        except StateWriteError as e:
            self.history_errors += 1
            log.warning("job=%s its answer (%d cores) could not be remembered: %s", job, r.out.cores, e)

    def _announce(self, job: str, before: Probe | Sized | None, out: Probe | Sized,
                  sizing: JobSizing, note: str) -> None:
        was = None if before is None else before.cores
        if isinstance(out, Probe):
            self.probes += 1
            log_change("probe", job, cores_from=was, cores=out.cores, phase=out.phase, reason=note)
        else:
            self.sized += 1
            log_change("size", job, cores_from=was, cores=out.cores, state=state_of(sizing.state),
                       reason=f"{out.reason} after {out.steps} step{'s' * (out.steps != 1)}; {note}")

    def limit(self, job: str, cores: int, now: float) -> Probe | Sized:
        """The plan can give ``job`` at most ``cores`` now: a probe above is cut (the search
        resumes within). Returns the job's request after it."""
        with self._lock:
            r = self._jobs[job]
            out, sizing = limit_job(r.sizing, cores, self.alloc_config, now)
            if out is not None:
                self._announce(job, r.out, out, sizing, f"the node can give it at most {cores} now")
                r.out = out
                self._maybe_remember(job, r)
            r.sizing = sizing
            return r.out

    # -- operator controls (admin socket thread)
    def _control(self, job: str) -> _Job:
        r = self._jobs.get(job)
        if r is None:
            raise NotSized(f"job {job!r} is not being sized: right-sizing sizes GPU jobs of the sources "
                           f"{', '.join(self.config.sources) or '(none: rightsize.sources is empty)'} "
                           "whose CPUs noded sees")
        return r

    def pin(self, job: str, cores: int, uid: int | None, reason: str) -> dict:
        """Hold ``job`` at ``cores`` (1 to its CPUs at start), no probing until ``reprobe``."""
        with self._lock:
            r = self._control(job)
            try:
                out, sizing = pin_job(r.sizing, cores)
            except OutOfRange as e:
                raise ValueError(str(e)) from None
            self._keep(job, StoredControl("pin", cores, uid, reason))
            return self._controlled(job, r, out, sizing, Control("pin", uid, reason, self.clock(), cores))

    def stop(self, job: str, uid: int | None, reason: str) -> dict:
        """Stop probing ``job``: it keeps the cores it has now (an ended search stays as it is)."""
        with self._lock:
            r = self._control(job)
            if r.sizing.state.phase not in PROBING_PHASES:
                # nothing to stop: a pin or an answer stays as it is, and so does who set it
                st = state_of(r.sizing.state)
                return {"job": job, "state": st, "phase": r.sizing.state.phase, "cores": r.out.cores,
                        "cores_before": r.out.cores, "control": None, "reason": reason,
                        "note": f"not probing ({st} at {r.out.cores} cores): nothing to stop"
                                + ("; `nodectl size JOB --reprobe` undoes a pin" if st == PINNED else "")}
            out, sizing = stop_job(r.sizing)
            self._keep(job, StoredControl("stop", out.cores, uid, reason))
            return self._controlled(job, r, out, sizing, Control("stop", uid, reason, self.clock()))

    def reprobe(self, job: str, uid: int | None, reason: str) -> dict:
        """Search again from the cores ``job`` has (a pin or stop undone)."""
        with self._lock:
            r = self._control(job)
            unsaved = self.controls.drop({job}) if self.controls is not None else None
            if unsaved:
                log.warning("job=%s reprobed, but its pin or stop could not be forgotten in the state directory: a "
                            "restart would bring it back: %s", job, unsaved)
            out, sizing = reprobe_job(r.sizing, self.alloc_config, self.clock())
            r.remembered = False
            return self._controlled(job, r, out, sizing, Control("reprobe", uid, reason, self.clock()))

    def _keep(self, job: str, control: StoredControl) -> None:
        """A pin or a stop is in force once kept: raises StateWriteError (nothing changes) otherwise."""
        if self.controls is not None:
            self.controls.set(job, control)

    def _controlled(self, job: str, r: _Job, out, sizing: JobSizing, control: Control, note: str = "") -> dict:
        before = r.out
        r.sizing, r.out, r.control = sizing, out, control
        why = control.reason or f"by uid {control.uid}"
        log_change(control.kind, job, severity=logging.WARNING, cores_from=before.cores, cores=out.cores,
                   uid=control.uid, state=state_of(sizing.state), reason=f"{why} ({note})" if note else why)
        return {"job": job, "state": state_of(sizing.state), "phase": sizing.state.phase, "cores": out.cores,
                "cores_before": before.cores, "control": control.kind, "reason": control.reason}

    # -- the plan
    def plan(self, sample: Sample, originals: Mapping[str, Iterable[int]], levels: Mapping[str, int],
             lend_to: Iterable[str], now: float) -> cpuplan.CpuPlan | None:
        """The node's plan of CPUs for this Sample (see the module's docstring); None while
        no GPU job is sized (the arrays exist for GPU jobs: without one, every CPU job keeps
        its own CPUs, halved for contention as before). ``levels``: the CPU jobs' contention
        levels where the throttle halves cores. Raises PlanError when no plan can be made
        (more sized GPU jobs than CPUs)."""
        made = self.node_view(sample, originals, levels, lend_to)
        if made is None:
            return None
        out = cpuplan.plan(*made)
        cut = {j.job: len(out.cpus_of(j.job)) for j in made[0].gpu_jobs
               if j.target is not None and len(out.cpus_of(j.job)) < j.target}
        if not cut:
            return out
        for job, cores in cut.items():
            self.limit(job, cores, now)
        return cpuplan.plan(*self.node_view(sample, originals, levels, lend_to))

    def node_view(self, sample: Sample, originals: Mapping[str, Iterable[int]], levels: Mapping[str, int],
                  lend_to: Iterable[str]) -> tuple[cpuplan.NodeView, cpuplan.PlanConfig] | None:
        """What the plan is made from (None: nothing to plan, see ``plan``). The node's CPUs
        are every sized GPU job's and CPU job's own, less those of GPU jobs not sized."""
        with self._lock:
            outs = {j: r.out for j, r in self._jobs.items() if j in sample.jobs}
        unsized_gpu = set().union(*(frozenset(originals.get(j) or ()) for j, js in sample.jobs.items()
                                    if js.kind == GPU and j not in outs))
        gpu_jobs, cpu_jobs, cpus = [], [], set()
        for job, js in sorted(sample.jobs.items()):
            own = frozenset(originals.get(job) or ())
            if not own:
                continue
            now_cpus = js.cpus.held() if js.cpus is not None else None
            if job in outs:
                gpu_jobs.append(cpuplan.GpuJob.from_allocator(job, max(1, len(js.gpus)), outs[job],
                                                              now_cpus or ()))
                cpus |= own
            elif js.kind == CPU:
                cpu_jobs.append(cpuplan.CpuJob(job, js.source, own, levels.get(job, 0), now_cpus))
                cpus |= own
        cpus -= unsized_gpu
        if not cpus or not gpu_jobs:
            return None  # nothing to plan: no sized GPU job, or every CPU is an unsized GPU job's
        node_gpus = max(len(sample.gpus), sum(j.gpus for j in gpu_jobs), 1)
        if self.config.reserve_per_gpu is not None:
            reserve = min(len(cpus), self.config.reserve_per_gpu * node_gpus)
        else:
            history = self.history.view() if self.history else None
            reserve = (cpuplan.reserve_from_history(history, node_gpus, len(cpus), DEFAULT_RESERVE_PER_GPU)
                       if history is not None else min(len(cpus), DEFAULT_RESERVE_PER_GPU * node_gpus))
        view = cpuplan.NodeView(tuple(sorted(cpus)), node_gpus, tuple(gpu_jobs), tuple(cpu_jobs))
        return view, cpuplan.PlanConfig(reserve_cores=reserve, lend_to=frozenset(lend_to))

    # -- what the tick leaves
    def view(self, have: Mapping[str, int] | None = None, plan: cpuplan.CpuPlan | None = None,
             plan_error: str | None = None) -> RightsizeView:
        have = have or {}
        jobs = {}
        with self._lock:
            for job, r in sorted(self._jobs.items()):
                s, spec, w = r.sizing.state, r.sizing.spec, r.sizing.window
                planned = plan.jobs.get(job) if plan is not None else None
                st = state_of(s)
                jobs[job] = JobSizingView(
                    job, spec.owner, spec.model, spec.batch_size, spec.category, spec.gpus, spec.signal, st, s.phase,
                    s.reason, r.out.cores, s.max_cores, s.ceiling, r.out.cores if st in (SIZED, LIMITED) else None,
                    s.start.cores, s.start.source, _means(s),
                    w.n if w is not None else 0,
                    None if w is None else max(0.0, self.clock() - w.opened_at), have.get(job),
                    planned.cpus if planned is not None else None, planned.note if planned is not None else None,
                    r.control, r.remembered)
            errors, probes, sized = self.history_errors, self.probes, self.sized
        borrowed: dict[str, tuple[int, ...]] = {}
        if plan is not None:
            lent = set(plan.lent)
            for job, jc in plan.jobs.items():
                if jc.kind == cpuplan.CPU and lent & set(jc.cpus):
                    borrowed[job] = tuple(sorted(lent & set(jc.cpus)))
        return RightsizeView(MappingProxyType(jobs), MappingProxyType(borrowed),
                             plan.lent if plan is not None else (), plan.idle if plan is not None else (),
                             plan.reserve if plan is not None else 0, plan_error, errors, probes, sized)

