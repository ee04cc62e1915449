"""CODA's real-time contention eliminator (Sec. V-D), as a pure function.

``decide(sample, state, config, limits, now)`` -> ``(decision, new_state)``; no I/O,
no clock, no globals. Levels are abstract steps (1 = mildest); the actuators turn
a level into an MBA value or a core count.

* Trigger: the busiest L3 domain at or above ``threshold`` of its peak AND at least
  one GPU job's utilisation more than ``gpu_drop_margin`` below its own baseline
  (learned while the node was uncontended). Then the heaviest CPU job that can be
  throttled further goes one step down, at most one step every ``settle_s`` so the
  effect of the last step is seen before the next ("just enough").
* Per-job cap: a CPU job above ``cpu_job_cap_gbps`` goes one step down regardless.
* Release: once the node stays below ``release_threshold`` for ``hold_s``, one step
  of one job is released, then the hold starts again, but only a step predicted
  (from the job's bandwidth and ``level_share``) to keep the node below
  ``release_threshold``; so a job that still pushes hard is not let go into a new
  round of contention.
* GPU jobs and exempt jobs are never throttled; overrides win over everything.
* Missing data (node bandwidth unknown) never leads to a new throttle; when it stays
  missing for ``missing_release_s`` every throttle but an operator's is released
  (fail safe: noded does not hold throttles blind).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from noded.util.ages import format_age
from noded.util.journal import word  # a GPU tenant's name in another job's reason: one word, no key of its own
from noded.policy.baselines import LEARNED, Known
from noded.config import ContentionConfig
from noded.samplers.sample import CPU, GPU, Sample

GB = 1e9
CONTENTION = "contention"
CAP = "cap"
OVERRIDE = "override"


#: the note of a tick in contention in which no CPU job could be throttled one more step (a
#: lasting state: noded.loop.lasting logs its start and end)
NOTHING_LEFT_TO_THROTTLE = "contention, but no CPU job left to throttle"

@dataclass(frozen=True)
class Throttle:
    level: int  # >= 1
    cause: str  # contention | cap | override


@dataclass(frozen=True)
class PolicyState:
    baselines: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # where each baseline came from: learned (here, while quiet), job (its own, from
    # before a restart) or model (this host's history of its model)
    baseline_sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    throttles: Mapping[str, Throttle] = field(default_factory=lambda: MappingProxyType({}))
    calm_since: float | None = None
    last_step: float | None = None  # when a throttle or release step was last taken
    missing_since: float | None = None  # since when node bandwidth has been unknown


@dataclass(frozen=True)
class Action:
    job: str
    from_level: int
    to_level: int
    reason: str
    cause: str  # contention | cap | override | calm | gpu_job | exempt | override_ended | inputs_missing | capped

    @property
    def kind(self) -> str:
        return "throttle" if self.to_level > self.from_level else "release"


@dataclass(frozen=True)
class Decision:
    levels: Mapping[str, int]  # desired level per job (jobs at 0 are absent)
    actions: tuple[Action, ...]
    triggered: bool
    node_share: float | None  # busiest domain's share of its peak
    slowed: tuple[str, ...]  # GPU jobs below their baseline
    note: str  # why nothing happened, when nothing did
    # throttled job -> why it was not released this tick: each release condition it does
    # not meet, with the values (see held_because)
    held: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))


def node_share(sample: Sample, peak_bytes_per_domain: float) -> float | None:
    values = list(sample.node_bandwidth_bps.values())
    if not values or any(v is None for v in values):
        return None
    return max(values) / peak_bytes_per_domain


class _Levels:
    """The throttles as this tick changes them, and every change made (an Action each)."""

    def __init__(self, throttles: dict[str, Throttle]):
        self.throttles = throttles
        self.actions: list[Action] = []

    def of(self, job: str) -> int:
        return self.throttles[job].level if job in self.throttles else 0

    def set_level(self, job: str, level: int, cause: str, reason: str) -> None:
        throttles = self.throttles
        old = throttles[job].level if job in throttles else 0
        if level == old:
            if level and job in throttles and throttles[job].cause != cause:
                throttles[job] = Throttle(level, cause)
            return
        self.actions.append(Action(job, old, level, reason, cause))
        if level:
            kept = throttles[job].cause if job in throttles and level < old else cause
            throttles[job] = Throttle(level, kept)
        else:
            throttles.pop(job, None)


def decide(
    sample: Sample,
    state: PolicyState,
    config: ContentionConfig,
    peak_bytes_per_domain: float,
    max_levels: Mapping[str, int],
    now: float,
    overrides: Mapping[str, int] = MappingProxyType({}),
    level_share: Callable[[int], float] = lambda level: 0.5 ** level,
    known: Mapping[str, Known] = MappingProxyType({}),
    capped: frozenset[str] = frozenset(),
    paused: bool = False,
) -> tuple[Decision, PolicyState]:
    """``capped``: jobs held at a bandwidth cap (noded.capping.plan): the cap owns them, so
    the levels leave them alone (a level they held is released, at once). ``paused`` (an
    operator paused the eliminator): nothing is throttled automatically, and what was is
    forgotten; only the operators' overrides hold (the caller gives no other limits)."""
    jobs = sample.jobs
    share = node_share(sample, peak_bytes_per_domain)
    levels = _Levels({j: t for j, t in state.throttles.items() if j in jobs and (not paused or j in overrides)})
    _standing_rules(levels, jobs, max_levels, overrides, capped)
    baselines, sources, slowed = _learned_baselines(state, jobs, levels.throttles, share, config, known)

    def throttleable(job_id: str) -> bool:
        js = jobs[job_id]
        return (js.kind == CPU and not js.meta.exempt and job_id not in overrides and job_id not in capped
                and js.bandwidth_bps is not None and levels.of(job_id) < max_levels.get(job_id, 0))

    triggered = share is not None and share >= config.threshold and bool(slowed)
    settled = state.last_step is None or now - state.last_step >= config.settle_s
    missing_since = (state.missing_since if state.missing_since is not None else now) if share is None else None
    note, stepped = _contention_step(levels, sample, share, config, triggered=triggered, settled=settled,
                                     missing_for=None if missing_since is None else now - missing_since,
                                     slowed=slowed, baselines=baselines, sources=sources, throttleable=throttleable)
    if config.cpu_job_cap_gbps is not None and settled and sample.job_bandwidth_current:
        # a job's rate over more than one tick (a node read thin until now: a cap set by a
        # reload) is a mean that may be a level it left: a cap step waits a tick for the last tick's
        stepped = _cap_steps(levels, sample, config, throttleable) or stepped

    # Release, one step of one job per hold period, once the node is calm.
    calm_since = state.calm_since
    if share is not None and share < config.release_threshold and not triggered:
        calm_since = calm_since if calm_since is not None else now
    else:
        calm_since = None
    last = now if stepped else state.last_step

    def predicted_share(job: str) -> float:
        # What the node would run at once this job got one step more bandwidth:
        # releasing into a new contention is the oscillation hysteresis must avoid.
        level = levels.throttles[job].level
        bw = jobs[job].bandwidth_bps or 0.0
        extra = bw * (level_share(level - 1) / level_share(level) - 1.0)
        return share + extra / peak_bytes_per_domain / max(1, len(sample.domains))

    if calm_since is not None and now - calm_since >= config.hold_s and (last is None or now - last >= config.hold_s):
        if _release_step(levels, sample, share, config, calm_for=now - calm_since, predicted_share=predicted_share):
            last = now

    throttles = levels.throttles
    held = {j: held_because(j, t, share=share, triggered=triggered, slowed=tuple(slowed), calm_since=calm_since,
                            last_step=last, missing_since=missing_since, now=now, config=config,
                            bandwidth_bps=jobs[j].bandwidth_bps,
                            predicted_share=predicted_share(j) if share is not None else None,
                            moved=[a for a in levels.actions if a.to_level < a.from_level])
            for j, t in throttles.items()}
    decision = Decision(MappingProxyType({j: t.level for j, t in throttles.items()}), tuple(levels.actions),
                        triggered, share, tuple(slowed), note, MappingProxyType(held))
    return decision, replace(state, baselines=MappingProxyType(baselines), baseline_sources=MappingProxyType(sources),
                             throttles=MappingProxyType(throttles),
                             calm_since=calm_since, last_step=last, missing_since=missing_since)


