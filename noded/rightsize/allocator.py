"""The CPU allocator of a GPU job as a pure state machine: the top search (the default,
issue #23, ``topsearch``), CODA's adaptive allocator (Sec. V-B) and Synergy's search.

**The top search** (``TOP``, ours). Measure the most cores the job may have (its
``max_cores`` within the plan's ceiling), then bisect for the fewest cores within
``noise_margin`` of the best measured, every decision re-derived from all points (see
``topsearch``); N_start below (history, the model, the owner, the category and hints) only
says where the bisection looks first. The job's own remembered answer holds when the top
and it are measured and it is clearly within the margin (two measurements); an answer from
other GPUs or another batch size tries the core below it next. No probe starts that would
take the search past ``max_probe_s`` (with the iteration-time signal and a job slower than
1 iteration/s, that many iterations at the best speed measured: its windows are longer);
the answer is then the fewest cores measured within the margin (``TIME_LIMIT``). No floor
phase: the answer is within the margin of the top, which is measured at the share or
above. **Drift** (all methods): a searched answer keeps a passive window (``Watch``); when
``DRIFT_WINDOWS`` windows in a row measure the job beyond the band in one direction, it is
searched again from the top with nothing measured before kept (``drifted``).

The allocator never measures and never writes a cpuset. It asks for a core count
(``Probe``), is told the throughput the job reached there (a mean from ``signal.Window``),
and in the end answers ``Sized``: the cores to keep, the throughput there and every point
measured. ``SizingState`` is a frozen value; every function returns a new one.

**Where to start (V-B1).** The owner's remembered answer for the same model and batch size
(with the same GPUs and signal) is only confirmed: one measurement, and if the job is not
slower than the margin there, that is the answer. The same answer on other GPUs or with
another signal is a start, per GPU. Then, ours, *the same model before the category*: the
owner's newest answer for this model with another batch size, else any owner's newest
answer for this model, per GPU times the job's GPUs. CODA goes from the exact job straight to
the owner's category, but one owner's models of a category can be far apart (here
Transformer at 2 cores per GPU, BiDAF at 6: BiDAF started from its owner's Transformer
answer probed at half speed for 8 of its 26 minutes), and the model's optimum per GPU is
what carries over (IV-B2). Otherwise N_start is the largest cores per GPU of the owner's
recent answers in the job's category, scaled by its GPUs (CODA's "we choose the largest
core number"); else the paper's defaults for a tenant's first job, 3 cores per GPU for CV
and 5 for NLP and Speech (4 with no category: ours, between the two), adjusted by the job's
hints (labels, each ``true`` or ``false``). Ours again: the owner's answers in the category
raise the start above the default but never lower it below: they were found for other
models (the same model is taken first), and a start below the optimum costs the most
(Fig. 3: the throughput rises linearly up to the optimum and "drops slightly" past it; a
low start runs slow while it probes and wastes its first step down). The owner's answers
are used as they are when the job has no category.

* ``pipelined``: the input pipeline overlaps reading and pre-processing: -1 core per GPU;
* ``many_weights``: a large model, longer GPU work per iteration: -1;
* ``heavy_preprocessing``: much CPU work between iterations: +1.

Hints adjust the defaults only: an owner's history was measured on their own jobs and
already reflects how they write them.

**CODA's search (V-B2).** Measure N_start; then one step fewer: while fewer cores are kept,
go on down; if the first step down is not kept, go up one step at a time while more cores
improve the throughput by more than ``noise_margin``. A step up is kept only for a real
gain. A step down is kept when the throughput is not lower than the best measured so far
by more than the margin (``fewer_if_equal``, ours: the paper keeps it only when it
improves, but past the optimum the loss per core is "slight", often inside the noise, and a
core freed at no measurable cost is CODA's point); ``fewer_if_equal=False`` is the paper's
rule. Bounded by 1 and the job's ``max_cores`` (its cpuset at start, or its GPU-proportional
share), and by a ceiling the caller may set on the way (``limit``).

*From the same job's answer on other GPUs* (or measured with another signal; ours) the
search only goes down: the start is measured, then one step fewer, and when that is not
kept the start is the answer. The remembered search ended where one step more per GPU was
not measurably faster (CODA's search always tries it, unless at the bound), and the optimum
per GPU does not depend on the GPUs (IV-B2); two steps instead of three.

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

**Synergy's search (Sec. 3.1, 4).** Measure ``max_cores``, then binary-search 1..max for
the fewest cores whose throughput is within ``synergy_within`` (10 %) of the best measured;
the answer is the fewest measured cores within that share of the best.

**Operator controls.** ``pin`` sets a size and measures nothing, ``stop`` keeps the cores the
job has now (mid-probe included), ``reprobe`` searches again from the cores it has.

**The plan's ceiling.** ``limit(state, cores)`` says the node can give the job at most
``cores`` for now (other jobs' shares come first). A probe above it is cut to it, and the
search resumes within it from what was measured: CODA from the best point measured within
the ceiling (or at the ceiling), Synergy with its range cut to the ceiling. An ended search's
answer stands (the plan gives what it can); ``limit`` with ``max_cores`` lifts the ceiling.
An answer at the ceiling ends ``LIMITED``, not ``SEARCHED``: the history does not remember
it (the job may want more than the node had while it was searched; remembered, it would
start and confirm every later job of the model there).

``JobSizing`` puts a state and the signal window of its current probe together and is fed
samples with the caller's ``now``; it is what a daemon keeps per job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from noded.jobs.model import CATEGORIES
from noded.rightsize import topsearch
from noded.rightsize.history import HistoryView
from noded.rightsize.signal import GPU_UTILISATION, ITERATION_TIME, KINDS, Measurement, SignalConfig, Window

CODA = "coda"
SYNERGY = "synergy"
TOP = "top"  # ours (issue #23): the top first, then the fewest cores within the margin of it
METHODS = (CODA, SYNERGY, TOP)

#: CODA V-B1: the first job of a tenant starts here, cores per GPU.
DEFAULT_START: Mapping[str, int] = MappingProxyType({"CV": 3, "NLP": 5, "Speech": 5})
#: Ours: a job whose category is unknown and whose owner has no history.
UNKNOWN_START = 4
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
#: starts that are a measured answer of this job or model: the top search tries the one
#: below next (TOP's neighbour rule)
_ANSWERS = (FROM_HISTORY, FROM_HISTORY_SCALED, FROM_MODEL, FROM_REPROBE, FROM_DRIFT)

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
                "gpus", "step", "share", "ceiling"}
        if isinstance(data, dict) and "widths" not in data:
            data = {**data, "widths": [topsearch.UNKNOWN_WIDTH] * len(data.get("points") or ())}  # saved before them
        if isinstance(data, dict) and "seconds" not in data:
            data = {**data, "seconds": [0.0] * len(data.get("points") or ())}  # saved before them
        if isinstance(data, dict) and "per_iteration" not in data:
            data = {**data, "per_iteration": True}  # saved before it
        keys |= {"widths", "seconds", "per_iteration"}
        if not isinstance(data, dict) or set(data) != keys:
            raise ValueError(f"a sizing state: expected {', '.join(sorted(keys))}")
        if not isinstance(data["job"], str) or not data["job"]:
            raise ValueError("job: not a name")
        if data["method"] not in METHODS or data["phase"] not in PHASES:
            raise ValueError(f"method or phase unknown: {str(data['method'])[:20]!r}, {str(data['phase'])[:20]!r}")
        if data["reason"] is not None and data["reason"] not in REASONS:
            raise ValueError(f"reason unknown: {str(data['reason'])[:20]!r}")
        top = _whole(data["max_cores"], "max_cores", 1, 1 << 16)
        start = data["start"]
        if not isinstance(start, dict) or set(start) != {"cores", "source", "expected"}:
            raise ValueError("start: expected cores, source, expected")
        expected = start["expected"]
        if expected is not None and not _positive(expected):
            raise ValueError("start.expected: not a positive number")
        if not isinstance(start["source"], str):
            raise ValueError("start.source: not a name")
        points = data["points"]
        if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 for p in points):
            raise ValueError("points: expected a list of [cores, throughput]")
        parsed = []
        for c, v in points:
            if not _positive(v):
                raise ValueError(f"points: not a positive throughput: {str(v)[:40]}")
            parsed.append((_whole(c, "points cores", 1, top), float(v)))
        if len({c for c, _ in parsed}) != len(parsed) and data["method"] != TOP:
            raise ValueError("points: a core count measured twice")
        widths = data["widths"]
        if not isinstance(widths, list) or len(widths) != len(parsed) or not all(
                _is_width(w) for w in widths):
            raise ValueError("widths: expected one relative half-width in 0..1 per point")
        seconds = data["seconds"]
        if not isinstance(seconds, list) or len(seconds) != len(parsed) or not all(
                _is_number(t) and t >= 0 for t in seconds):
            raise ValueError("seconds: expected one window length >= 0 per point")
        if not isinstance(data["per_iteration"], bool):
            raise ValueError("per_iteration: expected true or false")
        kept = None if data["kept"] is None else _whole(data["kept"], "kept", 1, top)
        share = None if data["share"] is None else _whole(data["share"], "share", 1, top)
        ceiling = None if data["ceiling"] is None else _whole(data["ceiling"], "ceiling", 1, top - 1)
        gpus = _whole(data["gpus"], "gpus", 1, 1 << 10)
        if data["step"] not in (1, gpus) or type(data["step"]) is not int:
            raise ValueError(f"step: one core or one per GPU ({gpus}), not {str(data['step'])[:20]}")
        return cls(data["job"], data["method"], top,
                   Start(_whole(start["cores"], "start.cores", 1, top), start["source"], expected),
                   data["phase"], _whole(data["cores"], "cores", 1, top), tuple(parsed), kept,
                   _whole(data["lo"], "lo", 1, top), _whole(data["hi"], "hi", 1, top), data["reason"],
                   gpus, data["step"], share, ceiling, tuple(float(w) for w in widths),
                   tuple(float(t) for t in seconds), data["per_iteration"])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_width(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _whole(value: Any, where: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise ValueError(f"{where}: not a whole number in {lo}..{hi}: {str(value)[:40]}")
    return value


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def start_point(spec: JobSpec, history: HistoryView | None) -> Start:
    """N_start for a job (V-B1), clamped to 1..max_cores. Raises HintError for a bad hint."""
    history = history or HistoryView()

    def clamp(cores: float) -> int:
        return min(spec.max_cores, max(1, _round(cores)))

    delta = spec.hint_delta()  # checked whatever the source: a bad label is an error either way
    known = history.exact(spec.owner, spec.model, spec.batch_size)
    if known is not None:
        if known.gpus == spec.gpus and known.signal == spec.signal and known.cores <= spec.max_cores:
            return Start(known.cores, FROM_HISTORY, known.throughput)
        return Start(clamp(known.cores / known.gpus * spec.gpus), FROM_HISTORY_SCALED)
    # ours, before CODA's category rule: the same model's answer (the owner's first)
    model = history.same_model(spec.model, spec.owner)
    if model is not None:
        return Start(clamp(model.cores / model.gpus * spec.gpus), FROM_MODEL)
    default = max(1, (UNKNOWN_START if spec.category is None else DEFAULT_START[spec.category]) + delta)
    largest = history.largest_per_gpu(spec.owner, spec.category)
    if largest is not None and (spec.category is None or largest >= default):
        return Start(clamp(largest * spec.gpus), FROM_OWNER)
    # ours: the owner's answers for other models of the category lift the start above the
    # default, never below it (see the module's docstring)
    return Start(clamp(default * spec.gpus), FROM_DEFAULT if spec.category is None else FROM_CATEGORY)


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
        return _end(replace(state, cores=1), NO_CHOICE)
    if config.method == TOP:
        # the top first, whatever the start says: the start is where the bisection looks first
        return _probe(replace(state, phase=AT_TOP), state.bound)
    if start.source == FROM_HISTORY and start.expected is not None:
        return _probe(replace(state, phase=CONFIRM), start.cores)
    if config.method == SYNERGY:
        return _probe(replace(state, phase=AT_MAX, lo=1, hi=state.bound), state.bound)
    return _probe(state, start.cores)


def advance(state: SizingState, mean: float | None, config: AllocatorConfig,
            width: float | None = None, elapsed: float = 0.0) -> tuple[Probe | Sized, SizingState]:
    """Take the mean measured at ``state.cores`` (None: the window saw no sample) and say what
    next; ``width``: the window's interval, a relative half-width (None: unknown);
    ``elapsed``: the window's length in seconds. Raises NotProbing when no measurement is
    awaited."""
    if state.phase not in PROBING:
        raise NotProbing(f"{state.job}: not probing ({state.phase}); a measurement is not expected")
    if mean is None:
        fallback = _best_so_far(state, config) if state.points else state.start.cores
        return _end(replace(state, cores=fallback), NO_SIGNAL)
    if not _positive(mean):
        raise SizingError(f"{state.job}: a throughput must be a positive number, not {mean!r:.40}")
    known = width if width is not None and math.isfinite(width) else topsearch.UNKNOWN_WIDTH
    state = replace(state, points=(*state.points, (state.cores, float(mean))),
                    widths=(*state.widths, min(max(0.0, known), topsearch.UNKNOWN_WIDTH)),
                    seconds=(*state.seconds, max(0.0, elapsed) if math.isfinite(elapsed) else 0.0))
    return _next(state, config)


def pin(state: SizingState, cores: int, phase: str = PINNED) -> tuple[Sized, SizingState]:
    """The operator's size: no probing until ``reprobe``. Raises OutOfRange. ``phase``
    STOPPED holds a stop at the cores it kept (a stop brought back after a restart)."""
    if type(cores) is not int or not 1 <= cores <= state.max_cores:
        raise OutOfRange(f"{state.job}: {cores!r:.20} cores is outside 1..{state.max_cores}")
    if phase not in (PINNED, STOPPED):
        raise ValueError(f"a pin holds a job PINNED or STOPPED, not {phase!r}")
    return _end(replace(state, phase=phase, cores=cores), phase)


def stop(state: SizingState) -> tuple[Sized, SizingState]:
    """Stop probing and keep the cores the job has now; an ended search stays as it is."""
    if state.phase not in PROBING:
        return state.answer(), state
    return _end(replace(state, phase=STOPPED), STOPPED)


def reprobe(state: SizingState, config: AllocatorConfig) -> tuple[Probe | Sized, SizingState]:
    """Search again (pin and stop undone), starting from the cores the job has now (within
    the plan's ceiling, which stays); what was measured before is forgotten (the job may have
    changed since)."""
    spec = JobSpec(state.job, state.max_cores, state.gpus, share=state.share, signal=_signal_of(state))
    return begin(spec, None, config, Start(min(state.cores, state.bound), FROM_REPROBE), state.ceiling)


# -- the searches


def _probe(state: SizingState, cores: int) -> tuple[Probe, SizingState]:
    state = replace(state, cores=cores)
    return Probe(state.job, cores, state.phase), state


def _end(state: SizingState, reason: str) -> tuple[Sized, SizingState]:
    phase = state.phase if state.phase in (PINNED, STOPPED) else SIZED
    state = replace(state, phase=phase, reason=reason)
    return state.answer(), state


@dataclass(frozen=True)
class _Step:
    """A search's wish for one more probe: at ``cores``, in ``phase``, with ``fields`` set."""

    phase: str
    cores: int
    fields: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


