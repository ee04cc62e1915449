"""The plan's ceiling on a job's search (``limit``).

``limit(state, cores)`` says the node can give the job at most ``cores`` for now (other
jobs' shares come first). A probe above it is cut to it, and the search resumes within it
from what was measured: CODA from the best point measured within the ceiling (or at the
ceiling), Synergy with its range cut to the ceiling. An ended search's answer stands (the
plan gives what it can); ``limit`` with ``max_cores`` lifts the ceiling. An answer at the
ceiling ends ``LIMITED``, not ``SEARCHED``: the history does not remember it (the job may
want more than the node had while it was searched; remembered, it would start and confirm
every later job of the model there).
"""

from __future__ import annotations

from dataclasses import replace

from noded.rightsize import topsizing
from noded.rightsize.search import next_request
from noded.rightsize.sizing import (AT_MAX, BISECT, CONFIRM, FROM_LIMIT, HALVING, PROBING, START, SYNERGY, TOP,
                                    AllocatorConfig, OutOfRange, Probe, Sized, SizingState, Start)
from noded.rightsize.steps import probe_at


def limit(state: SizingState, cores: int, config: AllocatorConfig) -> tuple[Probe | Sized | None, SizingState]:
    """The node can give the job at most ``cores`` now (``max_cores`` or more: no ceiling).
    Returns the request that replaces the current probe (None: the probe stands, or no probe
    is open) and the new state. A probe above the ceiling is cut to it and the search resumes
    within it from what was measured; points above it are kept but no longer chosen. An ended
    search's answer stands: the plan gives what it can. Raises OutOfRange below 1."""
    if type(cores) is not int or cores < 1:
        raise OutOfRange(f"{state.job}: a ceiling of {cores!r:.20} cores is below 1")
    state = replace(state, ceiling=cores if cores < state.max_cores else None)
    if state.phase not in PROBING:
        return None, state
    bound = state.bound
    over = state.cores > bound or (state.kept is not None and state.kept > bound and state.phase != CONFIRM)
    if state.method == SYNERGY:
        over = over or state.hi > bound
    if not over:
        return None, state
    before = state.cores
    out, state = _resume(state, config)
    if isinstance(out, Probe) and out.cores == before:
        return None, state  # the same cores: the probe's window goes on
    return out, state


def _resume(state: SizingState, config: AllocatorConfig) -> tuple[Probe | Sized, SizingState]:
    """A search cut by a ceiling, on again within it."""
    within = state.within()
    if state.method == TOP:
        return topsizing.next_request(replace(state, phase=BISECT), config)
    if state.method == SYNERGY:
        if not within:
            return probe_at(replace(state, phase=AT_MAX, lo=1, hi=state.bound, kept=None), state.bound)
        bar = (1 - config.synergy_within) * state.top()
        hi = min(c for c, v in within if v >= bar)
        lo = 1 + max((c for c, v in within if v < bar and c < hi), default=0)
        return next_request(replace(state, phase=HALVING, lo=lo, hi=hi, kept=None, cores=hi), config)
    if not within:
        # nothing measured within: start again at the probe, cut to the ceiling
        cores = min(state.cores, state.bound)
        return probe_at(replace(state, phase=START, kept=None, start=Start(cores, FROM_LIMIT)), cores)
    best = max(within, key=lambda p: (p[1], -p[0]))[0]
    # from the best point within: CODA again from there (measured points are not asked again)
    return next_request(replace(state, phase=START, kept=None, cores=best, start=Start(best, FROM_LIMIT)), config)
