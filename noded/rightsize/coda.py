"""CODA's search (V-B2), one decision at a time, and the confirmation of a remembered answer
(which Synergy's search shares).

Measure N_start; then one step fewer: while fewer cores are kept, go on down; if the first
step down is not kept, go up one step at a time while more cores improve the throughput by
more than ``noise_margin``. A step up is kept only for a real gain. A step down is kept when
the throughput is not lower than the best measured so far by more than the margin
(``fewer_if_equal``, ours: the paper keeps it only when it improves, but past the optimum
the loss per core is "slight", often inside the noise, and a core freed at no measurable
cost is CODA's point); ``fewer_if_equal=False`` is the paper's rule. Bounded by 1 and the
job's ``max_cores`` (its cpuset at start, or its GPU-proportional share), and by a ceiling
the caller may set on the way (``ceiling.limit``).

*From the same job's answer on other GPUs* (or measured with another signal; ours) the
search only goes down: the start is measured, then one step fewer, and when that is not
kept the start is the answer. The remembered search ended where one step more per GPU was
not measurably faster (CODA's search always tries it, unless at the bound), and the optimum
per GPU does not depend on the GPUs (IV-B2); two steps instead of three.
"""

from __future__ import annotations

from dataclasses import replace

from noded.rightsize.sizing import (AT_MAX, CONFIRM, CONFIRMED, DOWN, FROM_HISTORY_SCALED, START, SYNERGY, UP,
                                    AllocatorConfig, SizingError, SizingState)
from noded.rightsize.steps import Step, ended, searched, step_down, step_up


def confirm(state: SizingState, config: AllocatorConfig):
    """A remembered answer holds when the job is not slower there than the margin."""
    measured, expected = state.value(state.cores), state.start.expected
    if expected is not None and measured >= expected * (1 - config.noise_margin):
        return ended(replace(state, kept=state.cores), CONFIRMED)
    # the job is not what it was: search, from the point just measured
    if state.method == SYNERGY:
        return Step(AT_MAX, state.bound, {"lo": 1, "hi": state.bound})
    return after_start(replace(state, kept=state.cores))


def decide(state: SizingState, config: AllocatorConfig):
    """CODA V-B2 one decision at a time: a Step for the next probe,
    or the (Sized, state) answer."""
    c = state.cores
    v = state.value(c)
    if state.phase == CONFIRM:
        return confirm(state, config)
    if state.phase == START:
        return after_start(replace(state, kept=c))
    kept = state.kept
    if state.phase == DOWN:
        if _keep_fewer(v, state, config):
            if c > 1:
                return Step(DOWN, step_down(state, c), {"kept": c})
            return searched(replace(state, kept=c), c)
        if kept == state.start.cores and c == step_down(state, kept):
            # the first step down did not pay: case 2, the other direction; not from the same
            # job's answer on other GPUs, whose search found a step more gained nothing
            if kept < state.bound and state.start.source != FROM_HISTORY_SCALED:
                return Step(UP, step_up(state, kept), {})
        return searched(state, kept)
    if state.phase == UP:
        if v > state.value(kept) * (1 + config.noise_margin):
            if c < state.bound:
                return Step(UP, step_up(state, c), {"kept": c})
            return searched(replace(state, kept=c), c)
        return searched(state, kept)
    raise SizingError(f"{state.job}: phase {state.phase} is not CODA's")


def after_start(state: SizingState):
    kept = state.kept
    if kept > 1:
        return Step(DOWN, step_down(state, kept), {"kept": kept})
    if kept < state.bound:
        return Step(UP, step_up(state, kept), {"kept": kept})
    return searched(state, kept)


def _keep_fewer(v: float, state: SizingState, config: AllocatorConfig) -> bool:
    if config.fewer_if_equal:
        # against the best measured, not the last step: small losses must not add up
        return v >= state.top() * (1 - config.noise_margin)
    return v > state.value(state.kept) * (1 + config.noise_margin)