def _next(state: SizingState, config: AllocatorConfig) -> tuple[Probe | Sized, SizingState]:
    """After a point was added: the next probe, or the answer. A probe at a core count that
    was measured already (a failed confirmation's point) takes that value without asking."""
    if state.method == TOP:
        return _top(state, config)
    while True:
        if state.phase == FLOOR:
            decided = _floor(state)
        elif state.method == CODA:
            decided = _coda(state, config)
        else:
            decided = _synergy(state, config)
        if not isinstance(decided, _Step):
            return decided
        phase, cores = decided.phase, decided.cores
        state = replace(state, phase=phase, cores=cores, **decided.fields)
        if state.value(cores) is not None:
            continue  # measured already: decide on that value
        if state.steps >= config.max_steps:
            return _end(replace(state, cores=_best_so_far(state, config)), STEP_LIMIT)
        return Probe(state.job, cores, phase), state


def _best_so_far(state: SizingState, config: AllocatorConfig) -> int:
    """What to keep when a search must end now: within the bound, or the bound itself."""
    if state.method == TOP:
        points = topsearch.points_of(state.points, state.bound)
        if not points:
            return min(state.start.cores, state.bound)
        return topsearch.bracket(points, topsearch.top_of(points), config.noise_margin)[1]
    if state.phase == FLOOR or (state.method == CODA and state.kept is not None):
        if state.kept is not None and state.kept <= state.bound:
            return state.kept
    if not state.within():
        return min(state.start.cores, state.bound)
    if state.method == CODA:
        return max(state.within(), key=lambda p: (p[1], -p[0]))[0]
    return _synergy_answer(state, config)


