"""Admitting a GPU job onto a GPU beside others, when co-location predicts a speedup.

The decision is pure (``decide``): the job's profile, what each GPU already holds
(jobs admitted here, each with its profile; other work seen by NVML, counted by
its measured utilisation), the rule (ΣC of the GPU's jobs plus the new one under
the threshold, at most ``max_jobs_per_gpu``) and, where one was fitted, the
linear model's predicted speedup δ̂ ≥ 1. Placement is the thesis's Algorithm 2
(``kernels.place``) for one pending job. Every decision names the source of each
number it used (a profile file, an Nsight Compute export, or NVML).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..sample import Sample
from . import kernels
from .profiles import JobProfile


@dataclass(frozen=True)
class ColocationRule:
    threshold_c: float = 60.0  # ΣC (time-normalised, %) a GPU may hold
    max_jobs_per_gpu: int = 3
    coef: tuple[float, ...] | None = None  # fitted linear model of δ over kernels.features, or None
    #: MPS serves one user's clients at a time unless its daemon runs multi-user
    multi_user: bool = False


@dataclass(frozen=True)
class Reservation:
    job: str
    gpu_uuid: str
    profile: JobProfile
    batch_size: int
    uid: int | None = None  # the user the job runs as, where the caller said


@dataclass(frozen=True)
class GpuLoad:
    uuid: str
    index: int
    sum_c: float
    sum_m: float
    n_jobs: int
    sum_batch: float
    sources: tuple[str, ...]
    memory_total: int | None = None  # bytes
    uids: frozenset[int] = frozenset()  # users of the jobs admitted here


@dataclass(frozen=True)
class Decision:
    admit: bool
    job: str
    gpu_uuid: str | None
    gpu_index: int | None
    predicted_speedup: float | None
    reason: str
    env: dict[str, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    sum_c_after: float | None = None
    n_jobs_after: int | None = None


def gpu_loads(sample: Sample, reservations: list[Reservation]) -> list[GpuLoad]:
    """What each readable GPU holds: admitted jobs by profile, other work by NVML."""
    loads = []
    for g in sample.gpus:
        if g.lost or g.uuid is None:
            continue
        mine = [r for r in reservations if r.gpu_uuid == g.uuid]
        c = sum(r.profile.c_norm for r in mine)
        m = sum(r.profile.m_norm for r in mine)
        n = len(mine)
        sources = [r.profile.source for r in mine]
        others = [p for p in g.processes if not p.mps_server]
        if len(others) > len(mine):
            # Work noded did not admit: its measured utilisation stands in for C and M.
            c += float(g.util_gpu or 0)
            m += float(g.util_memory or 0)
            n += len(others) - len(mine)
            sources.append("nvml")
        loads.append(GpuLoad(g.uuid, g.index, c, m, n, float(sum(r.batch_size for r in mine)), tuple(sources),
                             g.memory_total, frozenset(r.uid for r in mine if r.uid is not None)))
    return loads


def decide(job: str, profile: JobProfile, batch_size: int, loads: list[GpuLoad], rule: ColocationRule,
           gpu: str = "auto", *, pipe_dir: str | None = None, uid: int | None = None) -> Decision:
    pool = [l for l in loads if gpu in ("auto", l.uuid)]
    if not pool:
        return Decision(False, job, None, None, None,
                        f"no such GPU {gpu!r}" if gpu != "auto" else "no GPU can be read on this node")
    if not rule.multi_user and uid is not None:
        # One user's MPS server per GPU: another user's jobs there rule the GPU out.
        others = [l for l in pool if l.uids - {uid}]
        pool = [l for l in pool if not (l.uids - {uid})]
        if not pool:
            return Decision(False, job, None, None, None,
                            f"GPU(s) {', '.join(str(l.index) for l in others)} serve another user's MPS clients "
                            "(MPS is not multi-user here)")
    coef = np.array(rule.coef, dtype=np.float64) if rule.coef else np.full(kernels.N_FEATURES, np.nan)
    assign, delta = kernels.place(
        np.array([profile.c_norm]), np.array([profile.m_norm]), np.array([float(batch_size)]),
        np.array([l.sum_c for l in pool]), np.array([l.sum_m for l in pool]),
        np.array([l.n_jobs for l in pool], dtype=np.int64), np.array([l.sum_batch for l in pool]),
        rule.max_jobs_per_gpu, rule.threshold_c, coef)
    target = min(pool, key=lambda l: (l.sum_c, pool.index(l)))
    sources = (profile.source,) + target.sources
    if assign[0] < 0:
        full = all(l.n_jobs >= rule.max_jobs_per_gpu for l in pool)
        after = target.sum_c + profile.c_norm
        if full:
            why = f"every GPU already holds {rule.max_jobs_per_gpu} jobs"
        elif after > rule.threshold_c:
            why = (f"ΣC on the least loaded GPU ({target.index}) would be {after:.1f} > threshold "
                   f"{rule.threshold_c:g}")
        else:
            d = kernels.predict_speedup(coef, after, target.sum_m + profile.m_norm, target.n_jobs + 1.0,
                                        target.sum_batch + batch_size)
            why = f"the speedup model predicts a slowdown (δ̂ = {d:.2f} < 1) on GPU {target.index}"
        return Decision(False, job, None, None, None, why, sources=sources)
    chosen = pool[int(assign[0])]
    n_after = chosen.n_jobs + 1
    d = None if math.isnan(delta[0]) else float(delta[0])
    if chosen.n_jobs == 0:
        why = f"GPU {chosen.index} is free"
    else:
        why = (f"ΣC on GPU {chosen.index} becomes {chosen.sum_c + profile.c_norm:.1f} <= {rule.threshold_c:g} with "
               f"{n_after} jobs" + (f"; predicted speedup δ̂ = {d:.2f}" if d is not None else ""))
    env = {"CUDA_VISIBLE_DEVICES": chosen.uuid,
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(10, 100 // n_after)),
           "NODED_JOB": job}  # for noded.colocation.client.report_iteration
    if chosen.memory_total:
        # An equal share of device memory per possible client, so a late-comer always fits;
        # device 0 is the one CUDA_VISIBLE_DEVICES leaves visible.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={chosen.memory_total // rule.max_jobs_per_gpu >> 20}M"
    if pipe_dir:
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
    return Decision(True, job, chosen.uuid, chosen.index, d, why, env, sources,
                    chosen.sum_c + profile.c_norm, n_after)