def _standing_rules(levels: _Levels, jobs: Mapping[str, Any], max_levels: Mapping[str, int],
                    overrides: Mapping[str, int], capped: frozenset[str]) -> None:
    """What nobody may throttle, and what operators decided."""
    throttles = levels.throttles
    for job_id, js in jobs.items():
        if job_id in overrides:
            levels.set_level(job_id, min(overrides[job_id], max_levels.get(job_id, 0)), OVERRIDE,
                       f"operator override to level {overrides[job_id]}")
        elif job_id in capped and job_id in throttles:
            levels.set_level(job_id, 0, "capped", "held at a bandwidth cap instead of a level")
        elif js.kind == GPU and job_id in throttles:
            levels.set_level(job_id, 0, "gpu_job", "is a GPU job: never throttled")
        elif js.meta.exempt and job_id in throttles:
            levels.set_level(job_id, 0, "exempt", "marked exempt")
        elif job_id in throttles and throttles[job_id].cause == OVERRIDE:
            levels.set_level(job_id, 0, "override_ended", "operator override ended")


def _learned_baselines(state: PolicyState, jobs: Mapping[str, Any], throttles: Mapping[str, Throttle],
                       share: float | None, config: ContentionConfig, known: Mapping[str, Known],
                       ) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """Each GPU job's baseline and its source, and the GPU jobs below theirs (sorted).
    Baselines are learned while the node is quiet and no contention throttle is propping it
    up; a job that gets faster raises its baseline at any time."""
    baselines = {j: b for j, b in state.baselines.items() if j in jobs and jobs[j].kind == GPU}
    sources = {j: s for j, s in state.baseline_sources.items() if j in baselines}
    quiet = share is not None and share < config.threshold and not any(
        t.cause == CONTENTION for t in throttles.values())
    slowed: list[str] = []
    for job_id, js in jobs.items():
        if js.kind != GPU:
            continue
        if job_id not in baselines and job_id in known:
            # Contention present from the start would otherwise never be seen: begin from
            # what is known (the job's own from before a restart, or its model's here).
            baselines[job_id], sources[job_id] = known[job_id].baseline, known[job_id].source
        if js.gpu_util is None:
            continue
        base = baselines.get(job_id)
        if base is not None and js.gpu_util < base * (1 - config.gpu_drop_margin):
            slowed.append(job_id)
        if base is None:
            if quiet:
                baselines[job_id], sources[job_id] = js.gpu_util, LEARNED
        elif quiet or js.gpu_util > base:
            baselines[job_id] = base + config.baseline_alpha * (js.gpu_util - base)
            sources[job_id] = LEARNED
    slowed.sort()
    return baselines, sources, slowed


