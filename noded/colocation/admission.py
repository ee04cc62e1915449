"""Admitting a GPU job onto a GPU beside others, when co-location predicts a speedup.

The decision is pure (``decide``): the job's profile, what each GPU already holds
(jobs admitted here, each with its profile; other work seen by NVML, counted by
its measured utilisation) and the rule. Placement is the thesis's Algorithm 2
(``kernels.place_explained``) for one pending job: onto the GPU with the lowest ΣC
among those with fewer than ``max_jobs_per_gpu`` jobs, where the fitted linear
model's predicted speedup δ̂ is at least 1, or, only while no model is fitted, where
ΣC stays within ``threshold_c``. The reason given is the kernel's own (its cause,
its GPU), and every decision names the source of each number it used (a profile
file, an Nsight Compute export, or NVML).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from noded.samplers.sample import Sample
from noded.colocation import kernels
from noded.colocation.profiles import JobProfile


@dataclass(frozen=True)
class ColocationRule:
    threshold_c: float = 60.0  # ΣC (time-normalised, %) a GPU may hold
    max_jobs_per_gpu: int = 3
    #: the fitted linear model of δ over kernels.features: where set, it decides (δ̂ >= 1)
    #: and threshold_c is not used; None: the ΣC rule decides
    coef: tuple[float, ...] | None = None
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
    #: a refusal's kind, a word a program reads (the reason is for people): not-sampled,
    #: mps-not-ready, no-profile, already-admitted, no-gpu, other-user, full, over-threshold,
    #: slowdown, not-finite, not-placed
    refusal: str | None = None


#: refusals that pass without anything done about the job (noded's first sample, MPS up):
#: a job manager's hook may ask again in a moment
TRANSIENT_REFUSALS = frozenset({"not-sampled", "mps-not-ready"})


def pinned_mem_limit(memory_total: int, max_jobs_per_gpu: int) -> str:
    """An equal share of a device's memory per job it may hold, as MPS writes it ("27306M")."""
    return f"{memory_total // max_jobs_per_gpu >> 20}M"


def gpu_loads(sample: Sample, reservations: list[Reservation]) -> list[GpuLoad]:
    """What each readable GPU holds: admitted jobs by profile, other work by NVML."""
    loads = []
    for g in sample.gpus:
        if g.lost or g.uuid is None:
            continue
        mine = [r for r in reservations if r.gpu_uuid == g.uuid]
        c = sum((r.profile.c_norm for r in mine), 0.0)
        m = sum((r.profile.m_norm for r in mine), 0.0)
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


#: the placement kernel's causes as refusals
CAUSE_REFUSALS = {kernels.NO_FREE_SLOT: "full", kernels.OVER_THRESHOLD: "over-threshold",
                  kernels.SLOWDOWN: "slowdown", kernels.NOT_FINITE: "not-finite"}


def _floats(values: list) -> np.ndarray:
    return np.array(values, dtype=np.float64)


