"""The allocator's vocabulary and the frozen state of a job's search.

The methods, where a start came from, the phases and why an answer came out; the errors;
the allocator's config and what it knows of a job (``JobSpec``); its request (``Probe``)
and its answer (``Sized``); and ``SizingState``, with its JSON form.

The allocator never measures and never writes a cpuset. It asks for a core count
(``Probe``), is told the throughput the job reached there (a mean from ``signal.Window``),
and in the end answers ``Sized``: the cores to keep, the throughput there and every point
measured. ``SizingState`` is a frozen value; every function returns a new one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from noded.jobs.model import CATEGORIES
from noded.rightsize import topsearch
from noded.rightsize.signal import ITERATION_TIME, KINDS, SignalConfig

CODA = "coda"
SYNERGY = "synergy"
TOP = "top"  # ours (issue #23): the top first, then the fewest cores within the margin of it
METHODS = (CODA, SYNERGY, TOP)

#: CODA V-B1's optional information, as job labels, and what each does to N_start per GPU.
HINTS: Mapping[str, int] = MappingProxyType({"pipelined": -1, "many_weights": -1, "heavy_preprocessing": +1})

# where N_start came from
FROM_HISTORY = "history"  # this owner's answer for this model and batch size: confirmed
FROM_HISTORY_SCALED = "history_scaled"  # that answer on other GPUs or signal, as a start
FROM_MODEL = "model"  # ours: this model's newest answer, the owner's (other batch) or anyone's
FROM_OWNER = "owner"  # the owner's largest recent answer in the category
FROM_CATEGORY = "category"  # the paper's default for the category, with hints
FROM_DEFAULT = "default"  # no category, no history
FROM_REPROBE = "reprobe"  # the cores the job had when the operator asked again
FROM_LIMIT = "limit"  # the search resumed within a ceiling (``limit``)
FROM_DRIFT = "drift"  # a sized job's throughput moved: searched again from its answer

# phases
CONFIRM = "confirm"
START = "start"
DOWN = "down"
UP = "up"
AT_MAX = "at_max"  # Synergy: measuring the maximum
HALVING = "halving"  # Synergy: the binary search
FLOOR = "floor"  # measuring the GPU-proportional share once (the floor phase)
AT_TOP = "at_top"  # TOP: measuring the most cores the job may have
BISECT = "bisect"  # TOP: bisecting for the fewest cores within the margin of the top
RECHECK = "recheck"  # TOP: a tie decided it: measured again
SIZED = "sized"
PINNED = "pinned"
STOPPED = "stopped"
PROBING = (CONFIRM, START, DOWN, UP, AT_MAX, HALVING, FLOOR, AT_TOP, BISECT, RECHECK)
PHASES = (*PROBING, SIZED, PINNED, STOPPED)

# why a Sized came out
SEARCHED = "searched"
CONFIRMED = "confirmed"
NO_CHOICE = "no_choice"  # max_cores is 1
NO_SIGNAL = "no_signal"  # a window ended without a sample
STEP_LIMIT = "step_limit"
TIME_LIMIT = "time_limit"  # TOP: the next window would take the search past max_probe_s
LIMITED = "limited"  # searched, and the answer is the plan's ceiling: the job may want more
REASONS = (SEARCHED, CONFIRMED, NO_CHOICE, NO_SIGNAL, STEP_LIMIT, TIME_LIMIT, LIMITED, PINNED, STOPPED)


class SizingError(Exception):
    """A request the allocator cannot take in its state, said why."""


class HintError(SizingError, ValueError):
    """A hint label whose value is not true or false."""


class NotProbing(SizingError):
    """A measurement for a job the allocator is not measuring."""


class OutOfRange(SizingError, ValueError):
    """A core count outside 1..max_cores."""


@dataclass(frozen=True)
class AllocatorConfig:
    method: str = TOP
    noise_margin: float = 0.03  # a share of the throughput; keep above the signal's tolerance
    rechecks: int = 2  # TOP: re-measurements of a tie per search
    fewer_if_equal: bool = True
    synergy_within: float = 0.10  # Synergy 3.1's "fixed threshold (say 10%)"
    max_steps: int = 24  # measurements per search, whatever the curve does
    #: TOP: no probe is started that would take the search's windows past this many seconds
    #: (CODA: 3-4 steps of 90 s, 6 minutes); with the iteration-time signal and a job slower
    #: than 1 iteration/s, this many iterations at the best speed measured; the answer is then
    #: the fewest cores measured within the margin
    max_probe_s: float = 360.0
    step_per_gpu: bool = True  # CODA's step of one core, per GPU (ours); False: one core (the paper's)
    signal: SignalConfig = field(default_factory=SignalConfig)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, not {self.method!r}")
        if not 0 < self.noise_margin < 1 or not 0 < self.synergy_within < 1:
            raise ValueError("noise_margin and synergy_within must be in (0, 1)")
        if self.max_steps < 2:
            raise ValueError(f"max_steps must be >= 2, not {self.max_steps}")
        if not self.max_probe_s > 0:
            raise ValueError(f"max_probe_s must be > 0, not {self.max_probe_s!r}")
        if type(self.rechecks) is not int or self.rechecks < 0:
            raise ValueError(f"rechecks must be a whole number >= 0, not {self.rechecks!r}")


@dataclass(frozen=True)
class JobSpec:
    """What the allocator knows of a GPU job. ``max_cores``: its cpuset at start, or its
    GPU-proportional share, whichever the caller caps it at. ``share``: its GPU-proportional
    share of the node's cores (None: no floor phase). ``labels``: the job's labels; only the
    names in ``HINTS`` are read."""

    job: str
    max_cores: int
    gpus: int = 1
    owner: str | None = None
    category: str | None = None
    model: str | None = None
    batch_size: int | None = None
    signal: str = ITERATION_TIME
    labels: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    share: int | None = None

    def __post_init__(self):
        if self.max_cores < 1 or self.gpus < 1:
            raise ValueError(f"{self.job}: max_cores and gpus must be >= 1")
        if self.share is not None and (type(self.share) is not int or self.share < 1):
            raise ValueError(f"{self.job}: share must be a whole number >= 1, not {self.share!r:.20}")
        if self.category is not None and self.category not in CATEGORIES:
            raise ValueError(f"{self.job}: category must be one of {CATEGORIES}, not {self.category!r}")
        if self.signal not in KINDS:
            raise ValueError(f"{self.job}: signal must be one of {KINDS}, not {self.signal!r}")

    def hint_delta(self) -> int:
        """The hints' total adjustment of N_start per GPU; HintError for a value not true/false."""
        total = 0
        for name, delta in HINTS.items():
            value = self.labels.get(name)
            if value is None:
                continue
            if not isinstance(value, bool):
                raise HintError(f"{self.job}: label {name} must be true or false, not {value!r:.40}")
            total += delta if value else 0
        return total


