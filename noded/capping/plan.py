"""Which CPU job is held at which cap, and why: the one place that decides (issue #27).

A cap comes from one of three sources, the first that applies winning:

* ``override``: an operator's `nodectl cap` (the operator's word wins over everything, as
  every override does);
* ``source default``: ``jobs.sources[i].cap_gbps`` for every CPU job of that source kind;
* ``reserve``: while a GPU job runs and ``contention.gpu_reserve_gbps`` is set, the CPU
  jobs share what the node's peak leaves once the reserve and the GPU jobs' own bandwidth
  are set aside. Shared by water-filling: one cap ``L`` for all, so that the jobs' demands,
  each taken up to ``L``, add up to what is left; a job using less than an equal share
  keeps what it uses, the heavy ones split the rest equally. Equal, not in proportion to
  demand, so that a hog is not rewarded for being a hog. Where a source default is lower
  than ``L`` it is the job's cap (and its source).

A capped job's measured bandwidth says nothing of what it would use uncapped: a job at
``SATURATED`` (half) of its cap or above counts as wanting without bound, so a reserve's caps are
not lifted the tick after they bite (and put back the tick after that). Jobs noded may not
cap (exempt, held at a level by an operator, of unknown kind) are not capped, and what
they move is set aside from what the capped jobs share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from noded.sample import CPU, GPU, JobSample

OVERRIDE, SOURCE, RESERVE = "override", "source default", "reserve"
#: a reserve never holds a job below this (MBA's lowest value passes more than nothing,
#: and a job held at nothing is a job stopped, which is not the reserve's to decide)
MIN_RESERVE_CAP_BPS = 0.25e9
#: a job at this share of its cap or above is taken to want more than its cap: well below
#: 1, since a tick's reading mixes periods before and after the cap bit, and a holder
#: steering between two MB values dips below its cap for a period now and then; a job
#: using less than half its cap is plainly not held by it
SATURATED = 0.5


@dataclass(frozen=True)
class Cap:
    bps: float
    source: str  # OVERRIDE | SOURCE | RESERVE
    why: str


def reserve_share(demands: Mapping[str, float | None], budget_bps: float) -> float | None:
    """The water level ``L`` with ``sum(min(d, L)) == budget_bps``; None where every demand
    fits (no cap needed). A demand of None wants without bound."""
    if not demands:
        return None
    known = sorted(d for d in demands.values() if d is not None)
    if len(known) == len(demands) and sum(known) <= budget_bps:
        return None
    left, n = max(0.0, budget_bps), len(demands)
    for d in known:
        if d * n > left:
            break  # it and every job after it want more than an equal share of what is left
        left, n = left - d, n - 1
    return left / n


def _demand(js: JobSample, held: float | None, source_cap: float | None) -> float | None:
    bw = js.bandwidth_bps
    if bw is None or (held is not None and bw >= SATURATED * held):
        return source_cap  # unknown, or capped now: as much as it may have
    return bw if source_cap is None else min(bw, source_cap)


def plan_caps(jobs: Mapping[str, JobSample], override_caps: Mapping[str, float], level_owned: frozenset[str],
              source_caps: Mapping[str, float], reserve_bps: float | None, peak_total_bps: float | None,
              held: Mapping[str, float]) -> dict[str, Cap]:
    """Every job's cap, with its source. ``override_caps``: operators' caps (bytes/s);
    ``level_owned``: jobs an operator holds at a level or exempts (never capped here);
    ``source_caps``: source kind -> bytes/s; ``held``: each job's cap in force now."""
    caps: dict[str, Cap] = {}
    pool: dict[str, JobSample] = {}
    set_aside = 0.0  # what the jobs that are not shared out move
    for job, js in jobs.items():
        if js.kind == CPU and job in override_caps:
            caps[job] = Cap(override_caps[job], OVERRIDE, "an operator's cap (nodectl cap)")
            set_aside += override_caps[job]
        elif js.kind == CPU and not js.meta.exempt and job not in level_owned:
            pool[job] = js
            if js.source in source_caps:
                caps[job] = Cap(source_caps[js.source], SOURCE, f"the default cap of {js.source} jobs "
                                                                 "(jobs.sources[].cap_gbps)")
        else:
            set_aside += js.bandwidth_bps or 0.0
    gpu_jobs = [js for js in jobs.values() if js.kind == GPU]
    if reserve_bps is None or not gpu_jobs or peak_total_bps is None or not pool:
        return caps
    budget = peak_total_bps - reserve_bps - set_aside
    level = reserve_share({j: _demand(js, held.get(j), source_caps.get(js.source)) for j, js in pool.items()},
                          budget)
    if level is None:
        return caps
    level = max(level, MIN_RESERVE_CAP_BPS)
    why = (f"the GPU reserve: {peak_total_bps / 1e9:.3g} GB/s of peak - {reserve_bps / 1e9:.3g} GB/s kept for "
           f"GPU jobs - {set_aside / 1e9:.3g} GB/s of GPU and uncapped jobs, shared equally between "
           f"{len(pool)} CPU job{'s' * (len(pool) > 1)} (contention.gpu_reserve_gbps)")
    for job in pool:
        if job not in caps or caps[job].bps > level:
            caps[job] = Cap(level, RESERVE, why)
    return caps
