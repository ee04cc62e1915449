"""The allocator of a GPU job's cores as a pure state machine: a search begins
(``begin``), takes each window's mean (``advance``) and ends in an answer; the operator's
controls. Each decision goes to the method's search: the top search (the default,
``topsizing``), CODA's adaptive allocator (Sec. V-B, ``coda``) or Synergy's (``synergy``),
and the floor phase (``steps``).

**Operator controls.** ``pin`` sets a size and measures nothing, ``stop`` keeps the cores the
job has now (mid-probe included), ``reprobe`` searches again from the cores it has.
"""

from __future__ import annotations

import math
from dataclasses import replace

from noded.rightsize import coda, synergy, topsearch, topsizing
from noded.rightsize.history import HistoryView
from noded.rightsize.signal import GPU_UTILISATION, ITERATION_TIME
from noded.rightsize.sizing import (AT_MAX, AT_TOP, CODA, CONFIRM, FLOOR, FROM_DRIFT, FROM_HISTORY, FROM_REPROBE,
                                    NO_CHOICE, NO_SIGNAL, PINNED, PROBING, START, STEP_LIMIT, STOPPED, SYNERGY,
                                    TOP, AllocatorConfig, JobSpec, NotProbing, OutOfRange, Probe, Sized,
                                    SizingError, SizingState, Start, is_positive)
from noded.rightsize.starts import start_point
from noded.rightsize.steps import Step, after_floor, ended, probe_at


def begin(spec: JobSpec, history: HistoryView | None, config: AllocatorConfig,
          start: Start | None = None, ceiling: int | None = None) -> tuple[Probe | Sized, SizingState]:
    """The first request for a job (``start`` overrides N_start, as ``reprobe`` does;
    ``ceiling``: the plan's limit, as ``limit`` sets it)."""
    start = start or start_point(spec, history)
    share = None if spec.share is None else min(spec.share, spec.max_cores)
    state = SizingState(spec.job, config.method, spec.max_cores, start, START, start.cores, gpus=spec.gpus,
                        step=spec.gpus if config.step_per_gpu else 1, share=share,
                        ceiling=ceiling if ceiling is not None and ceiling < spec.max_cores else None,
                        per_iteration=spec.signal == ITERATION_TIME)
    if start.cores > state.bound:
        start = Start(state.bound, start.source)  # a remembered answer above the ceiling: a start
        state = replace(state, start=start, cores=start.cores)
    if state.bound == 1:
        return ended(replace(state, cores=1), NO_CHOICE)
    if config.method == TOP:
        # the top first, whatever the start says: the start is where the bisection looks first
        return probe_at(replace(state, phase=AT_TOP), state.bound)
    if start.source == FROM_HISTORY and start.expected is not None:
        return probe_at(replace(state, phase=CONFIRM), start.cores)
    if config.method == SYNERGY:
        return probe_at(replace(state, phase=AT_MAX, lo=1, hi=state.bound), state.bound)
    return probe_at(state, start.cores)


def advance(state: SizingState, mean: float | None, config: AllocatorConfig,
            width: float | None = None, elapsed: float = 0.0) -> tuple[Probe | Sized, SizingState]:
    """Take the mean measured at ``state.cores`` (None: the window saw no sample) and say what
    next; ``width``: the window's interval, a relative half-width (None: unknown);
    ``elapsed``: the window's length in seconds. Raises NotProbing when no measurement is
    awaited."""
    if state.phase not in PROBING:
        raise NotProbing(f"{state.job}: not probing ({state.phase}); a measurement is not expected")
    if mean is None:
        fallback = best_so_far(state, config) if state.points else state.start.cores
        return ended(replace(state, cores=fallback), NO_SIGNAL)
    if not is_positive(mean):
        raise SizingError(f"{state.job}: a throughput must be a positive number, not {mean!r:.40}")
    known = width if width is not None and math.isfinite(width) else topsearch.UNKNOWN_WIDTH
    state = replace(state, points=(*state.points, (state.cores, float(mean))),
                    widths=(*state.widths, min(max(0.0, known), topsearch.UNKNOWN_WIDTH)),
                    seconds=(*state.seconds, max(0.0, elapsed) if math.isfinite(elapsed) else 0.0))
    return next_request(state, config)