def decide(job: str, profile: JobProfile, batch_size: int, loads: list[GpuLoad], rule: ColocationRule,
           gpu: str = "auto", *, pipe_dir: str | None = None, uid: int | None = None) -> Decision:
    pool = [l for l in loads if gpu in ("auto", l.uuid)]
    if not pool:
        return Decision(False, job, None, None, None,
                        f"no such GPU {gpu!r}" if gpu != "auto" else "no GPU can be read on this node",
                        refusal="no-gpu")
    if not rule.multi_user and uid is not None:
        # One user's MPS server per GPU: another user's jobs there rule the GPU out.
        others = [l for l in pool if l.uids - {uid}]
        pool = [l for l in pool if not (l.uids - {uid})]
        if not pool:
            return Decision(False, job, None, None, None,
                            f"GPU(s) {', '.join(str(l.index) for l in others)} serve another user's MPS clients "
                            "(MPS is not multi-user here)", refusal="other-user")
    fitted = rule.coef is not None
    coef = np.array(rule.coef, dtype=np.float64) if fitted else np.full(kernels.N_FEATURES, np.nan)
    # Every argument of the one type kernels.warm_up compiled at start: any other (an empty
    # GPU's ΣC of int 0 made an int64 array, a threshold of 60 from YAML an int) is a new
    # signature, compiled in this request, seconds of CPU before the Prolog has its answer.
    assign, delta, why, where = kernels.place_explained(
        _floats([profile.c_norm]), _floats([profile.m_norm]), _floats([batch_size]),
        _floats([l.sum_c for l in pool]), _floats([l.sum_m for l in pool]),
        np.array([l.n_jobs for l in pool], dtype=np.int64), _floats([l.sum_batch for l in pool]),
        int(rule.max_jobs_per_gpu), float(rule.threshold_c), coef)
    # The reason is the kernel's own: its cause, on the GPU it chose.
    cause = int(why[0])
    at = pool[int(where[0])] if where[0] >= 0 else None
    d = None if math.isnan(delta[0]) else float(delta[0])
    sources = (profile.source,) + (at.sources if at else ())
    if cause != kernels.PLACED:
        return Decision(False, job, None, None, d, _refusal_text(cause, pool, gpu, at, profile, rule, d),
                        sources=sources, refusal=CAUSE_REFUSALS.get(cause, "not-placed"))
    return _admitted(job, profile, pool[int(assign[0])], rule, d, fitted, sources, pipe_dir)


def _refusal_text(cause: int, pool: list[GpuLoad], gpu: str, at: GpuLoad | None, profile: JobProfile,
                  rule: ColocationRule, d: float | None) -> str:
    """Why the placement kernel refused, in its own cause's words, on the GPU it chose."""
    if cause == kernels.NO_FREE_SLOT:
        return (f"every GPU already holds {rule.max_jobs_per_gpu} jobs" if len(pool) > 1 or gpu == "auto"
                else f"GPU {pool[0].index} already holds {rule.max_jobs_per_gpu} jobs")
    if cause == kernels.OVER_THRESHOLD:
        return (f"ΣC on GPU {at.index} (the least loaded with a free slot) would be "
                f"{at.sum_c + profile.c_norm:.1f} > threshold {rule.threshold_c:g}")
    if cause == kernels.SLOWDOWN:
        return (f"the fitted speedup model predicts a slowdown on GPU {at.index} (the least loaded with a "
                f"free slot): δ̂ = {d:.2f} < 1 with {at.n_jobs + 1} jobs, ΣC {at.sum_c + profile.c_norm:.1f}")
    if cause == kernels.NOT_FINITE:
        return "a number in the profile, the GPU loads or the model is not finite"
    return f"not placed (kernel reason {cause})"


def _admitted(job: str, profile: JobProfile, chosen: GpuLoad, rule: ColocationRule, d: float | None, fitted: bool,
              sources: tuple, pipe_dir: str | None) -> Decision:
    """The job admitted on ``chosen``: why, and the environment its processes start with."""
    n_after = chosen.n_jobs + 1
    if chosen.n_jobs == 0:
        why_text = f"GPU {chosen.index} is free"
    elif fitted:
        why_text = (f"the fitted speedup model predicts δ̂ = {d:.2f} >= 1 on GPU {chosen.index} with {n_after} jobs, "
                    f"ΣC {chosen.sum_c + profile.c_norm:.1f}")
    else:
        why_text = (f"ΣC on GPU {chosen.index} becomes {chosen.sum_c + profile.c_norm:.1f} <= {rule.threshold_c:g} "
                    f"with {n_after} jobs (no speedup model fitted)")
    env = {"CUDA_VISIBLE_DEVICES": chosen.uuid,
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(10, 100 // n_after)),
           "NODED_JOB": job}  # for noded.colocation.client.report_iteration
    if chosen.memory_total:
        # An equal share of device memory per possible client, so a late-comer always fits;
        # device 0 is the one CUDA_VISIBLE_DEVICES leaves visible.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={pinned_mem_limit(chosen.memory_total, rule.max_jobs_per_gpu)}"
    if pipe_dir:
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
    return Decision(True, job, chosen.uuid, chosen.index, d, why_text, env, sources,
                    chosen.sum_c + profile.c_norm, n_after)
