"""Below MBA's lowest value: a capped job held on fewer cores (issue #27, item 3).

MBA's lowest value still passes bandwidth (10 % of a core's requests on Intel, a quarter
of a core's bandwidth on some parts: sim/nodesim/resctrl_emulator/mba.py), and it passes it per busy
thread, so a job with many threads can move more at the lowest value than its cap allows.
The one lever left is the number of threads that run at once: the job's CPUs, halved as
core halving halves them (``kept_cpus``: the first ``max(1, n >> level)``), one halving at
a time. The CPUs are written by the one owner of every job's CPUs (``CpuSetOwner``: the
original recorded durably before the first write, restored when the wish goes, at stop
and at the next start after a crash); this module only decides the level.

* **Halve** once the holder has found the lowest value above the cap for
  ``UNREACHABLE_S`` (a few of its periods: not one noisy reading) and the last change of
  the job's CPUs is ``SETTLE_S`` old (its effect measured).
* **Undo a halving** once what the lowest value lets the job move now, times the CPUs
  the job would get back, is at most ``RELEASE_SHARE`` of the cap: MBA alone then holds
  the cap with room to spare (demand fell, or the cap rose). Well below the halving's
  condition (the cap itself), so a job near the edge is not halved and restored in turn.
* **Restore** (level 0) when the cap ends: no wish, the owner puts the originals back.
"""

from __future__ import annotations

from dataclasses import dataclass

from noded.util.halving import max_level

#: the lowest value above the cap for this long (5 holder periods) before a halving
UNREACHABLE_S = 0.5
#: a change of the job's CPUs measured this long before the next
SETTLE_S = 1.0
#: a halving is undone once the lowest MB value would pass at most this share of the cap
RELEASE_SHARE = 0.8


@dataclass(frozen=True)
class CoreStep:
    level: int  # halvings of the job's CPUs (0: its own)
    why: str | None = None  # the change, in words (None: no change)


def kept(ncpus: int, level: int) -> int:
    """How many of ``ncpus`` CPUs a level leaves (``kept_cpus``)."""
    return max(1, ncpus >> level)


def next_level(level: int, ncpus: int, cap_bps: float, *, unreachable_for_s: float | None,
               lowest_bound_bps: float | None, since_change_s: float | None) -> CoreStep:
    """The job's core level after this tick. ``unreachable_for_s``: how long the lowest
    MB value has passed more than the cap (None: it has not); ``lowest_bound_bps``: at most
    what the lowest value lets the job move on its CPUs now (None: not measured yet);
    ``since_change_s``: since its CPUs last changed (None: never)."""
    settled = since_change_s is None or since_change_s >= SETTLE_S
    if not settled:
        return CoreStep(level)
    top = max_level(ncpus)
    if unreachable_for_s is not None and unreachable_for_s >= UNREACHABLE_S and level < top:
        return CoreStep(level + 1, f"MBA's lowest value passes more than the cap on {kept(ncpus, level)} of {ncpus} "
                                   f"CPUs: {kept(ncpus, level + 1)} of them")
    if level > 0 and unreachable_for_s is None and lowest_bound_bps is not None:
        back = lowest_bound_bps * kept(ncpus, level - 1) / kept(ncpus, level)
        if back <= RELEASE_SHARE * cap_bps:
            return CoreStep(level - 1, f"MBA's lowest value would pass at most {back / 1e9:.3g} GB/s on "
                                       f"{kept(ncpus, level - 1)} CPUs, under {RELEASE_SHARE:.0%} of the cap: "
                                       f"{kept(ncpus, level - 1)} of {ncpus} CPUs")
    return CoreStep(level)