def pin(state: SizingState, cores: int, phase: str = PINNED) -> tuple[Sized, SizingState]:
    """The operator's size: no probing until ``reprobe``. Raises OutOfRange. ``phase``
    STOPPED holds a stop at the cores it kept (a stop brought back after a restart)."""
    if type(cores) is not int or not 1 <= cores <= state.max_cores:
        raise OutOfRange(f"{state.job}: {cores!r:.20} cores is outside 1..{state.max_cores}")
    if phase not in (PINNED, STOPPED):
        raise ValueError(f"a pin holds a job PINNED or STOPPED, not {phase!r}")
    return ended(replace(state, phase=phase, cores=cores), phase)


def stop(state: SizingState) -> tuple[Sized, SizingState]:
    """Stop probing and keep the cores the job has now; an ended search stays as it is."""
    if state.phase not in PROBING:
        return state.answer(), state
    return ended(replace(state, phase=STOPPED), STOPPED)


def reprobe(state: SizingState, config: AllocatorConfig) -> tuple[Probe | Sized, SizingState]:
    """Search again (pin and stop undone), starting from the cores the job has now (within
    the plan's ceiling, which stays); what was measured before is forgotten (the job may have
    changed since)."""
    spec = JobSpec(state.job, state.max_cores, state.gpus, share=state.share, signal=signal_of(state))
    return begin(spec, None, config, Start(min(state.cores, state.bound), FROM_REPROBE), state.ceiling)


def next_request(state: SizingState, config: AllocatorConfig) -> tuple[Probe | Sized, SizingState]:
    """After a point was added: the next probe, or the answer. A probe at a core count that
    was measured already (a failed confirmation's point) takes that value without asking."""
    if state.method == TOP:
        return topsizing.next_request(state, config)
    while True:
        if state.phase == FLOOR:
            decided = after_floor(state)
        elif state.method == CODA:
            decided = coda.decide(state, config)
        else:
            decided = synergy.decide(state, config)
        if not isinstance(decided, Step):
            return decided
        phase, cores = decided.phase, decided.cores
        state = replace(state, phase=phase, cores=cores, **decided.fields)
        if state.value(cores) is not None:
            continue  # measured already: decide on that value
        if state.steps >= config.max_steps:
            return ended(replace(state, cores=best_so_far(state, config)), STEP_LIMIT)
        return Probe(state.job, cores, phase), state


def best_so_far(state: SizingState, config: AllocatorConfig) -> int:
    """What to keep when a search must end now: within the bound, or the bound itself."""
    if state.method == TOP:
        return topsizing.best_so_far(state, config)
    if state.phase == FLOOR or (state.method == CODA and state.kept is not None):
        if state.kept is not None and state.kept <= state.bound:
            return state.kept
    if not state.within():
        return min(state.start.cores, state.bound)
    if state.method == CODA:
        return max(state.within(), key=lambda p: (p[1], -p[0]))[0]
    return synergy.answer(state, config)


def drifted(state: SizingState, config: AllocatorConfig) -> tuple[Probe | Sized, SizingState]:
    """Search a sized job again: from the top, its answer where the bisection looks first,
    nothing measured before kept (the job changed). Also when its labels or cgroup changed."""
    spec = JobSpec(state.job, state.max_cores, state.gpus, share=state.share, signal=signal_of(state))
    return begin(spec, None, config, Start(min(state.cores, state.bound), FROM_DRIFT), state.ceiling)


def signal_of(state: SizingState) -> str:
    return ITERATION_TIME if state.per_iteration else GPU_UTILISATION
