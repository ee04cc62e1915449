"""Memory Bandwidth Allocation as the hardware and the kernel apply it, rule by rule.

Each function is one rule, with where it comes from. The kernel model (``kernel.py``) uses
them for profiles whose ``mba_model`` is ``"request"``; the fidelity tests
(``tests/kernel/test_mba_fidelity.py``) check each against its source.

* **A limit on each core's requests, not on the group.** Intel MBA throttles a core's
  requests at the L2-to-L3 boundary (a delay per request) while MBM counts at L3, so "one
  percentage" is a per-core rate: "a 'single thread, with 10% b/w' and '4 thread, with 10%
  b/w' can consume up to 10GBps and 40GBps although they have same percentage b/w of 10%"
  (the kernel's resctrl documentation, "Memory bandwidth Allocation and monitoring").
  ``thread_limit`` is that per-thread rate; a group's bandwidth is the sum over its busy
  threads, each also held to its own demand, then all of a domain's traffic to the
  domain's peak (L3-external bandwidth is shared).
* **SMT siblings.** "Early Intel hardware implementations of MBA could only control
  bandwidth at the processor core level ... applying the higher throttling value (lower
  bandwidth) to both" (x86/resctrl: "Enable user to view thread or core throttling mode",
  commit 29b6bd41ee24): ``info/MB/thread_throttle_mode`` reads ``max`` there and
  ``per-thread`` on parts with a delay per hardware thread. ``core_setting``.
* **Quantisation and a non-linear scale.** The percentage is a request for a delay; parts
  apply a coarser set of delays than the values they accept, and the bandwidth a delay
  leaves is not proportional to it: on Skylake users saw 70 and 80 % behave as 90 %
  (intel-cmt-cat issues #69, #115: every pqos value from 65 to 94 applied as 90 %), and one
  core at 10 % still passing 4 of its 17.7 GB/s (#183). ``applied_percent`` and
  ``curve_share``, from the profile's ``mb_applied`` and ``mb_curve``.
* **AMD.** The MB value is an absolute limit in 1/8 GB/s units, range [0, 2048]
  (resctrl.rst, "Memory bandwidth Allocation specified in ... AMD"), and AMD's
  "bandwidth allocation is already at thread level" (the same patches): ``amd_thread_limit``.
* **mba_MBps.** The kernel's software controller (``update_mba_bw`` in
  ``fs/resctrl/monitor.c``) runs from the MBM overflow worker once a second per domain: it
  takes the bytes the control group (its MON groups included) moved in that second on the
  chosen event (``mbm_local_bytes`` unless ``mba_MBps_event`` says ``mbm_total_bytes``),
  in MiB, and moves the hardware percentage one ``bandwidth_gran`` step: down when the
  target is below what it measured (and the percentage above ``min_bandwidth``), up when
  the target is above what it measured scaled by (cur + min_bw) / cur (and the percentage
  below 100). ``kernel_mbps_step``. The schemata shows the target, never the percentage.
"""

from __future__ import annotations

from nodesim.resctrl_emulator.profiles import Profile

AMD_MB_UNIT_BYTES = 125_000_000  # 1/8 GB/s
MAX_MBA_BW = 100  # the kernel's MAX_MBA_BW: percent, unthrottled
MBPS_INTERVAL_S = 1.0  # MBM_OVERFLOW_INTERVAL: the worker that runs update_mba_bw


def applied_percent(profile: Profile, value: int) -> int:
    """The percentage the part applies for a schemata value (its delay table)."""
    return dict(profile.mb_applied).get(value, value)


def curve_share(profile: Profile, percent: float) -> float:
    """Share of one core's unthrottled bandwidth an applied percentage leaves."""
    points = profile.mb_curve
    if percent <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if percent <= x1:
            return y0 + (y1 - y0) * (percent - x0) / (x1 - x0)
    return points[-1][1]


def thread_limit(profile: Profile, percent: float) -> float:
    """Bytes/s one busy Intel thread may move at an applied percentage."""
    return profile.core_peak_bytes_per_s * curve_share(profile, percent)


def amd_thread_limit(value: int) -> float:
    """Bytes/s one AMD thread may move at a schemata value (1/8 GB/s units)."""
    return value * AMD_MB_UNIT_BYTES


def sibling_cpu(cpu: int) -> int:
    """The other hardware thread of a CPU's core, in the emulator's topology (CPUs 2k and 2k+1)."""
    return cpu ^ 1


def core_setting(mode: str | None, own: int, sibling: int | None) -> int:
    """The percentage a thread gets when its core's other thread (busy, at ``sibling``)
    asks for another: ``max`` throttling gives both the lower bandwidth."""
    if mode == "max" and sibling is not None:
        return min(own, sibling)
    return own


def kernel_mbps_step(current: int, target_mib: float, measured_mib: float, min_bw: int, gran: int) -> int:
    """One run of update_mba_bw: the next hardware percentage of a control group."""
    if current > min_bw and target_mib < measured_mib:
        return current - gran
    if current < MAX_MBA_BW and target_mib > measured_mib * (current + min_bw) / current:
        return current + gran
    return current
