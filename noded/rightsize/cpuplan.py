"""The plan of every job's CPUs on a node: the one place that decides a job's cpuset.

Right-sizing (the allocator's probes and answers, an operator's pin), lending idle cores to
CPU jobs and contention core halving all want to write cpusets; ``plan`` takes what each of
them asks for in one frozen ``NodeView`` and says, per job, the CPUs it should have and why.
It reads nothing and writes nothing: the daemon turns the plan into cpuset writes (only the
difference from what the kernel shows).

**Two arrays (CODA Sec. V-C, Fig. 9).** The node's CPUs that noded's jobs may use are split
into a *GPU array*, the ``reserve`` highest CPU ids, kept for GPU jobs and sized from history
(``reserve_from_history``; CODA: "derived from historical statistical information"), and a
*CPU array*, the rest. Without a configured reserve the GPU array is ``cores_per_gpu`` times
the node's GPUs, by default the GPU-proportional share of every GPU: the whole node.

**GPU jobs** get their target (a probe's cores, the allocator's answer, an operator's pin;
``cores_per_gpu`` per GPU while they have none) from the GPU array, highest ids first, and
never share a CPU with any other GPU job. Jobs are placed in the order of their ids. A job
keeps the CPUs it has now (``current``, within the GPU array) where it can, so that one job
arriving or leaving does not move every other job's threads and caches; placed afresh in an
empty GPU array, a job gets a contiguous run. When the targets do not fit in the
GPU array the rest comes from the CPU array, from its top down, and a CPU job's last CPU of
its own is taken only when nothing else is left (GPU jobs have priority over CPU jobs, CODA
V-C). When they do not fit in the whole node, the target furthest above its GPU-proportional
share is cut first, one core at a time, so every job keeps its share whenever the shares fit.

**CPU jobs** keep their own CPUs (their cpuset as the scheduler gave it) within the CPU array.
A job whose source the operator lets borrow (``PlanConfig.lend_to``) also gets every GPU-array
CPU no GPU job has: what a slimmed GPU job gave up and idle reserve. Borrowers share those
cores (a cpuset, not an exclusive claim: the kernel time-shares them). Taking back is the same
rule applied to the next view: a GPU job that arrives, or whose allocator asks for more, gets
its CPUs in that plan, and the borrowers' sets no longer contain them (CODA aborted and
requeued the borrower, V-C; on a node the cpuset can only shrink). Given the GPU jobs'
``current`` CPUs, a CPU job's set before halving only ever shrinks when a GPU job arrives or
a target grows (unless a target has to be cut: then the cut job's CPUs may be freed).

A CPU job is never left without a CPU. When the GPU jobs need all of its CPU-array share,
it keeps that share (which then overlaps a GPU job: said in its reasons); when it has no CPU
in the CPU array at all, it keeps one of its own CPUs, the lowest no GPU job has if any.
Outside those two cases no CPU job is ever on a CPU a GPU job has.

**Contention halving composes**: a CPU job at throttle level L keeps
``kept_cpus(granted, L)`` of whatever it was granted above, lent CPUs included. Those are
its lowest ids, so the lent CPUs (the GPU array is at the top) are the first to go.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Mapping

from noded.rightsize.history import HistoryView
from noded.util.halving import kept_cpus
from noded.util.journal import words

if TYPE_CHECKING:
    from noded.rightsize.sizing import Probe, Sized

GPU = "gpu"
CPU = "cpu"

# how a GPU job's target came about (GpuJob.sizing)
PROBING = "probing"
SIZED = "sized"
PINNED = "pinned"
SIZINGS = (PROBING, SIZED, PINNED)

# reasons: why a job has the CPUs it has
RESERVE = "reserve"  # a GPU job without a target yet: cores_per_gpu per GPU
TRIMMED = "trimmed"  # a GPU job with fewer CPUs than its target: the node is short
BEYOND_RESERVE = "beyond the reserve"  # some of a GPU job's CPUs are in the CPU array
OWN = "own CPU-array share"
LENT = "lent from GPU array"
TAKEN_BACK = "taken back"  # a CPU job had CPUs now a GPU job's
KEPT_SHARE = "kept its CPU-array share"  # fallback: the GPU jobs need all of it
KEPT_ONE = "kept one of its own CPUs"  # fallback: it has none in the CPU array
HALVED = "halved for contention"
FALLBACKS = (KEPT_SHARE, KEPT_ONE)


class PlanError(ValueError):
    """A view no plan can satisfy, or a malformed one; the message names the job."""


_INT = frozenset({int})


def _cpu_set(values: Iterable[int], where: str) -> frozenset[int]:
    # every plan checks every job's CPUs, every tick: the check in C (map, min), not a
    # generator; a bool is no CPU id (its type is bool, not int)
    out = values if type(values) is frozenset else frozenset(values)
    if out and (not _INT.issuperset(map(type, out)) or min(out) < 0):
        raise PlanError(f"{where}: CPU ids must be whole numbers >= 0")
    return out


@dataclass(frozen=True)
class GpuJob:
    """A GPU job as the plan sees it. ``target``: the cores its sizing asks for (None: not
    yet asked); ``sizing``: PROBING, SIZED or PINNED with a target, None without;
    ``current``: the CPUs it has now, kept where they can be."""

    job: str
    gpus: int
    target: int | None = None
    sizing: str | None = None
    current: frozenset[int] = frozenset()

    def __post_init__(self):
        if not isinstance(self.job, str) or not self.job:
            raise PlanError(f"a job id must be a non-empty string, not {self.job!r:.40}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise PlanError(f"job {self.job}: gpus must be a whole number >= 1, not {self.gpus!r:.20}")
        if (self.target is None) != (self.sizing is None):
            raise PlanError(f"job {self.job}: a target comes with its sizing, and no sizing without one")
        if self.target is not None and (isinstance(self.target, bool) or not isinstance(self.target, int)
                                        or self.target < 1):
            raise PlanError(f"job {self.job}: target must be a whole number >= 1, not {self.target!r:.20}")
        if self.sizing is not None and self.sizing not in SIZINGS:
            raise PlanError(f"job {self.job}: sizing must be one of {SIZINGS}, not {self.sizing!r:.20}")
        object.__setattr__(self, "current", _cpu_set(self.current, f"job {self.job} current"))

    @classmethod
    def from_allocator(cls, job: str, gpus: int, out: "Probe | Sized | None",
                       current: Iterable[int] = ()) -> "GpuJob":
        """From the allocator's last request for the job: a Probe's cores are probing, a
        Sized's are sized (pinned when the operator pinned them); None: no target yet."""
        from noded.rightsize.sizing import PINNED as PINNED_REASON
        from noded.rightsize.sizing import Probe
        if out is None:
            return cls(job, gpus, None, None, frozenset(current))
        if isinstance(out, Probe):
            return cls(job, gpus, out.cores, PROBING, frozenset(current))
        return cls(job, gpus, out.cores, PINNED if out.reason == PINNED_REASON else SIZED, frozenset(current))