def _down(state: SizingState, cores: int) -> int:
    """One step fewer: a core per GPU, never below one core."""
    return max(1, cores - state.step)


def _up(state: SizingState, cores: int) -> int:
    """One step more: a core per GPU, never above the bound."""
    return min(state.bound, cores + state.step)


def _searched(state: SizingState, cores: int):
    """A search's answer. Below the job's share where a point measured above it was faster
    (the curve still rose, not by the margin): first the floor phase, one measurement at the
    share; with the share measured already, the share when it was faster."""
    v = state.value(cores)
    share = None if state.share is None else min(state.share, state.bound)
    if share is not None and v is not None and cores < share:
        at_share = state.value(share)
        if at_share is None:
            if any(c > cores and x > v for c, x in state.within()):
                return _Step(FLOOR, share, {"kept": cores})
        elif at_share > v:
            cores = share
    return _end(replace(state, cores=cores, kept=cores), _searched_reason(state, cores))


def _searched_reason(state: SizingState, cores: int) -> str:
    """SEARCHED; LIMITED when the answer is the plan's ceiling (not remembered: the job may
    want more than the node could give while it was searched)."""
    return LIMITED if state.ceiling is not None and cores >= state.bound else SEARCHED


def _floor(state: SizingState):
    """The floor phase measured the share: kept when faster than the answer at all."""
    kept, share = state.kept, state.cores
    cores = share if state.value(share) > state.value(kept) else kept
    return _end(replace(state, cores=cores, kept=cores), _searched_reason(state, cores))


