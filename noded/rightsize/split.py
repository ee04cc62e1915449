"""The exact split of a node's cores and memory between its GPU jobs (Synergy-OPT).

Each GPU job comes with its measured throughput over (cores, memory units): the
resource sensitivity matrix of Synergy (OSDI '22, Sec. 3.1). ``solve_split`` picks one
point per job to maximise the node's total normalised progress,

    sum over jobs of  T_j(c_j, m_j) / T_j(GPU-proportional share),

within the node's cores and memory, and never below any job's floor: each job makes at
least the progress of its GPU-proportional share (Sec. 4.1.1, constraint (5); Sec. 4.2,
"no job runs at a throughput lower than ... a GPU-proportional share"). Normalising by
that share makes a 2x faster ResNet worth the same as a 2x faster BERT, whatever their
samples per second.

Memory units are the data cache a job can use beyond its own process memory (MinIO's
cache in Synergy, Sec. 3.1); a job whose cache cannot be measured has a curve flat in
memory and, by the tie rule, gets none. A node without such a cache has 0 memory units.

The problem is Synergy-OPT's LP (1)-(5) for one machine, solved exactly in integers by a
dynamic programme (``split_kernels.best_split``); the paper's cluster-wide second LP
(Sec. 4.1.2) has no counterpart on one node.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from noded.rightsize import split_kernels


class SplitError(ValueError):
    """Inputs the split cannot be computed from; the message names the job."""


@dataclass(frozen=True, eq=False)
class JobCurve:
    """One GPU job's measured throughput (samples/s, or any rate: only ratios matter).

    ``throughput[c][m]`` is the rate with c cores and m memory units, for c in
    0..cores and m in 0..memory units of the node. NaN or -inf marks a point that was not
    measured, or that the job must not get; +inf and negative rates are errors.
    The array is copied, read-only, as float64.
    """

    job_id: Hashable
    gpus: int
    throughput: np.ndarray

    def __post_init__(self):
        try:
            hash(self.job_id)
        except TypeError:
            raise SplitError(f"job {self.job_id!r}: job_id must be hashable") from None
        name = _name(self.job_id)
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, numbers.Integral) or self.gpus < 1:
            raise SplitError(f"job {name}: gpus must be a whole number >= 1, got {self.gpus!r}")
        try:
            table = np.array(self.throughput, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise SplitError(f"job {name}: throughput must be numbers: {e}") from None
        if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 1:
            raise SplitError(f"job {name}: throughput must be a 2-D table [cores][memory units], "
                             f"got shape {table.shape}")
        bad = np.argwhere(table == np.inf)
        if bad.size:
            raise SplitError(f"job {name}: throughput at {_point(*bad[0])} is +inf")
        bad = np.argwhere((table < 0) & np.isfinite(table))
        if bad.size:
            raise SplitError(f"job {name}: throughput at {_point(*bad[0])} is negative "
                             f"({float(table[tuple(bad[0])])!r})")
        table.flags.writeable = False
        object.__setattr__(self, "gpus", int(self.gpus))
        object.__setattr__(self, "throughput", table)


@dataclass(frozen=True)
class Split:
    """Where the cores and memory of the node go.

    ``allocations``: job id -> (cores, memory units), in the order the curves were
    given; empty when ``feasible`` is False. ``objective``: the total normalised
    progress (the number of jobs when everyone gets just its share's progress; -inf
    when infeasible). ``reason``: what was decided, or which floors cannot be met and
    why. ``proportional``: each job's GPU-proportional share, the point its floor is
    measured at. ``progress``: each job's normalised progress at its allocation.
    """

    allocations: Mapping[Hashable, tuple[int, int]]
    objective: float
    feasible: bool
    reason: str
    proportional: Mapping[Hashable, tuple[int, int]] = field(default_factory=lambda: MappingProxyType({}))
    progress: Mapping[Hashable, float] = field(default_factory=lambda: MappingProxyType({}))


def proportional_share(gpus: int, node_gpus: int, cores: int, memory_units: int) -> tuple[int, int]:
    """Cores and memory units in proportion to the job's GPUs (Sec. 4.1.1: C_g = C/G * g_j),
    rounded down: then the shares of jobs asking for at most the node's GPUs always fit
    together, which is what makes the floors safe to promise (Sec. 4.2, "in the worst case
    all the running jobs ... could be allocated GPU-proportional share")."""
    return cores * gpus // node_gpus, memory_units * gpus // node_gpus


def normalised_progress(curves: Sequence[JobCurve], cores: int, memory_units: int, node_gpus: int):
    """What the kernel maximises: (progress[j, c, m] = T_j(c, m) / T_j(share), -inf where
    the point is unmeasured or below the job's floor; each job's share as (cores, memory)).
    Validates everything ``solve_split`` does, except what is available."""
    curves = list(curves)
    _check_whole("cores", cores, 0)
    _check_whole("memory_units", memory_units, 0)
    _check_whole("node_gpus", node_gpus, 1)
    seen = set()
    for curve in curves:
        if not isinstance(curve, JobCurve):
            raise SplitError(f"curves must be JobCurve, got {type(curve).__name__}")
        if curve.job_id in seen:
            raise SplitError(f"job {_name(curve.job_id)} appears more than once")
        seen.add(curve.job_id)
        want = (cores + 1, memory_units + 1)
        if curve.throughput.shape != want:
            raise SplitError(f"job {_name(curve.job_id)}: throughput has shape {curve.throughput.shape}; "
                             f"a node of {cores} cores and {memory_units} memory units needs {want} "
                             f"(0..{cores} cores, 0..{memory_units} memory units)")
    asked = sum(curve.gpus for curve in curves)
    if asked > node_gpus:
        each = ", ".join(f"{_name(c.job_id)}: {c.gpus}" for c in curves)
        raise SplitError(f"the jobs ask for {asked} GPUs together ({each}); the node has {node_gpus}")
    progress = np.full((len(curves), cores + 1, memory_units + 1), -np.inf)
    shares = []
    for j, curve in enumerate(curves):
        share = proportional_share(curve.gpus, node_gpus, cores, memory_units)
        floor = curve.throughput[share]
        if math.isnan(floor) or floor == -np.inf:
            raise SplitError(f"job {_name(curve.job_id)}: throughput at its GPU-proportional share, "
                             f"{_point(*share)}, is not measured; its floor is that throughput")
        if floor == 0:
            raise SplitError(f"job {_name(curve.job_id)}: throughput at its GPU-proportional share, "
                             f"{_point(*share)}, is 0; progress is measured relative to it")
        table = curve.throughput
        meets = np.isfinite(table) & (table >= floor)  # the floor, constraint (5)
        # x / floor is monotone, so a point at or above the floor is at or above 1.0.
        with np.errstate(over="ignore"):
            progress[j][meets] = table[meets] / floor
        if (progress[j] == np.inf).any():
            raise SplitError(f"job {_name(curve.job_id)}: throughput over its share's ({float(floor)!r}) overflows; "
                             f"give the rates in a unit closer to 1")
        shares.append(share)
    return progress, shares


def solve_split(curves: Sequence[JobCurve], cores: int, memory_units: int, node_gpus: int, *,
                available_cores: int | None = None, available_memory_units: int | None = None) -> Split:
    """The allocation of the node's cores and memory units that maximises total normalised
    progress while every job keeps at least its GPU-proportional progress.

    ``cores``, ``memory_units``, ``node_gpus``: the node's, which the shares are shares of
    and which each curve's table spans. ``available_cores``/``available_memory_units``
    (default: all of them): what this split may hand out, when part of the node is held
    for other work (CPU jobs, the system). The shares stay shares of the whole node, so
    with less available the floors may not all fit: then ``feasible`` is False and
    ``reason`` names each job and what its floor needs. A floor is never dropped.

    Among equally good allocations: the fewest cores in total, then the least memory,
    then the earlier job (in the order given) with fewer cores, then less memory.
    """
    curves = list(curves)
    progress, shares = normalised_progress(curves, cores, memory_units, node_gpus)
    avail_c = cores if available_cores is None else available_cores
    avail_m = memory_units if available_memory_units is None else available_memory_units
    _check_whole("available_cores", avail_c, 0, cores)
    _check_whole("available_memory_units", avail_m, 0, memory_units)
    ids = [curve.job_id for curve in curves]
    proportional = MappingProxyType(dict(zip(ids, shares)))
    alloc_c, alloc_m, objective = split_kernels.best_split(progress, int(avail_c), int(avail_m))
    if len(ids) and alloc_c[0] < 0:
        return Split(MappingProxyType({}), -math.inf, False, _why_infeasible(curves, progress, avail_c, avail_m),
                     proportional)
    allocations = {job: (int(c), int(m)) for job, c, m in zip(ids, alloc_c, alloc_m)}
    gains = {job: float(progress[j, alloc_c[j], alloc_m[j]]) for j, job in enumerate(ids)}
    above = sum(1 for job in ids if gains[job] > 1.0)
    reason = (f"optimal: {above} of {len(ids)} jobs above their GPU-proportional progress, total "
              f"{float(objective):.3f} (proportional: {len(ids)}); {int(alloc_c.sum())} of {avail_c} cores and "
              f"{int(alloc_m.sum())} of {avail_m} memory units handed out")
    return Split(MappingProxyType(allocations), float(objective), True, reason, proportional,
                 MappingProxyType(gains))


def _why_infeasible(curves, progress, avail_c: int, avail_m: int) -> str:
    """Each job's least cores and least memory that meet its floor within what is
    available (each on its own; a job may need more of one to get by with less of the
    other), and which part of the capacity they overrun."""
    head = f"the floors cannot all be met with {avail_c} cores and {avail_m} memory units available:"
    within = [np.argwhere(progress[j, :avail_c + 1, :avail_m + 1] > -np.inf) for j in range(len(curves))]
    beyond = [curve.job_id for curve, meets in zip(curves, within) if not meets.size]
    if beyond:
        return (f"{head} {'job ' if len(beyond) == 1 else 'jobs '}{', '.join(map(_name, beyond))} reach"
                f"{'es' if len(beyond) == 1 else ''} the GPU-proportional progress only with more than "
                f"{avail_c} cores or {avail_m} memory units")
    needs, total_c, total_m = [], 0, 0
    for curve, meets in zip(curves, within):
        least_c, least_m = int(meets[:, 0].min()), int(meets[:, 1].min())
        total_c, total_m = total_c + least_c, total_m + least_m
        needs.append(f"job {_name(curve.job_id)} needs >= {least_c} cores and >= {least_m} memory units")
    if total_c > avail_c or total_m > avail_m:
        tail = f"together >= {total_c} cores and >= {total_m} memory units"
    else:
        tail = "each fits on its own, but no combination meets every floor at once"
    return f"{head} {'; '.join(needs)}; {tail}"


def _check_whole(what: str, value, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (
            high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise SplitError(f"{what} must be a whole number {bound}, got {value!r}")


def _name(job_id) -> str:
    return repr(job_id)


def _point(c, m) -> str:
    return f"({int(c)} cores, {int(m)} memory units)"