@dataclass(frozen=True)
class CpuJob:
    """A CPU job. ``own``: its cpuset as the scheduler gave it (what noded restores);
    ``level``: its contention throttle level (core halving); ``current``: the CPUs it has
    now, when known (only to say that some were taken back)."""

    job: str
    source: str
    own: frozenset[int]
    level: int = 0
    current: frozenset[int] | None = None

    def __post_init__(self):
        if not isinstance(self.job, str) or not self.job:
            raise PlanError(f"a job id must be a non-empty string, not {self.job!r:.40}")
        if not isinstance(self.source, str):
            raise PlanError(f"job {self.job}: source must be a string")
        own = _cpu_set(self.own, f"job {self.job} own")
        if not own:
            raise PlanError(f"job {self.job}: a CPU job has at least one CPU of its own")
        object.__setattr__(self, "own", own)
        if isinstance(self.level, bool) or not isinstance(self.level, int) or self.level < 0:
            raise PlanError(f"job {self.job}: level must be a whole number >= 0, not {self.level!r:.20}")
        if self.current is not None:
            object.__setattr__(self, "current", _cpu_set(self.current, f"job {self.job} current"))


@dataclass(frozen=True)
class NodeView:
    """What the plan is made from. ``cpus``: the CPU ids noded's jobs may use (not the
    system's); ``node_gpus``: the GPUs of the node (GPU-proportional shares are shares of
    ``cpus`` by GPU)."""

    cpus: tuple[int, ...]
    node_gpus: int
    gpu_jobs: tuple[GpuJob, ...] = ()
    cpu_jobs: tuple[CpuJob, ...] = ()

    def __post_init__(self):
        cpus = _cpu_set(self.cpus, "cpus")
        if not cpus:
            raise PlanError("the node has no CPU for noded's jobs")
        object.__setattr__(self, "cpus", tuple(sorted(cpus)))
        if isinstance(self.node_gpus, bool) or not isinstance(self.node_gpus, int) or self.node_gpus < 1:
            raise PlanError(f"node_gpus must be a whole number >= 1, not {self.node_gpus!r:.20}")
        object.__setattr__(self, "gpu_jobs", tuple(self.gpu_jobs))
        object.__setattr__(self, "cpu_jobs", tuple(self.cpu_jobs))
        ids = [j.job for j in (*self.gpu_jobs, *self.cpu_jobs)]
        if len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise PlanError(f"job ids appear more than once: {words(twice)}")
        asked = sum(j.gpus for j in self.gpu_jobs)
        if asked > self.node_gpus:
            raise PlanError(f"the GPU jobs hold {asked} GPUs together; the node has {self.node_gpus}")

    def share(self, gpus: int) -> int:
        """The GPU-proportional share of ``cpus`` for ``gpus`` GPUs (rounded down, at least 1)."""
        return max(1, len(self.cpus) * gpus // self.node_gpus)


@dataclass(frozen=True)
class PlanConfig:
    """``reserve_cores``: the GPU array (None: ``cores_per_gpu`` x the node's GPUs); capped
    at the node's CPUs. ``cores_per_gpu``: a GPU job's cores before it has a target (None:
    its GPU-proportional share). ``lend_to``: the sources whose CPU jobs may borrow."""

    reserve_cores: int | None = None
    cores_per_gpu: int | None = None
    lend_to: frozenset[str] = frozenset()

    def __post_init__(self):
        for name in ("reserve_cores", "cores_per_gpu"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0
                                      or (name == "cores_per_gpu" and value < 1)):
                raise PlanError(f"{name} must be a whole number >= {0 if name == 'reserve_cores' else 1}, "
                                f"not {value!r:.20}")
        if isinstance(self.lend_to, str):
            raise PlanError("lend_to is a set of sources, not one string")
        object.__setattr__(self, "lend_to", frozenset(self.lend_to))


@dataclass(frozen=True)
class JobCpus:
    """One job's CPUs. ``granted``: before contention halving (a GPU job's are its
    ``cpus``); ``reasons``: the constants above, most important first; ``note``: the same
    in words, with numbers."""

    job: str
    kind: str
    cpus: tuple[int, ...]
    granted: tuple[int, ...]
    reasons: tuple[str, ...]
    note: str

    @property
    def reason(self) -> str:
        return ", ".join(self.reasons)


@dataclass(frozen=True)
class CpuPlan:
    """Per job, its CPUs; and the arrays as they stand: ``lent`` the GPU-array CPUs given to
    borrowers, ``idle`` the GPU-array CPUs nobody has."""

    jobs: Mapping[str, JobCpus]
    reserve: int
    gpu_array: tuple[int, ...]
    cpu_array: tuple[int, ...]
    gpu_cpus: tuple[int, ...]
    lent: tuple[int, ...]
    idle: tuple[int, ...]

    def cpus_of(self, job: str) -> tuple[int, ...]:
        return self.jobs[job].cpus


def reserve_from_history(history: HistoryView, node_gpus: int, cpus: int, default_per_gpu: int) -> int:
    """The GPU array's size from what right-sizing found before (CODA V-C): the mean cores per
    GPU of every remembered answer (each owner's recent ones), rounded up, times the node's
    GPUs; ``default_per_gpu`` per GPU without history. At most ``cpus``."""
    answers = [c for recent in history.owners.values() for c in recent]
    per_gpu = math.ceil(sum(answers) / len(answers) - 1e-9) if answers else default_per_gpu
    return max(0, min(cpus, per_gpu * node_gpus))


def plan(view: NodeView, config: PlanConfig) -> CpuPlan:
    """Every job's CPUs for this view (see the module's docstring for the rules). Raises
    PlanError when there are more GPU jobs than CPUs (they cannot each have one of their own)."""
    cpus = view.cpus
    per_gpu = config.cores_per_gpu
    reserve, gpu_array, cpu_array = _arrays(view, config)
    in_cpu_array = frozenset(cpu_array)
    gpu_jobs = sorted(view.gpu_jobs, key=lambda j: j.job)
    cpu_jobs = sorted(view.cpu_jobs, key=lambda j: j.job)
    if len(gpu_jobs) > len(cpus):
        raise PlanError(f"{len(gpu_jobs)} GPU jobs cannot each have a CPU of their own on {len(cpus)} CPUs")

    asked = {j.job: min(len(cpus), j.target if j.target is not None else
                        (per_gpu * j.gpus if per_gpu else view.share(j.gpus))) for j in gpu_jobs}
    wants = _fit(asked, {j.job: view.share(j.gpus) for j in gpu_jobs}, len(cpus))
    placed = _place_gpu_jobs(gpu_jobs, cpu_jobs, wants, gpu_array, cpu_array)

    gpu_cpus = frozenset(c for mine in placed.values() for c in mine)
    lendable = tuple(c for c in gpu_array if c not in gpu_cpus)
    out: dict[str, JobCpus] = {}
    for j in gpu_jobs:
        out[j.job] = _gpu_job_cpus(j, tuple(sorted(placed[j.job])), wants[j.job], asked, len(cpus), reserve,
                                   in_cpu_array)
    lent_out: set[int] = set()
    for j in cpu_jobs:
        out[j.job] = _cpu_job_cpus(j, config, in_cpu_array, gpu_cpus, lendable)
        if LENT in out[j.job].reasons:
            lent_out.update(lendable)

    return CpuPlan(MappingProxyType(out), reserve, gpu_array, cpu_array, tuple(sorted(gpu_cpus)),
                   tuple(c for c in lendable if c in lent_out), tuple(c for c in lendable if c not in lent_out))


def _arrays(view: NodeView, config: PlanConfig) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The reserve's size, the GPU array (the node's last CPUs, that many) and the CPU array
    (the rest)."""
    cpus = view.cpus
    per_gpu = config.cores_per_gpu
    if config.reserve_cores is not None:
        reserve = min(len(cpus), config.reserve_cores)
    else:
        reserve = min(len(cpus), per_gpu * view.node_gpus) if per_gpu else len(cpus)
    return reserve, cpus[len(cpus) - reserve:], cpus[:len(cpus) - reserve]


def _place_gpu_jobs(gpu_jobs: list[GpuJob], cpu_jobs: list[CpuJob], wants: Mapping[str, int],
                    gpu_array: tuple[int, ...], cpu_array: tuple[int, ...]) -> dict[str, list[int]]:
    """Each GPU job's CPUs, ``wants`` of them: first what it has now within the GPU array;
    then the GPU array from the top, then the CPU array from the top, a CPU job's last CPU of
    its own in the CPU array only when nothing else is left."""
    in_gpu_array = frozenset(gpu_array)
    in_cpu_array = frozenset(cpu_array)
    last_own = {min(j.own & in_cpu_array) for j in cpu_jobs if j.own & in_cpu_array}
    order = ([*reversed(gpu_array)] + [c for c in reversed(cpu_array) if c not in last_own]
             + [c for c in reversed(cpu_array) if c in last_own])
    taken: set[int] = set()
    placed: dict[str, list[int]] = {}
    for j in gpu_jobs:  # first what each job has now, within the GPU array
        keep = sorted((j.current & in_gpu_array) - taken, reverse=True)[:wants[j.job]]
        placed[j.job] = keep
        taken.update(keep)
    free = iter([c for c in order if c not in taken])
    for j in gpu_jobs:
        while len(placed[j.job]) < wants[j.job]:
            c = next(free)
            placed[j.job].append(c)
            taken.add(c)
    return placed


def _gpu_job_cpus(j: GpuJob, mine: tuple[int, ...], wants: int, asked: Mapping[str, int], cpus: int, reserve: int,
                  in_cpu_array: frozenset[int]) -> JobCpus:
    """A GPU job's entry: its CPUs and why (its sizing, trimmed to fit, beyond the reserve)."""
    reasons = [j.sizing or RESERVE]
    words = [f"{len(mine)} CPUs, {j.sizing or RESERVE}" + (f" at {j.target}" if j.target else "")]
    if wants < asked[j.job]:
        reasons.append(TRIMMED)
        words.append(f"trimmed from {asked[j.job]}: the GPU jobs ask for {sum(asked.values())} of {cpus}")
    beyond = sum(1 for c in mine if c in in_cpu_array)
    if beyond:
        reasons.append(BEYOND_RESERVE)
        words.append(f"{beyond} beyond the reserve of {reserve}")
    return JobCpus(j.job, GPU, mine, mine, tuple(reasons), "; ".join(words))