def _contention_step(levels: _Levels, sample: Sample, share: float | None, config: ContentionConfig, *,
                     triggered: bool, settled: bool, missing_for: float | None, slowed: list[str],
                     baselines: Mapping[str, float], sources: Mapping[str, str],
                     throttleable: Callable[[str], bool]) -> tuple[str, bool]:
    """The heaviest throttleable CPU job one step down when contention is on and the last
    step settled, or every throttle but an operator's released when node bandwidth stayed
    unknown too long. Returns the note (why nothing happened) and whether a step was taken."""
    jobs = sample.jobs
    if missing_for is not None and missing_for >= config.missing_release_s:
        note = f"fail safe: node bandwidth unknown for {format_age(missing_for)}, throttles released"
        for job in [j for j, t in levels.throttles.items() if t.cause != OVERRIDE]:
            levels.set_level(job, 0, "inputs_missing", note)
        return note, False
    if share is None:
        return "holding: node bandwidth unknown", False
    if triggered and settled and not sample.job_bandwidth_current:
        # the node was read thin until now: a job read some ticks ago has a mean over them, and
        # a hog that rose since reads low; heaviest-first picks on one tick's rates, next tick
        return "contention: waiting a tick for every job's bandwidth over one tick", False
    if triggered and settled:
        candidates = sorted((j for j in jobs if throttleable(j)), key=lambda j: (-jobs[j].bandwidth_bps, j))
        if not candidates:
            return NOTHING_LEFT_TO_THROTTLE, False
        job = candidates[0]
        worst = min(slowed, key=lambda j: jobs[j].gpu_util / baselines[j])
        levels.set_level(job, levels.of(job) + 1, CONTENTION,
                   f"node bandwidth {share:.0%} >= {config.threshold:.0%} of peak and GPU job {word(worst)} at "
                   f"{jobs[worst].gpu_util:.0f}% < baseline {baselines[worst]:.0f}%"
                   f"{'' if sources.get(worst) == LEARNED else f' (from its {sources.get(worst)} history)'}"
                   f"; heaviest CPU job "
                   f"({jobs[job].bandwidth_bps / GB:.1f} GB/s)")
        return "", True
    if triggered:
        return "contention: waiting for the last step to settle", False
    return "", False


def _cap_steps(levels: _Levels, sample: Sample, config: ContentionConfig,
               throttleable: Callable[[str], bool]) -> bool:
    """Every CPU job above the per-job cap one step down (unless it moved this tick);
    whether any did."""
    jobs, throttles = sample.jobs, levels.throttles
    cap = config.cpu_job_cap_gbps * GB
    stepped = False
    for job_id in sorted(jobs):
        bw = jobs[job_id].bandwidth_bps
        if bw is not None and bw > cap and throttleable(job_id) and not any(a.job == job_id for a in levels.actions):
            levels.set_level(job_id, levels.of(job_id) + 1, CAP if job_id not in throttles or throttles[job_id].cause == CAP
                       else throttles[job_id].cause,
                       f"{bw / GB:.1f} GB/s above the per-job cap {config.cpu_job_cap_gbps:g} GB/s")
            stepped = True
    return stepped


