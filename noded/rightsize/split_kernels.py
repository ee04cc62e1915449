"""numba kernel for the exact CPU/memory split between the GPU jobs of one node.

Synergy-OPT's single-machine problem (Synergy, OSDI '22, Sec. 4.1.1, LP (1)-(5) solved
as an integer program): pick one (cores, memory units) point per job from its table of
progress, maximise the sum, within the node's cores and memory. It is a multiple-choice
knapsack with two capacities, and with integer cores and memory units a dynamic
programme over (cores used, memory used) solves it exactly in
O(jobs x states x choices): 8 jobs x 1105 states x 1105 choices at most, on a
64-core, 16-unit node. The paper solves it with cvxpy (Sec. 4.3); a daemon cannot
wait for a solver, and does not need to.

The floors (constraint (5)) are the caller's: a point below a job's floor is simply
not a choice (-inf), so an infeasible floor shows as no allocation at all.

``split_reference.best_split`` is the plain-Python twin that tests use as the oracle;
it performs the same additions in the same order, so the two agree bit for bit.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def best_split(progress, cores, memory_units):
    """The allocation that maximises total progress.

    ``progress[j, c, m]``: job j's progress with c cores and m memory units; -inf or
    NaN where (c, m) is not a choice (unmeasured, or below the job's floor). The table
    may be larger than the capacity; only points with c <= ``cores`` and
    m <= ``memory_units`` are considered.

    Returns (cores per job, memory units per job, objective); every job at -1 and the
    objective -inf when no allocation gives every job one of its choices.

    Among allocations of equal objective: the fewest cores in total, then the least
    memory in total, then the earliest job with fewer cores, then with less memory
    (what stays unallocated is the node's, for work outside this split). Additions run
    from the last job to the first (job j's value + the best of jobs j+1..), which is
    what the references and the brute force do too.
    """
    n_jobs = progress.shape[0]
    if cores < 0 or memory_units < 0 or cores + 1 > progress.shape[1] or memory_units + 1 > progress.shape[2]:
        raise ValueError("capacity outside the progress table")
    nc = cores + 1
    nm = memory_units + 1
    # best[j, c, m]: the most progress jobs j.. can make using exactly c cores and m
    # memory units. Exactly, not at most: the tie rule on the totals needs them.
    best = np.full((n_jobs + 1, nc, nm), -np.inf)
    best[n_jobs, 0, 0] = 0.0
    # chosen[j, c, m]: job j's point on the best way to use exactly (c, m), as
    # cores * nm + memory; -1 where no way exists.
    chosen = np.full((n_jobs, nc, nm), -1, np.int64)
    choice_c = np.empty(nc * nm, np.int64)
    choice_m = np.empty(nc * nm, np.int64)
    choice_v = np.empty(nc * nm)
    for j in range(n_jobs - 1, -1, -1):
        # This job's choices in (cores, memory) order: the first of equal values wins,
        # which is the tie rule's "fewer cores, then less memory" for job j.
        n_choices = 0
        for a in range(nc):
            for b in range(nm):
                v = progress[j, a, b]
                if v > -np.inf:  # false for -inf and for NaN
                    choice_c[n_choices] = a
                    choice_m[n_choices] = b
                    choice_v[n_choices] = v
                    n_choices += 1
        for c in range(nc):
            for m in range(nm):
                top = -np.inf
                pick = -1
                for k in range(n_choices):
                    a = choice_c[k]
                    if a > c:
                        break  # sorted by cores: none further fits
                    b = choice_m[k]
                    if b > m:
                        continue
                    value = choice_v[k] + best[j + 1, c - a, m - b]
                    if value > top:
                        top = value
                        pick = k
                best[j, c, m] = top
                if pick >= 0:
                    chosen[j, c, m] = choice_c[pick] * nm + choice_m[pick]
    alloc_c = np.full(n_jobs, -1, np.int64)
    alloc_m = np.full(n_jobs, -1, np.int64)
    objective = -np.inf
    used_c = -1
    used_m = -1
    for c in range(nc):  # fewest cores, then least memory, among equal objectives
        for m in range(nm):
            if best[0, c, m] > objective:
                objective = best[0, c, m]
                used_c = c
                used_m = m
    if used_c < 0:
        return alloc_c, alloc_m, objective
    for j in range(n_jobs):
        point = chosen[j, used_c, used_m]
        alloc_c[j] = point // nm
        alloc_m[j] = point % nm
        used_c -= alloc_c[j]
        used_m -= alloc_m[j]
    return alloc_c, alloc_m, objective
