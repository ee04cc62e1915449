"""Plain-Python twins of the split kernel, for tests and the benchmark: slow and obvious.

* ``best_split``: the same dynamic programme as ``split_kernels.best_split``, in lists,
  with the same additions in the same order (so the results are equal bit for bit).
* ``brute_force_split``: every allocation that fits, for tiny cases; agrees with the
  dynamic programme whenever the sums are exact (small dyadic values, as the tests use).
* ``tune_split``: Synergy-TUNE (Synergy, OSDI '22, Sec. 4.2) on one machine, the
  paper's practical heuristic, to measure how far from the optimum it lands.

A progress table is ``progress[j][c][m]``: job j's progress with c cores and m memory
units; -inf or NaN where (c, m) is not a choice. Every function returns
(cores per job, memory units per job, objective), with -1s and -inf when nothing fits.
"""

from __future__ import annotations

import math

NOT_A_CHOICE = -math.inf


def is_choice(value: float) -> bool:
    return value > NOT_A_CHOICE  # false for -inf and for NaN


def objective_of(progress, alloc_c, alloc_m) -> float:
    """Total progress of one allocation, summed from the last job to the first, which is
    the order in which the dynamic programme adds (job j's value + the rest's)."""
    total = 0.0
    for j in reversed(range(len(progress))):
        total = progress[j][alloc_c[j]][alloc_m[j]] + total
    return total


def _nothing(n_jobs):
    return [-1] * n_jobs, [-1] * n_jobs, NOT_A_CHOICE


def best_split(progress, cores: int, memory_units: int):
    """Exact dynamic programme over (cores used, memory used), job by job from the last.

    ``best[j][c][m]`` is the most progress jobs j.. can make using exactly c cores and
    m memory units. Tie rule, as in the kernel: fewest cores in total, then least memory
    in total, then the earliest job with fewer cores, then less memory.
    """
    n = len(progress)
    best = [[[NOT_A_CHOICE] * (memory_units + 1) for _ in range(cores + 1)] for _ in range(n + 1)]
    best[n][0][0] = 0.0
    chosen = [[[None] * (memory_units + 1) for _ in range(cores + 1)] for _ in range(n)]
    for j in reversed(range(n)):
        for c in range(cores + 1):
            for m in range(memory_units + 1):
                for a in range(c + 1):  # in (cores, memory) order: the first of equals stays
                    for b in range(m + 1):
                        v = progress[j][a][b]
                        if not is_choice(v):
                            continue
                        value = v + best[j + 1][c - a][m - b]
                        if value > best[j][c][m]:
                            best[j][c][m] = value
                            chosen[j][c][m] = (a, b)
    objective, used = NOT_A_CHOICE, None
    for c in range(cores + 1):
        for m in range(memory_units + 1):
            if best[0][c][m] > objective:
                objective, used = best[0][c][m], (c, m)
    if used is None:
        return _nothing(n)
    alloc_c, alloc_m = [], []
    c, m = used
    for j in range(n):
        a, b = chosen[j][c][m]
        alloc_c.append(a)
        alloc_m.append(b)
        c, m = c - a, m - b
    return alloc_c, alloc_m, objective


def brute_force_split(progress, cores: int, memory_units: int):
    """Every allocation within the capacity, the best by the tie rule. Tiny cases only."""
    n = len(progress)
    choices = [[(a, b) for a in range(cores + 1) for b in range(memory_units + 1) if is_choice(table[a][b])]
               for table in progress]
    best_key, best_alloc = None, None

    def walk(j, left_c, left_m, picked):
        nonlocal best_key, best_alloc
        if j == n:
            alloc_c, alloc_m = [p[0] for p in picked], [p[1] for p in picked]
            total = objective_of(progress, alloc_c, alloc_m)
            key = (-total, sum(alloc_c), sum(alloc_m), [x for p in picked for x in p])
            if best_key is None or key < best_key:
                best_key, best_alloc = key, (alloc_c, alloc_m, total)
            return
        for a, b in choices[j]:
            if a <= left_c and b <= left_m:
                walk(j + 1, left_c - a, left_m - b, picked + [(a, b)])

    walk(0, cores, memory_units, [])
    return best_alloc if best_alloc is not None else _nothing(n)