def _release_step(levels: _Levels, sample: Sample, share: float, config: ContentionConfig, *, calm_for: float,
                  predicted_share: Callable[[str], float]) -> bool:
    """One step of one job released (the lowest level first), of those no operator holds,
    not over the per-job cap and predicted to keep the node below the release threshold;
    whether one was."""
    throttles = levels.throttles
    releasable = [j for j, t in throttles.items() if t.cause != OVERRIDE and not _over_cap(sample.jobs[j], config)
                  and predicted_share(j) < config.release_threshold]
    if not releasable:
        return False
    job = min(releasable, key=lambda j: (throttles[j].level, j))
    levels.set_level(job, throttles[job].level - 1, "calm",
               f"node bandwidth {share:.0%} below {config.release_threshold:.0%} for {format_age(calm_for)}")
    return True


def held_because(job: str, throttle: Throttle, *, share: float | None, triggered: bool, slowed: tuple[str, ...],
                 calm_since: float | None, last_step: float | None, missing_since: float | None, now: float,
                 config: ContentionConfig, bandwidth_bps: float | None, predicted_share: float | None,
                 moved: list[Action]) -> tuple[str, ...]:
    """Why a throttled job is still held after this tick: each release condition it does not
    meet, with the values (pure; what ``nodectl explain`` shows). ``predicted_share``: the
    node's share of its peak were this job released one step; ``moved``: the releases
    made this tick."""
    if throttle.cause == OVERRIDE:
        return ("an operator override holds it at this level (nodectl release lifts it)",)
    c = config
    out: list[str] = []
    if share is None:
        since = now - missing_since if missing_since is not None else 0.0
        return (f"node bandwidth unknown for {format_age(since)}: nothing is released blind until "
                f"contention.missing_release_s ({c.missing_release_s:g}s), then every throttle is",)
    if triggered:
        out.append(f"contention goes on: node bandwidth {share:.0%} of peak >= threshold {c.threshold:.0%} and GPU "
                   f"job(s) {', '.join(map(word, slowed))} below their baseline")
    elif share >= c.release_threshold:
        out.append(f"node bandwidth {share:.0%} of peak is not below the release threshold "
                   f"{c.release_threshold:.0%} (contention.release_threshold)")
    elif calm_since is not None and now - calm_since < c.hold_s:
        out.append(f"node below the release threshold {c.release_threshold:.0%} for {format_age(now - calm_since)} of the "
                   f"{c.hold_s:g}s it must stay there (contention.hold_s)")
    own = [a for a in moved if a.job == job]
    if own:
        out.append(f"released one step this tick ({own[0].from_level}->{own[0].to_level}); the next step waits "
                   f"contention.hold_s ({c.hold_s:g}s)")
    elif moved:
        out.append(f"{moved[0].job} was released one step this tick: one step per contention.hold_s ({c.hold_s:g}s)")
    elif last_step is not None and now - last_step < c.hold_s:
        out.append(f"the last throttle step was {format_age(now - last_step)} ago; a release waits contention.hold_s "
                   f"({c.hold_s:g}s) after any step")
    if c.cpu_job_cap_gbps is not None and bandwidth_bps is not None and bandwidth_bps > 0.5 * c.cpu_job_cap_gbps * GB:
        out.append(f"its own {bandwidth_bps / GB:.1f} GB/s is above half the per-job cap "
                   f"(contention.cpu_job_cap_gbps {c.cpu_job_cap_gbps:g} GB/s)")
    if predicted_share is not None and predicted_share >= c.release_threshold and not triggered \
            and share < c.release_threshold:
        out.append(f"released one step, it would take the node to about {predicted_share:.0%} of peak, not below the "
                   f"release threshold {c.release_threshold:.0%}")
    if not out:
        out.append(f"it meets every release condition; jobs at lower levels go first, one step per "
                   f"contention.hold_s ({c.hold_s:g}s)")
    return tuple(out)


def _over_cap(js, config: ContentionConfig) -> bool:
    # A job throttled for its own bandwidth stays so while it would still exceed half the cap.
    if config.cpu_job_cap_gbps is None or js.bandwidth_bps is None:
        return False
    return js.bandwidth_bps > 0.5 * config.cpu_job_cap_gbps * GB