@dataclass(frozen=True)
class Probe:
    """Give ``job`` ``cores`` and measure its throughput there."""

    job: str
    cores: int
    phase: str


@dataclass(frozen=True)
class Sized:
    """The answer: keep ``job`` at ``cores``. ``throughput``: measured there (None when not
    measured); ``curve_points``: every (cores, mean) measured, by cores; ``steps``: how many
    measurements it took."""

    job: str
    cores: int
    throughput: float | None
    curve_points: tuple[tuple[int, float], ...]
    steps: int
    reason: str


@dataclass(frozen=True)
class Start:
    cores: int
    source: str
    expected: float | None = None  # the remembered throughput to confirm (FROM_HISTORY)


@dataclass(frozen=True)
class SizingState:
    job: str
    method: str
    max_cores: int
    start: Start
    phase: str
    cores: int  # what the job has now: the probe's cores, or the answer
    points: tuple[tuple[int, float], ...] = ()  # in the order measured
    kept: int | None = None  # CODA: the cores kept so far
    lo: int = 1  # Synergy: the answer lies in lo..hi
    hi: int = 1
    reason: str | None = None  # why it ended, once it has
    gpus: int = 1
    step: int = 1  # cores per step of the search: one per GPU (``step_per_gpu``), else one
    share: int | None = None  # the GPU-proportional share (within max_cores): the floor phase
    ceiling: int | None = None  # the plan's limit (``limit``), below max_cores; None: none
    widths: tuple[float, ...] = ()  # each point's window interval, relative half-width (TOP's noise)
    seconds: tuple[float, ...] = ()  # each point's window length (TOP's time budget)
    per_iteration: bool = True  # the means are iterations/s: the time budget scales with the best

    @property
    def steps(self) -> int:
        return len(self.points)

    @property
    def bound(self) -> int:
        """The most cores a probe or an answer may have now."""
        return self.max_cores if self.ceiling is None else min(self.ceiling, self.max_cores)

    def value(self, cores: int) -> float | None:
        """The mean of the windows measured at ``cores`` (TOP measures a tie again)."""
        values = [v for c, v in self.points if c == cores]
        return math.fsum(values) / len(values) if values else None

    def within(self) -> tuple[tuple[int, float], ...]:
        """The points measured within the bound (one per core count: its mean)."""
        return tuple((c, self.value(c)) for c in dict.fromkeys(c for c, _ in self.points) if c <= self.bound)

    def top(self) -> float:
        """The best throughput measured within the bound."""
        return max(v for _, v in self.within())

    def answer(self) -> Sized:
        """The Sized of an ended state. Raises SizingError while probing."""
        if self.phase in PROBING:
            raise SizingError(f"{self.job}: still probing ({self.phase})")
        means = tuple(sorted((c, self.value(c)) for c in {c for c, _ in self.points}))
        return Sized(self.job, self.cores, self.value(self.cores), means, self.steps, self.reason or self.phase)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "method": self.method, "max_cores": self.max_cores,
                "start": {"cores": self.start.cores, "source": self.start.source, "expected": self.start.expected},
                "phase": self.phase, "cores": self.cores, "points": [[c, v] for c, v in self.points],
                "kept": self.kept, "lo": self.lo, "hi": self.hi, "reason": self.reason,
                "gpus": self.gpus, "step": self.step, "share": self.share, "ceiling": self.ceiling,
                "widths": list(self.widths), "seconds": list(self.seconds), "per_iteration": self.per_iteration}

    @classmethod
    def from_dict(cls, data: Any) -> "SizingState":
        """Raises ValueError on any other shape, or on a state the allocator could not reach."""
        keys = {"job", "method", "max_cores", "start", "phase", "cores", "points", "kept", "lo", "hi", "reason",
                "gpus", "step", "share", "ceiling", "widths", "seconds", "per_iteration"}
        data = _with_later_keys(data)
        if not isinstance(data, dict) or set(data) != keys:
            raise ValueError(f"a sizing state: expected {', '.join(sorted(keys))}")
        if not isinstance(data["job"], str) or not data["job"]:
            raise ValueError("job: not a name")
        if data["method"] not in METHODS or data["phase"] not in PHASES:
            raise ValueError(f"method or phase unknown: {str(data['method'])[:20]!r}, {str(data['phase'])[:20]!r}")
        if data["reason"] is not None and data["reason"] not in REASONS:
            raise ValueError(f"reason unknown: {str(data['reason'])[:20]!r}")
        top = whole(data["max_cores"], "max_cores", 1, 1 << 16)
        start = data["start"]
        if not isinstance(start, dict) or set(start) != {"cores", "source", "expected"}:
            raise ValueError("start: expected cores, source, expected")
        expected = start["expected"]
        if expected is not None and not is_positive(expected):
            raise ValueError("start.expected: not a positive number")
        if not isinstance(start["source"], str):
            raise ValueError("start.source: not a name")
        parsed, widths, seconds = _measured_points(data, top)
        if not isinstance(data["per_iteration"], bool):
            raise ValueError("per_iteration: expected true or false")
        kept = None if data["kept"] is None else whole(data["kept"], "kept", 1, top)
        share = None if data["share"] is None else whole(data["share"], "share", 1, top)
        ceiling = None if data["ceiling"] is None else whole(data["ceiling"], "ceiling", 1, top - 1)
        gpus = whole(data["gpus"], "gpus", 1, 1 << 10)
        if data["step"] not in (1, gpus) or type(data["step"]) is not int:
            raise ValueError(f"step: one core or one per GPU ({gpus}), not {str(data['step'])[:20]}")
        return cls(data["job"], data["method"], top,
                   Start(whole(start["cores"], "start.cores", 1, top), start["source"], expected),
                   data["phase"], whole(data["cores"], "cores", 1, top), tuple(parsed), kept,
                   whole(data["lo"], "lo", 1, top), whole(data["hi"], "hi", 1, top), data["reason"],
                   gpus, data["step"], share, ceiling, tuple(float(w) for w in widths),
                   tuple(float(t) for t in seconds), data["per_iteration"])


