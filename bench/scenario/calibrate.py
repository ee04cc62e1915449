"""``python -m bench.scenario calibrate``: this host's peak memory bandwidth, written
where noded reads its node peak (``<state_dir>/calibration.json``).

The stressor runs at full speed on every CPU with the triad kernel; the peak is the
median of its per-second rates after the first (the first holds page faults and
warm-up), divided over the host's L3 domains, as noded compares each domain with it.
"""

from __future__ import annotations

import datetime
import glob
import os
import statistics

from noded.calibration import Calibration, write_calibration

from .procs import ReportingProcess


def l3_domains(sysfs: str = "/sys/devices/system/cpu") -> int:
    """Distinct L3 caches (by their CPU lists); 1 where sysfs does not say."""
    lists = set()
    for path in glob.glob(f"{sysfs}/cpu[0-9]*/cache/index*/level"):
        with open(path) as f:
            if f.read().strip() != "3":
                continue
        with open(os.path.join(os.path.dirname(path), "shared_cpu_list")) as f:
            lists.add(f.read().strip())
    return max(1, len(lists))


def measure_peak_gbps(seconds: float, size_mib: int, progress=None) -> float:
    """Median per-second rate of the triad at full speed on all CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    stressor = ReportingProcess("bench.stress", ["--threads", str(len(cpus)), "--cpus", ",".join(map(str, cpus)),
                                                 "--size", str(size_mib), "--duration", str(seconds)])
    seen = 0
    while stressor.wait_reports(seen + 1, timeout=seconds + 60):
        seen += 1
        if progress:
            progress(seen, int(seconds))
    stressor.stop()
    rates = [r["achieved_gbps"] for r in stressor.reports[1:]]
    if not rates:
        raise RuntimeError(f"the stressor gave no rates: {stressor.failure()}")
    return statistics.median(rates)


def calibrate(state_dir: str, command: str, seconds: float = 10, size_mib: int = 512,
              progress=None) -> tuple[Calibration, str]:
    total = measure_peak_gbps(seconds, size_mib, progress)
    domains = l3_domains()
    cal = Calibration(round(total / domains, 2), domains,
                      datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), command)
    return cal, write_calibration(state_dir, cal)
