"""What the searches share: a probe, an ended search, a step, and the floor phase.

*A step is one core per GPU* (ours): CODA's jobs (Table II) are single-GPU, where a step is
one core. A job on 4 GPUs stepping one core moves a quarter core per GPU, which changes its
throughput by less than the 3 % margin: the search stopped early (10 of a 4-GPU BiDAF's 24
cores) or walked 15-19 steps. The optimum grows linearly with the GPUs (IV-B2), so a step of
``gpus`` cores walks the same curve per GPU as CODA's single-GPU search. Steps never go
below 1 core nor above the bound (the last step is cut to it).

**The floor phase** (ours, after Synergy Sec. 4.2: no job below its GPU-proportional
share's throughput). With ``JobSpec.share`` given, an answer below the share, where a point
measured above the answer was faster (the curve was still rising, just not by the margin),
is measured once more at the share; the share is kept when it measured faster than the
answer at all (the floor is a promise: a tie inside the noise goes to the share, which costs
cores, not the job's speed). Remembered answers are not checked again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from noded.rightsize.sizing import (FLOOR, LIMITED, PINNED, SEARCHED, SIZED, STOPPED, Probe, Sized,
                                    SizingState)


def probe_at(state: SizingState, cores: int) -> tuple[Probe, SizingState]:
    state = replace(state, cores=cores)
    return Probe(state.job, cores, state.phase), state


def ended(state: SizingState, reason: str) -> tuple[Sized, SizingState]:
    phase = state.phase if state.phase in (PINNED, STOPPED) else SIZED
    state = replace(state, phase=phase, reason=reason)
    return state.answer(), state


@dataclass(frozen=True)
class Step:
    """A search's wish for one more probe: at ``cores``, in ``phase``, with ``fields`` set."""

    phase: str
    cores: int
    fields: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


def step_down(state: SizingState, cores: int) -> int:
    """One step fewer: a core per GPU, never below one core."""
    return max(1, cores - state.step)


def step_up(state: SizingState, cores: int) -> int:
    """One step more: a core per GPU, never above the bound."""
    return min(state.bound, cores + state.step)


def searched(state: SizingState, cores: int):
    """A search's answer. Below the job's share where a point measured above it was faster
    (the curve still rose, not by the margin): first the floor phase, one measurement at the
    share; with the share measured already, the share when it was faster."""
    v = state.value(cores)
    share = None if state.share is None else min(state.share, state.bound)
    if share is not None and v is not None and cores < share:
        at_share = state.value(share)
        if at_share is None:
            if any(c > cores and x > v for c, x in state.within()):
                return Step(FLOOR, share, {"kept": cores})
        elif at_share > v:
            cores = share
    return ended(replace(state, cores=cores, kept=cores), searched_reason(state, cores))


def searched_reason(state: SizingState, cores: int) -> str:
    """SEARCHED; LIMITED when the answer is the plan's ceiling (not remembered: the job may
    want more than the node could give while it was searched)."""
    return LIMITED if state.ceiling is not None and cores >= state.bound else SEARCHED


def after_floor(state: SizingState):
    """The floor phase measured the share: kept when faster than the answer at all."""
    kept, share = state.kept, state.cores
    cores = share if state.value(share) > state.value(kept) else kept
    return ended(replace(state, cores=cores, kept=cores), searched_reason(state, cores))