def _with_later_keys(data: Any) -> Any:
    """A state saved before a key existed, with what that key meant then."""
    if not isinstance(data, dict):
        return data
    if "widths" not in data:
        data = {**data, "widths": [topsearch.UNKNOWN_WIDTH] * len(data.get("points") or ())}  # saved before them
    if "seconds" not in data:
        data = {**data, "seconds": [0.0] * len(data.get("points") or ())}  # saved before them
    if "per_iteration" not in data:
        data = {**data, "per_iteration": True}  # saved before it
    return data


def _measured_points(data: dict, top: int) -> tuple[list[tuple[int, float]], list, list]:
    """The points measured, each with its window's half-width and length, checked."""
    points = data["points"]
    if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 for p in points):
        raise ValueError("points: expected a list of [cores, throughput]")
    parsed = []
    for c, v in points:
        if not is_positive(v):
            raise ValueError(f"points: not a positive throughput: {str(v)[:40]}")
        parsed.append((whole(c, "points cores", 1, top), float(v)))
    if len({c for c, _ in parsed}) != len(parsed) and data["method"] != TOP:
        raise ValueError("points: a core count measured twice")
    widths = data["widths"]
    if not isinstance(widths, list) or len(widths) != len(parsed) or not all(is_width(w) for w in widths):
        raise ValueError("widths: expected one relative half-width in 0..1 per point")
    seconds = data["seconds"]
    if not isinstance(seconds, list) or len(seconds) != len(parsed) or not all(
            is_number(t) and t >= 0 for t in seconds):
        raise ValueError("seconds: expected one window length >= 0 per point")
    return parsed, widths, seconds


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_width(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


def is_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def whole(value: Any, where: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise ValueError(f"{where}: not a whole number in {lo}..{hi}: {str(value)[:40]}")
    return value
