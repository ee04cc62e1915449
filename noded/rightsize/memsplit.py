"""How much data cache each GPU job gets, and the soft memory limit that says so.

Synergy splits a server's memory with its CPUs (OSDI '22, Sec. 3.1, 4.1): a job's cache
is MinIO's, which hits a fixed share of the dataset each epoch, so its throughput at any
cache size follows from two numbers (``curves.CacheCurve``): the dataset size and the
throughput with nothing cached. Synergy profiles the second offline; here the job's owner
declares both as labels (``dataset_gb``, ``uncached_share``): a page cache is not MinIO's,
and noded cannot measure a job's throughput at a cache size it cannot set. A job without
them has a curve flat in memory, gets no cache memory, and no limit.

The cores are CODA's allocator's and the node plan's (``cpuplan``); the memory is split
exactly, for the cores the jobs have, by the same Synergy-OPT solver as the cores
(``split.solve_split``) over a table with one row: with cores fixed, a job's normalised
progress at m memory units is its cache curve's share at m over its share at its
GPU-proportional memory, whatever its core count. The floor holds: no job gets less cache
than the progress of its GPU-proportional share needs.

The split is carried out as a soft limit (``memory.high`` on cgroup v2, the v1
``memory.soft_limit_in_bytes``): never a hard limit, which can OOM-kill a job. A soft limit
caps a job at its process memory (anonymous memory, measured each tick) plus its cache
share plus a headroom, rounded up to ``QUANTUM``: the kernel then reclaims the job's page
cache above its share first. On v1 the soft limit acts only under memory pressure; on v2
``memory.high`` reclaims (and, for anonymous memory above it, throttles, never kills)
always, which is why the limit follows the process memory with a headroom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from noded.rightsize.memquantum import QUANTUM  # noqa: F401 (re-exported)
from noded.rightsize.curves import CacheCurve
from noded.rightsize.split import JobCurve, SplitError, normalised_progress, proportional_share, solve_split

GIB = 1 << 30
#: the most a job's declared curve may promise over its GPU-proportional share's throughput
#: (1 / uncached_share at most): more would make its gains drown every other job's in the sum
MAX_GAIN = 1e6


@dataclass(frozen=True)
class CacheJob:
    """One sized GPU job as the memory split sees it (``curve`` None: no declared cache)."""

    job: str
    gpus: int
    curve: CacheCurve | None


@dataclass(frozen=True)
class MemorySplit:
    """Memory units per job (jobs with a declared cache only), each job's GPU-proportional
    units, and what was decided (or why nothing could be)."""

    units: Mapping[str, int]
    proportional: Mapping[str, int]
    unit_bytes: int
    reason: str
    #: jobs whose declared curve cannot be split (job -> why): given no cache and no limit,
    #: while every other job is split as if they declared none
    refused: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def cache_curve(dataset_gb: float | None, uncached_share: float | None) -> CacheCurve | None:
    """A job's cache curve from its labels (None without them)."""
    if dataset_gb is None or uncached_share is None:
        return None
    return CacheCurve(dataset_gb=float(dataset_gb), process_gb=0.0, uncached_share=float(uncached_share))


def _job_curve(j: CacheJob, node_gpus: int, units: int, unit_gb: float) -> JobCurve:
    """One job's row of the table, checked alone. Raises SplitError: its labels give a curve
    the split cannot take (no throughput at its share, or gains no float can hold)."""
    assert j.curve is not None
    curve = JobCurve(j.job, j.gpus, np.array([[j.curve.share(m * unit_gb) for m in range(units + 1)]]))
    if curve.throughput[0, proportional_share(j.gpus, node_gpus, 0, units)[1]] == 0:
        raise SplitError(f"job {j.job}: its cache curve gives no throughput at its GPU-proportional memory")
    progress, _ = normalised_progress([curve], 0, units, node_gpus)  # raises where it overflows
    # the objective sums every job's progress: one job's gains must not drown the others'
    finite = progress[0][np.isfinite(progress[0])]
    if finite.size and finite.max() > MAX_GAIN:
        raise SplitError(f"job {j.job}: its cache curve promises {finite.max():.3g} times its share's throughput "
                         f"(uncached_share {j.curve.uncached_share:g}); at most {MAX_GAIN:g} is taken")
    return curve


def split_memory(jobs: Sequence[CacheJob], node_gpus: int, units: int, cache_gb: float) -> MemorySplit:
    """The exact split of ``cache_gb`` (in ``units`` equal units) between the jobs with a
    declared cache curve. A job whose declared curve cannot be split is refused alone
    (``refused``), never the others with it. Raises SplitError when the jobs ask for more
    GPUs than the node's (the shares would not be shares)."""
    unit_gb = cache_gb / units
    unit_bytes = int(unit_gb * GIB)
    # every job holds GPUs, so shares count all of them, cached or not
    node_gpus = max(node_gpus, sum(j.gpus for j in jobs))
    curves, refused = [], {}
    for j in jobs:
        if j.curve is None:
            continue
        try:
            curves.append(_job_curve(j, node_gpus, units, unit_gb))
        except SplitError as e:
            refused[j.job] = str(e)
    why_refused = "".join(f"; refused, given no cache: {r}" for _, r in sorted(refused.items()))
    if not curves:
        return MemorySplit(MappingProxyType({}), MappingProxyType({}), unit_bytes,
                           ("no sized job declares a cache curve (labels dataset_gb, uncached_share)"
                            if not refused else "no sized job's cache curve can be split") + why_refused,
                           MappingProxyType(refused))
    out = solve_split(curves, 0, units, node_gpus)
    if not out.feasible:  # cannot happen with shares rounded down; said rather than assumed
        raise SplitError(out.reason)
    return MemorySplit(MappingProxyType({j: int(m) for j, (_, m) in out.allocations.items()}),
                       MappingProxyType({j: int(m) for j, (_, m) in out.proportional.items()}),
                       unit_bytes, out.reason + why_refused, MappingProxyType(refused))


def soft_limit_bytes(anon_bytes: int, units: int, unit_bytes: int, headroom_bytes: int) -> int:
    """The soft limit for a job: its process memory, its cache share and a headroom,
    rounded up to ``QUANTUM``."""
    want = max(0, anon_bytes) + units * unit_bytes + headroom_bytes
    return max(QUANTUM, math.ceil(want / QUANTUM) * QUANTUM)
