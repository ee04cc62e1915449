"""Hardware profiles the resctrl emulator can pretend to be.

Each profile is the set of platform facts the kernel would discover from CPUID
and publish under ``info/``. Values are typical of real parts (see the
kernel's ``Documentation/filesystems/resctrl.rst``); where a real part varies, the choice is noted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MON_EVENTS = ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")


@dataclass(frozen=True)
class Profile:
    name: str
    vendor: str  # "intel" or "amd"
    domains: tuple[int, ...]  # L3 cache ids; may have gaps
    has_l3: bool  # L3 cache allocation (CAT)
    has_mb: bool  # memory bandwidth allocation (MBA)
    has_mon: bool  # L3 monitoring (MBM/CMT)
    cdp: bool = False  # mounted with -o cdp
    mba_mbps: bool = False  # mounted with -o mba_MBps
    num_closids_l3: int = 16
    num_closids_mb: int = 8
    num_rmids: int = 128
    cbm_len: int = 11  # bits in the L3 capacity bit mask
    min_cbm_bits: int = 1
    l3_bytes: int = 33 * 1024 * 1024  # per domain
    mb_min: int = 10
    mb_gran: int = 10
    mb_max: int = 100
    delay_linear: bool = True
    thread_throttle_mode: str | None = "max"
    mon_scale: int = 40960  # bytes per hardware counter unit
    local_fraction: float = 0.9  # share of traffic to the local NUMA node
    peak_bytes_per_s: float = 20e9  # per domain, for the bandwidth model
    cpus_per_domain: int = 8
    # The online CPUs of each domain, in the order of ``domains``; None: ``cpus_per_domain``
    # consecutive CPUs each (domain i has CPUs i*n .. i*n+n-1). Set from the host's topology.
    domain_cpus: tuple[tuple[int, ...], ...] | None = None
    # info/L3/sparse_masks: the CBM may have gaps (AMD always; Intel where CPUID says so).
    sparse_masks: bool = False
    legacy_format: bool = False  # pre-2025 kernels pad schemata values
    # How the MB value limits traffic (see nodesim.resctrl_emulator.mba for each rule and its source):
    # "group": the whole group is capped at value/100 x the domain's peak (MBps: the target
    # applied exactly), an idealised model the simulated node and older tests are written
    # against; "request": the hardware's own rule, a limit on each busy thread's requests.
    mba_model: str = "group"
    # One thread's unthrottled bandwidth (the L2-external limit), for the "request" model.
    core_peak_bytes_per_s: float = 17.7e9
    # Intel: the schemata percentage -> the delay the part really applies, as a percentage;
    # values not listed apply as written.
    mb_applied: tuple[tuple[int, int], ...] = ()
    # Intel: (applied percentage, share of one core's unthrottled bandwidth) points, linear
    # between them; the default is the documented linear scale.
    mb_curve: tuple[tuple[float, float], ...] = ((0.0, 0.0), (100.0, 1.0))

    @property
    def mon_features(self) -> tuple[str, ...]:
        return MON_EVENTS if self.has_mon else ()

    @property
    def cpus_of_domains(self) -> dict[int, frozenset[int]]:
        """L3 domain id -> its online CPUs."""
        if self.domain_cpus is not None:
            return {d: frozenset(c) for d, c in zip(self.domains, self.domain_cpus)}
        n = self.cpus_per_domain
        return {d: frozenset(range(i * n, i * n + n)) for i, d in enumerate(self.domains)}

    @property
    def online_cpus(self) -> frozenset[int]:
        return frozenset().union(*self.cpus_of_domains.values())

    def on_topology(self, domains: dict[int, frozenset[int]], l3_bytes: int | None = None) -> "Profile":
        """This profile's features on another machine's L3 domains (id -> CPUs)."""
        changes: dict = {"domains": tuple(domains), "domain_cpus": tuple(tuple(sorted(c)) for c in domains.values())}
        if l3_bytes is not None:
            changes["l3_bytes"] = l3_bytes
        return self.replace(**changes)

    @property
    def alloc_capable(self) -> bool:
        return self.has_l3 or self.has_mb

    @property
    def ctrl_closids(self) -> int:
        """CLOSIDs usable by CTRL_MON groups, root included (min over resources)."""
        counts = []
        if self.has_l3:
            counts.append(self.num_closids_l3)
        if self.has_mb:
            counts.append(self.num_closids_mb)
        return min(counts) if counts else 1

    @property
    def mb_default(self) -> int:
        # The kernel initialises a new group to "unthrottled": 100 %, 2048 units,
        # or, in MBps mode, the largest u32.
        return 0xFFFFFFFF if self.mba_mbps else self.mb_max

    def replace(self, **changes) -> "Profile":
        return dataclasses.replace(self, **changes)


PROFILES: dict[str, Profile] = {
    "intel": Profile("intel", "intel", (0, 1), has_l3=True, has_mb=True, has_mon=True),
    # mba_MBps as the kernel runs it: its software controller moves the percentage one
    # step a second toward the MiB/s target (nodesim.resctrl_emulator.mba.kernel_mbps_step), over
    # the per-thread request limit of a linear part.
    "intel-mbps": Profile(
        "intel-mbps", "intel", (0, 1), has_l3=True, has_mb=True, has_mon=True, mba_mbps=True,
        mba_model="request",
    ),
    # The realistic Intel parts (nodesim.resctrl_emulator.mba): a limit on each core's requests,
    # so a group's bandwidth follows its busy threads.
    # A linear part whose SMT siblings share the lower setting (thread_throttle_mode max).
    "intel-linear": Profile(
        "intel-linear", "intel", (0, 1), has_l3=True, has_mb=True, has_mon=True, mba_model="request",
    ),
    # Skylake-SP as users measured it: 70 and 80 % apply as 90 % (pqos, which rounds to the
    # nearest step, turned every value from 65 to 94 into 90: intel-cmt-cat #69, #115), and
    # the scale is far from linear at the bottom: one core at 10 % still passes 4 of its
    # 17.7 GB/s (#183). delay_linear still reads 1, as it did on those parts.
    "intel-quantised": Profile(
        "intel-quantised", "intel", (0, 1), has_l3=True, has_mb=True, has_mon=True, mba_model="request",
        mb_applied=((70, 90), (80, 90)),
        mb_curve=((0.0, 0.0), (10.0, 4.0 / 17.7), (20.0, 0.30), (30.0, 0.38), (40.0, 0.47), (50.0, 0.56),
                  (60.0, 0.66), (90.0, 0.92), (100.0, 1.0)),
    ),
    # A newer part with per-thread MBA (Ice Lake-SP on): each hardware thread its own delay.
    "intel-per-thread": Profile(
        "intel-per-thread", "intel", (0, 1), has_l3=True, has_mb=True, has_mon=True, mba_model="request",
        thread_throttle_mode="per-thread",
    ),
    # CDP halves the CLOSIDs (the info files already show the halved number) and
    # the L3 ids have a gap, as on a two-socket host with socket 1 offline.
    "intel-cdp": Profile(
        "intel-cdp", "intel", (0, 2), has_l3=True, has_mb=True, has_mon=True, cdp=True,
        num_closids_l3=8, num_closids_mb=8,
    ),
    # AMD: one L3 domain per CCX, MBA in absolute units of 1/8 GB/s applied to each thread
    # (AMD's allocation "is already at thread level", per the thread_throttle_mode patches), counters in
    # 64-byte units, no thread_throttle_mode, non-linear delay, sparse cache bit masks
    # (the kernel sets arch_has_sparse_bitmasks on every AMD part).
    "amd": Profile(
        "amd", "amd", (0, 1, 2, 3), has_l3=True, has_mb=True, has_mon=True,
        num_closids_l3=16, num_closids_mb=16, cbm_len=16, min_cbm_bits=0, l3_bytes=32 * 1024 * 1024,
        mb_min=0, mb_gran=1, mb_max=2048, delay_linear=False, thread_throttle_mode=None,
        mon_scale=64, cpus_per_domain=8, sparse_masks=True, mba_model="request",
    ),
    # A part with few CLOSIDs (as with CDP on a part of 8, or where other tools hold most):
    # the root and two groups, so a third capped job finds none of its own ("Out of CLOSIDs").
    "intel-few-closids": Profile(
        "intel-few-closids", "intel", (0, 1), has_l3=True, has_mb=True, has_mon=True, mba_model="request",
        num_closids_l3=3, num_closids_mb=3,
    ),
    # Monitoring only (e.g. a part with MBM but no allocation features): CTRL_MON
    # groups cannot be made; MON groups live under the root's mon_groups/.
    "no-mba": Profile("no-mba", "intel", (0, 1), has_l3=False, has_mb=False, has_mon=True),
}