def best_case_demand(table, saturation: float = 1.0):
    """The job's demand vector (Sec. 3.2): "the minimum value of CPU and memory that
    saturates the job throughput". Read here as: the fewest cores, then the least memory,
    among the points reaching ``saturation`` x the job's best progress (1.0: the peak
    itself). None when the table has no choice at all."""
    points = [(a, b) for a in range(len(table)) for b in range(len(table[a])) if is_choice(table[a][b])]
    if not points:
        return None
    peak = max(table[a][b] for a, b in points)
    return min((a, b) for a, b in points if table[a][b] >= saturation * peak)


def tune_split(progress, gpus, proportional, cores: int, memory_units: int, saturation: float = 1.0):
    """Synergy-TUNE (Sec. 4.2) with one server: the node.

    What the paper says, and what had to be read into it for one machine:

    * Each job asks for its best-case demand (``best_case_demand``, Sec. 3.2).
    * Jobs are packed in order of GPU demand, then CPU, then memory demand. The paper
      does not say which way; largest first here, as first-fit-decreasing packs, and
      the given order among equals.
    * A job that does not fit, with a demand above its GPU-proportional share, asks for
      that share instead (step 1). "Above" here: more in at least one of cores and
      memory, since a demand above in one and below in the other is not at or below
      the share either.
    * A job that still does not fit, or whose demand was at or below its share, makes
      room by switching jobs already placed above their share back to it (step 2a):
      "the job or a set of jobs ... [that] release just as much resources as required".
      Read here as: the one job whose switch alone is enough and frees the least (cores,
      then memory; the earliest placed among equals); if no single job is enough, jobs
      are switched from the last placed back until the job fits.
    * Nothing is handed out beyond the demands: the paper's TUNE leaves the rest free.

    Each job ends at its best-case demand or at its proportional share, so its floor
    holds (the share's progress is the floor). With the whole node available the shares
    always fit together, so TUNE always finds an allocation; with less, it may not, and
    returns nothing.
    """
    n = len(progress)
    demand = [best_case_demand(table, saturation) for table in progress]
    if any(d is None for d in demand):
        return _nothing(n)
    order = sorted(range(n), key=lambda j: (-gpus[j], -demand[j][0], -demand[j][1], j))
    alloc: dict[int, tuple[int, int]] = {}
    placed: list[int] = []
    free = [cores, memory_units]
    for j in order:
        want = demand[j]
        share = proportional[j]
        at_or_below_share = want[0] <= share[0] and want[1] <= share[1]
        if not _fits(want, free) and not at_or_below_share:
            want = share  # step 1
        if not _fits(want, free):  # step 2a
            _make_room(want, placed, alloc, proportional, free)
            if not _fits(want, free):
                return _nothing(n)  # only when less than the whole node is available
        alloc[j] = want
        placed.append(j)
        free[0] -= want[0]
        free[1] -= want[1]
    alloc_c = [alloc[j][0] for j in range(n)]
    alloc_m = [alloc[j][1] for j in range(n)]
    return alloc_c, alloc_m, objective_of(progress, alloc_c, alloc_m)


def _fits(want, free) -> bool:
    return want[0] <= free[0] and want[1] <= free[1]


def _switch_to_share(i, alloc, proportional, free) -> None:
    """Job ``i`` placed above its share goes back to it; what it held beyond is free again."""
    free[0] += alloc[i][0] - proportional[i][0]
    free[1] += alloc[i][1] - proportional[i][1]
    alloc[i] = proportional[i]


def _make_room(want, placed, alloc, proportional, free) -> None:
    """TUNE's step 2a: switch placed jobs above their share back to it until ``want`` fits:
    the one whose switch alone is enough and frees the least (cores, then memory; the
    earliest placed among equals), else from the last placed back. ``free`` may still be
    short after (less than the whole node available)."""
    above = [i for i in placed if alloc[i][0] > proportional[i][0] or alloc[i][1] > proportional[i][1]]
    released = {i: (alloc[i][0] - proportional[i][0], alloc[i][1] - proportional[i][1]) for i in above}
    alone = [i for i in above
             if want[0] <= free[0] + released[i][0] and want[1] <= free[1] + released[i][1]]
    if alone:
        _switch_to_share(min(alone, key=lambda i: (released[i], placed.index(i))), alloc, proportional, free)
        return
    for i in reversed(above):
        _switch_to_share(i, alloc, proportional, free)
        if _fits(want, free):
            return