def _cpu_job_cpus(j: CpuJob, config: PlanConfig, in_cpu_array: frozenset[int], gpu_cpus: frozenset[int],
                  lendable: tuple[int, ...]) -> JobCpus:
    """A CPU job's entry: its own CPUs in the CPU array the GPU jobs left, the GPU array's idle
    CPUs lent to it (``LENT``, its source willing), else what it keeps; halved for contention."""
    share = j.own & in_cpu_array
    granted = share - gpu_cpus
    reasons, words = [], []
    if granted:
        reasons.append(OWN)
        words.append(f"{len(granted)} of its own in the CPU array")
    if j.source in config.lend_to and lendable:
        granted = granted | frozenset(lendable)
        reasons.append(LENT)
        words.append(f"{len(lendable)} lent from the GPU array")
    if not granted:
        if share:
            granted = share
            reasons.append(KEPT_SHARE)
            words.append(f"kept its {len(share)} CPU-array CPUs: GPU jobs need all of them")
        else:
            spare = sorted(j.own - gpu_cpus)
            granted = frozenset([spare[0] if spare else min(j.own)])
            reasons.append(KEPT_ONE)
            words.append(f"kept CPU {min(granted)} of its own: it has none in the CPU array"
                         + ("" if spare else "; a GPU job has it too"))
    if j.current is not None and j.current & gpu_cpus:
        reasons.append(TAKEN_BACK)
        words.append(f"{len(j.current & gpu_cpus)} taken back for GPU jobs")
    granted_t = tuple(sorted(granted))
    mine = tuple(kept_cpus(list(granted_t), j.level)) if j.level else granted_t
    if j.level:
        reasons.append(HALVED)
        words.append(f"halved for contention, level {j.level}: {len(mine)} of {len(granted_t)}")
    return JobCpus(j.job, CPU, mine, granted_t, tuple(reasons), "; ".join(words))


def _fit(asked: Mapping[str, int], shares: Mapping[str, int], cpus: int) -> dict[str, int]:
    """The targets cut to fit ``cpus``: one core at a time from the job furthest above its
    share (then the largest target, then the later id), never below one core."""
    wants = dict(asked)
    over = sum(wants.values()) - cpus
    while over > 0:
        job = max((j for j in wants if wants[j] > 1), key=lambda j: (wants[j] - shares[j], wants[j], j))
        wants[job] -= 1
        over -= 1
    return wants