def _confirm(state: SizingState, config: AllocatorConfig):
    """A remembered answer holds when the job is not slower there than the margin."""
    measured, expected = state.value(state.cores), state.start.expected
    if expected is not None and measured >= expected * (1 - config.noise_margin):
        return _end(replace(state, kept=state.cores), CONFIRMED)
    # the job is not what it was: search, from the point just measured
    if state.method == SYNERGY:
        return _Step(AT_MAX, state.bound, {"lo": 1, "hi": state.bound})
    return _coda_after_start(replace(state, kept=state.cores))


def _top(state: SizingState, config: AllocatorConfig) -> tuple[Probe | Sized, SizingState]:
    """TOP one decision at a time (``topsearch.decide``): every core count is decided against
    the best measured, from all the points; a tie is measured again before it decides."""
    start = state.start
    hint = start.cores if start.source != FROM_DEFAULT and start.cores < state.bound else None
    rechecked = len(state.points) - len({c for c, _ in state.points})
    decision = topsearch.decide(state.points, state.widths, state.bound, config.noise_margin, hint,
                                start.source in _ANSWERS, config.rechecks, state.step, rechecked,
                                start.source == FROM_HISTORY)
    if decision.answer:
        cores = decision.cores
        return _end(replace(state, cores=cores, kept=cores), _searched_reason(state, cores))
    if state.steps >= config.max_steps:
        return _end(replace(state, cores=_best_so_far(state, config)), STEP_LIMIT)
    if _over_budget(state, decision.cores, config):
        return _end(replace(state, cores=_best_so_far(state, config)), TIME_LIMIT)
    phase = RECHECK if decision.recheck else (AT_TOP if decision.cores == state.bound and
                                              state.value(state.bound) is None else BISECT)
    return _probe(replace(state, phase=phase), decision.cores)


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


