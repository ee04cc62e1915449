"""A job's sizing as a daemon keeps it: ``JobSizing`` puts a search's state and the signal
window of its current probe (or, once sized, its passive window and ``drift.Watch``)
together, and is fed samples with the caller's ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable

from noded.rightsize import topsearch
from noded.rightsize.ceiling import limit
from noded.rightsize.drift import Watch
from noded.rightsize.history import HistoryView
from noded.rightsize.search import advance, begin, drifted, pin, reprobe, stop
from noded.rightsize.signal import ITERATION_TIME, Measurement, Window
from noded.rightsize.sizing import PINNED, PROBING, SIZED, AllocatorConfig, JobSpec, Probe, Sized, SizingState


@dataclass(frozen=True)
class JobSizing:
    """A job's allocator state and the window measuring its current probe, or, once sized,
    its passive window at the answer (``watch``); None when nothing is measured (pinned,
    stopped). Feed it samples; it opens a window at each probe and closes it once the signal
    is steady (or at the maximum window)."""

    spec: JobSpec
    state: SizingState
    window: Window | None = None
    watch: Watch | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state.to_dict(), "window": self.window.to_dict() if self.window else None,
                "watch": self.watch.to_dict() if self.watch else None}

    @classmethod
    def from_dict(cls, spec: JobSpec, data: Any) -> "JobSizing":
        """The spec comes from the job as it is now; raises ValueError on any other shape."""
        if isinstance(data, dict) and "watch" not in data:
            data = {**data, "watch": None}  # saved before drift was watched
        if not isinstance(data, dict) or set(data) != {"state", "window", "watch"}:
            raise ValueError("a job's sizing: expected state, window and watch")
        # the time budget's unit follows the job's signal as it is now (a state saved before
        # the budget says nothing of it)
        state = replace(SizingState.from_dict(data["state"]), per_iteration=spec.signal == ITERATION_TIME)
        window = None if data["window"] is None else Window.from_dict(data["window"])
        watch = None if data["watch"] is None else Watch.from_dict(data["watch"])
        if state.job != spec.job or state.max_cores != spec.max_cores or state.gpus != spec.gpus:
            raise ValueError(f"the saved sizing is of {state.job} at {state.max_cores} cores on {state.gpus} GPUs, "
                             f"not this job's")
        if window is not None and (window.kind != spec.signal
                                   or window.cores != state.cores
                                   or (state.phase not in PROBING and (state.phase != SIZED or watch is None))):
            raise ValueError("the saved window does not belong to the saved probe")
        if watch is not None and state.phase != SIZED:
            raise ValueError("a watch belongs to a sized job")
        return cls(spec, state, window, watch)


def _with_window(spec: JobSpec, out: Probe | Sized, state: SizingState, now: float):
    """A probe's window; a searched answer's passive window and its watch (drift)."""
    if isinstance(out, Probe):
        return out, JobSizing(spec, state, Window(spec.signal, out.cores, now))
    if state.phase == SIZED and out.throughput is not None:
        return out, JobSizing(spec, state, Window(spec.signal, out.cores, now), Watch(out.throughput))
    return out, JobSizing(spec, state, None)


def _error(state: SizingState) -> float:
    """One window mean's relative error as the search saw it (its intervals, its rechecks)."""
    return topsearch.window_error(state.points, state.widths)


def begin_job(spec: JobSpec, history: HistoryView | None, config: AllocatorConfig,
              now: float) -> tuple[Probe | Sized, JobSizing]:
    """The first request for a job; the window of a probe opens at ``now`` (the caller gives
    the cores at once, and the warm-up covers the change taking hold)."""
    out, state = begin(spec, history, config)
    return _with_window(spec, out, state, now)


def feed(sizing: JobSizing, samples: Iterable[tuple[float, float]], now: float,
         config: AllocatorConfig) -> tuple[Probe | Sized | None, JobSizing, Measurement | None]:
    """Take (t, value) samples of the job's signal. Returns the next request when the current
    window ended at ``now`` (None otherwise), the new sizing, and what the window measured.
    Raises BadSample for a value that is not of the signal's kind (nothing is taken then)."""
    window = sizing.window
    if window is None:
        return None, sizing, None
    for t, value in samples:
        window = window.add(t, value, config.signal)
    measured = window.result(now, config.signal)
    if measured is None:  # the common case, once per report: the constructor is the cheaper
        return None, JobSizing(sizing.spec, sizing.state, window, sizing.watch), None
    if sizing.watch is not None:
        return (*_watched(sizing, measured, now, config), measured)
    out, state = advance(sizing.state, measured.mean, config, measured.rel_half_width, measured.elapsed_s)
    return (*_with_window(sizing.spec, out, state, now), measured)


def _watched(sizing: JobSizing, measured: Measurement, now: float,
             config: AllocatorConfig) -> tuple[Probe | None, JobSizing]:
    """A sized job's passive window ended: the next one opens, unless the job's throughput
    moved beyond the band DRIFT_WINDOWS windows in a row: then it is searched again from the
    top, the points measured before the change forgotten (None: nothing to do)."""
    state = sizing.state
    if measured.mean is None:
        return None, replace(sizing, window=Window(sizing.spec.signal, state.cores, now))
    watch = sizing.watch.seen(measured.mean, config.noise_margin, _error(state))
    if not watch.drifted:
        return None, replace(sizing, window=Window(sizing.spec.signal, state.cores, now), watch=watch)
    out, fresh = drifted(state, config)
    return _with_window(sizing.spec, out, fresh, now)


def pin_job(sizing: JobSizing, cores: int, phase: str = PINNED) -> tuple[Sized, JobSizing]:
    out, state = pin(sizing.state, cores, phase)
    return out, JobSizing(sizing.spec, state, None)


def stop_job(sizing: JobSizing) -> tuple[Sized, JobSizing]:
    out, state = stop(sizing.state)
    return out, JobSizing(sizing.spec, state, None)


def reprobe_job(sizing: JobSizing, config: AllocatorConfig, now: float) -> tuple[Probe | Sized, JobSizing]:
    out, state = reprobe(sizing.state, config)
    return _with_window(sizing.spec, out, state, now)


def limit_job(sizing: JobSizing, cores: int, config: AllocatorConfig,
              now: float) -> tuple[Probe | Sized | None, JobSizing]:
    """``limit`` on a job's sizing: a probe cut to the ceiling opens a new window at ``now``;
    a probe that stands keeps its window."""
    out, state = limit(sizing.state, cores, config)
    if out is None:
        return None, replace(sizing, state=state)
    return _with_window(sizing.spec, out, state, now)
