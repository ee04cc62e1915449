"""The top search (``TOP``, ours, issue #23; the default) on a job's ``SizingState``: each
decision from ``topsearch``, bounded by the search's steps and its time budget.

Measure the most cores the job may have (its ``max_cores`` within the plan's ceiling), then
bisect for the fewest cores within ``noise_margin`` of the best measured, every decision
re-derived from all points (see ``topsearch``); N_start (``starts``: history, the model,
the owner, the category and hints) only says where the bisection looks first. The job's
own remembered answer holds when the top and it are measured, it is within the margin and
it measures the throughput remembered with it (two measurements); an answer from other GPUs or another batch size tries the core
below it next. No probe starts that would take the search past ``max_probe_s`` (with the
iteration-time signal and a job slower than 1 iteration/s, that many iterations at the
best speed measured: its windows are longer); the answer is then the fewest cores measured
within the margin (``TIME_LIMIT``). No floor phase: the answer is within the margin of the
top, which is measured at the share or above.
"""

from __future__ import annotations

import math
from dataclasses import replace

from noded.rightsize import topsearch
from noded.rightsize.sizing import (AT_TOP, BISECT, FROM_DEFAULT, FROM_DRIFT, FROM_HISTORY, FROM_HISTORY_SCALED,
                                    FROM_MODEL, FROM_REPROBE, RECHECK, STEP_LIMIT, TIME_LIMIT, AllocatorConfig,
                                    Probe, Sized, SizingState)
from noded.rightsize.steps import ended, probe_at, searched_reason

#: starts that are a measured answer of this job or model: the top search tries the one
#: below next (TOP's neighbour rule)
_ANSWERS = (FROM_HISTORY, FROM_HISTORY_SCALED, FROM_MODEL, FROM_REPROBE, FROM_DRIFT)


def next_request(state: SizingState, config: AllocatorConfig) -> tuple[Probe | Sized, SizingState]:
    """TOP one decision at a time (``topsearch.decide``): every core count is decided against
    the best measured, from all the points; a tie is measured again before it decides."""
    start = state.start
    hint = start.cores if start.source != FROM_DEFAULT and start.cores < state.bound else None
    rechecked = len(state.points) - len({c for c, _ in state.points})
    decision = topsearch.decide(state.points, state.widths, state.bound, config.noise_margin, hint,
                                start.source in _ANSWERS, config.rechecks, state.step, rechecked,
                                start.source == FROM_HISTORY, start.expected)
    if decision.answer:
        cores = decision.cores
        return ended(replace(state, cores=cores, kept=cores), searched_reason(state, cores))
    if state.steps >= config.max_steps:
        return ended(replace(state, cores=best_so_far(state, config)), STEP_LIMIT)
    if _over_budget(state, decision.cores, config):
        return ended(replace(state, cores=best_so_far(state, config)), TIME_LIMIT)
    phase = RECHECK if decision.recheck else (AT_TOP if decision.cores == state.bound and
                                              state.value(state.bound) is None else BISECT)
    return probe_at(replace(state, phase=phase), decision.cores)


def _over_budget(state: SizingState, cores: int, config: AllocatorConfig) -> bool:
    """The search's windows and one more at ``cores`` would take longer than ``max_probe_s``
    at 1 iteration/s: with the iteration-time signal and a best speed measured below 1
    iteration/s, its time at that speed (a slower job's windows are longer: the same number
    of iterations); a faster job's windows are no shorter than the warm-up, so its budget is
    ``max_probe_s`` itself."""
    pace = min(1.0, state.top()) if state.per_iteration and state.within() else 1.0
    return (math.fsum(state.seconds) + _expected_window_s(state, cores, config)) * pace > config.max_probe_s


def _expected_window_s(state: SizingState, cores: int, config: AllocatorConfig) -> float:
    """How long a window at ``cores`` is expected to take: the longest measured there, or at
    the nearest core counts measured on either side (its speed lies between theirs on a
    smooth curve), else the longest a window may be; with nothing measured below it, no less
    than the longest window seen (fewer cores are slower on a curve that still rises)."""
    measured = {c for c, _ in state.points}
    below = max((c for c in measured if c <= cores), default=None)
    above = min((c for c in measured if c >= cores), default=None)
    if below is None:
        return max(config.signal.max_window_s if not state.seconds else max(state.seconds),
                   max((t for (c, _), t in zip(state.points, state.seconds) if c == above), default=0.0))
    near = {below, above}
    return max(t for (c, _), t in zip(state.points, state.seconds) if c in near)


def best_so_far(state: SizingState, config: AllocatorConfig) -> int:
    """What TOP keeps when its search must end now: the fewest cores within the margin of the
    top measured within the bound, or the start (within the bound) with nothing measured."""
    points = topsearch.points_of(state.points, state.bound)
    if not points:
        return min(state.start.cores, state.bound)
    return topsearch.bracket(points, topsearch.top_of(points), config.noise_margin)[1]