def _coda(state: SizingState, config: AllocatorConfig):
    """CODA V-B2 one decision at a time: a _Step for the next probe,
    or the (Sized, state) answer."""
    c = state.cores
    v = state.value(c)
    if state.phase == CONFIRM:
        return _confirm(state, config)
    if state.phase == START:
        return _coda_after_start(replace(state, kept=c))
    kept = state.kept
    if state.phase == DOWN:
        if _keep_fewer(v, state, config):
            if c > 1:
                return _Step(DOWN, _down(state, c), {"kept": c})
            return _searched(replace(state, kept=c), c)
        if kept == state.start.cores and c == _down(state, kept):
            # the first step down did not pay: case 2, the other direction; not from the same
            # job's answer on other GPUs, whose search found a step more gained nothing
            if kept < state.bound and state.start.source != FROM_HISTORY_SCALED:
                return _Step(UP, _up(state, kept), {})
        return _searched(state, kept)
    if state.phase == UP:
        if v > state.value(kept) * (1 + config.noise_margin):
            if c < state.bound:
                return _Step(UP, _up(state, c), {"kept": c})
            return _searched(replace(state, kept=c), c)
        return _searched(state, kept)
    raise SizingError(f"{state.job}: phase {state.phase} is not CODA's")


def _coda_after_start(state: SizingState):
    kept = state.kept
    if kept > 1:
        return _Step(DOWN, _down(state, kept), {"kept": kept})
    if kept < state.bound:
        return _Step(UP, _up(state, kept), {"kept": kept})
    return _searched(state, kept)


