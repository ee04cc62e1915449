"""The CPU allocator of a GPU job, its public names in one place (a pure state machine: it
asks for core counts, is told the throughput there, and answers the cores to keep).

Its parts, by what they do: ``sizing`` (the vocabulary, the job's spec, the requests and
answers, the frozen state), ``starts`` (where a search starts, CODA V-B1), ``search`` (begin,
advance, the operator's controls), the searches (``topsizing`` over ``topsearch``, the
default; ``coda``; ``synergy``; what they share and the floor phase, ``steps``),
``ceiling`` (the plan's limit), ``drift`` (a sized job's passive watch) and ``jobsizing``
(a job's state with its signal window, what a daemon keeps per job). New code imports from
those; this module keeps the names callers used before the split.
"""

from __future__ import annotations

from noded.rightsize.ceiling import limit
from noded.rightsize.drift import DRIFT_WINDOWS, Watch
from noded.rightsize.jobsizing import JobSizing, begin_job, feed, limit_job, pin_job, reprobe_job, stop_job
from noded.rightsize.search import advance, begin, drifted, pin, reprobe, stop
from noded.rightsize.sizing import (AT_MAX, AT_TOP, BISECT, CODA, CONFIRM, CONFIRMED, DOWN, FLOOR, FROM_CATEGORY,
                                    FROM_DEFAULT, FROM_DRIFT, FROM_HISTORY, FROM_HISTORY_SCALED, FROM_LIMIT,
                                    FROM_MODEL, FROM_OWNER, FROM_REPROBE, HALVING, HINTS, LIMITED, METHODS,
                                    NO_CHOICE, NO_SIGNAL, PHASES, PINNED, PROBING, REASONS, RECHECK, SEARCHED, SIZED,
                                    START, STEP_LIMIT, STOPPED, SYNERGY, TIME_LIMIT, TOP, UP, AllocatorConfig,
                                    HintError, JobSpec, NotProbing, OutOfRange, Probe, Sized, SizingError,
                                    SizingState, Start)
from noded.rightsize.starts import DEFAULT_START, UNKNOWN_START, start_point

__all__ = [
    "AT_MAX", "AT_TOP", "BISECT", "CODA", "CONFIRM", "CONFIRMED", "DEFAULT_START", "DOWN", "DRIFT_WINDOWS", "FLOOR",
    "FROM_CATEGORY", "FROM_DEFAULT", "FROM_DRIFT", "FROM_HISTORY", "FROM_HISTORY_SCALED", "FROM_LIMIT", "FROM_MODEL",
    "FROM_OWNER", "FROM_REPROBE", "HALVING", "HINTS", "LIMITED", "METHODS", "NO_CHOICE", "NO_SIGNAL", "PHASES",
    "PINNED", "PROBING", "REASONS", "RECHECK", "SEARCHED", "SIZED", "START", "STEP_LIMIT", "STOPPED", "SYNERGY",
    "TIME_LIMIT", "TOP", "UNKNOWN_START", "UP", "AllocatorConfig", "HintError", "JobSizing", "JobSpec", "NotProbing",
    "OutOfRange", "Probe", "Sized", "SizingError", "SizingState", "Start", "Watch", "advance", "begin", "begin_job",
    "drifted", "feed", "limit", "limit_job", "pin", "pin_job", "reprobe", "reprobe_job", "start_point", "stop",
    "stop_job",
]
