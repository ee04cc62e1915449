"""Synergy's search (Sec. 3.1, 4), one decision at a time.

Measure ``max_cores``, then binary-search 1..max for the fewest cores whose throughput is
within ``synergy_within`` (10 %) of the best measured; the answer is the fewest measured
cores within that share of the best.
"""

from __future__ import annotations

from dataclasses import replace

from noded.rightsize import coda
from noded.rightsize.sizing import CONFIRM, HALVING, AllocatorConfig, SizingState
from noded.rightsize.steps import Step, searched


def decide(state: SizingState, config: AllocatorConfig):
    """Synergy 3.1: from the maximum, halve the range towards the fewest cores within
    ``synergy_within`` of the best throughput measured."""
    if state.phase == CONFIRM:
        return coda.confirm(state, config)
    lo, hi = state.lo, state.hi
    if state.phase == HALVING:
        if state.value(state.cores) >= (1 - config.synergy_within) * state.top():
            hi = state.cores
        else:
            lo = state.cores + 1
    if lo < hi:
        return Step(HALVING, (lo + hi) // 2, {"lo": lo, "hi": hi})
    return searched(replace(state, lo=lo, hi=hi), answer(state, config))


def answer(state: SizingState, config: AllocatorConfig) -> int:
    """The fewest measured cores within ``synergy_within`` of the best measured (within the bound)."""
    bar = (1 - config.synergy_within) * state.top()
    return min(c for c, v in state.within() if v >= bar)