def _keep_fewer(v: float, state: SizingState, config: AllocatorConfig) -> bool:
    if config.fewer_if_equal:
        # against the best measured, not the last step: small losses must not add up
        return v >= state.top() * (1 - config.noise_margin)
    return v > state.value(state.kept) * (1 + config.noise_margin)


def _synergy(state: SizingState, config: AllocatorConfig):
    """Synergy 3.1: from the maximum, halve the range towards the fewest cores within
    ``synergy_within`` of the best throughput measured."""
    if state.phase == CONFIRM:
        return _confirm(state, config)
    lo, hi = state.lo, state.hi
    if state.phase == HALVING:
        if state.value(state.cores) >= (1 - config.synergy_within) * state.top():
            hi = state.cores
        else:
            lo = state.cores + 1
    if lo < hi:
        return _Step(HALVING, (lo + hi) // 2, {"lo": lo, "hi": hi})
    return _searched(replace(state, lo=lo, hi=hi), _synergy_answer(state, config))


def _synergy_answer(state: SizingState, config: AllocatorConfig) -> int:
    """The fewest measured cores within ``synergy_within`` of the best measured (within the bound)."""
    bar = (1 - config.synergy_within) * state.top()
    return min(c for c, v in state.within() if v >= bar)


# -- the plan's ceiling


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
        return _top(replace(state, phase=BISECT), config)
    if state.method == SYNERGY:
        if not within:
            return _probe(replace(state, phase=AT_MAX, lo=1, hi=state.bound, kept=None), state.bound)
        bar = (1 - config.synergy_within) * state.top()
        hi = min(c for c, v in within if v >= bar)
        lo = 1 + max((c for c, v in within if v < bar and c < hi), default=0)
        return _next(replace(state, phase=HALVING, lo=lo, hi=hi, kept=None, cores=hi), config)
    if not within:
        # nothing measured within: start again at the probe, cut to the ceiling
        cores = min(state.cores, state.bound)
        return _probe(replace(state, phase=START, kept=None, start=Start(cores, FROM_LIMIT)), cores)
    best = max(within, key=lambda p: (p[1], -p[0]))[0]
    # from the best point within: CODA again from there (measured points are not asked again)
    return _next(replace(state, phase=START, kept=None, cores=best, start=Start(best, FROM_LIMIT)), config)


# -- a job's sizing with its signal window

#: drift: a sized job's passive windows that must each measure it beyond the margin (and the
#: noise seen at rest), in the same direction and in a row, before it is searched again
DRIFT_WINDOWS = 3


@dataclass(frozen=True)
class Watch:
    """A sized job's passive measurement at its answer (drift, ours). ``reference``: the
    throughput there, the mean of the ``k`` passive windows that stayed within the band
    (with ``k`` 0, the search's own measurement, which only the first passive window replaces:
    the search chose the answer by its windows, and a window that came out high would make
    every later one look slow); ``n``/``m2``: the count and summed squared
    relative distance from the reference of the windows that turned out to be noise (those
    within the band, and strikes whose streak broke: a band that left them out would narrow
    itself); ``strikes``: windows in a row beyond the band, ``sign`` their direction (+1
    faster, -1 slower), ``pending`` their summed squared distance."""

    reference: float
    k: int = 0
    n: int = 0
    m2: float = 0.0
    strikes: int = 0
    sign: int = 0
    pending: float = 0.0

    def band(self, margin: float, error: float) -> float:
        """How far (a share of the reference) a window may be off before it counts: the
        margin, or the noise (the search's window error, the spread at rest) when wider."""
        at_rest = math.sqrt(self.m2 / self.n) if self.n else 0.0
        return max(margin, topsearch.Z * math.sqrt(2) * max(error, at_rest))

    def seen(self, mean: float, margin: float, error: float) -> "Watch":
        """The watch after a passive window measured ``mean``."""
        if self.k == 0:
            return Watch(mean, 1)
        off = mean / self.reference - 1
        if abs(off) <= self.band(margin, error):
            k = self.k + 1
            return Watch(self.reference + (mean - self.reference) / k, k, self.n + 1 + self.strikes,
                         self.m2 + off * off + self.pending)
        sign = 1 if off > 0 else -1
        if sign == self.sign:
            return replace(self, strikes=self.strikes + 1, pending=self.pending + off * off)
        # a streak the other way broke: its windows were noise
        return Watch(self.reference, self.k, self.n + self.strikes, self.m2 + self.pending, 1, sign, off * off)

    @property
    def drifted(self) -> bool:
        return self.strikes >= DRIFT_WINDOWS

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "k": self.k, "n": self.n, "m2": self.m2, "strikes": self.strikes,
                "sign": self.sign, "pending": self.pending}

    @classmethod
    def from_dict(cls, data: Any) -> "Watch":
        """Raises ValueError on any other shape."""
        keys = {"reference", "k", "n", "m2", "strikes", "sign", "pending"}
        if not isinstance(data, dict) or set(data) != keys:
            raise ValueError(f"a watch: expected {', '.join(sorted(keys))}")
        counts = [data[key] for key in ("k", "n", "strikes")]
        if not _positive(data["reference"]) or not all(type(c) is int and c >= 0 for c in counts) \
                or data["sign"] not in (-1, 0, 1) \
                or not all(_is_number(data[key]) and data[key] >= 0 for key in ("m2", "pending")):
            raise ValueError("a watch: a value out of its range")
        return cls(float(data["reference"]), data["k"], data["n"], float(data["m2"]), data["strikes"], data["sign"],
                   float(data["pending"]))


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
    if measured is None:
        return None, replace(sizing, window=window), None
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


def drifted(state: SizingState, config: AllocatorConfig) -> tuple[Probe | Sized, SizingState]:
    """Search a sized job again: from the top, its answer where the bisection looks first,
    nothing measured before kept (the job changed). Also when its labels or cgroup changed."""
    spec = JobSpec(state.job, state.max_cores, state.gpus, share=state.share, signal=_signal_of(state))
    return begin(spec, None, config, Start(min(state.cores, state.bound), FROM_DRIFT), state.ceiling)


def _signal_of(state: SizingState) -> str:
    return ITERATION_TIME if state.per_iteration else GPU_UTILISATION


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
